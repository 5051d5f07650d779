"""Wake-ups across processes on one SQLite file: ``PRAGMA data_version`` read every
few milliseconds on a connection of its own (:class:`CommitWatch`).

A ``relaybox serve`` receiver in one process and a worker in another, or a script
that publishes while ``relaybox dispatch`` runs, share the file but no event loop:
without this the reader finds the other process's rows at its next poll (1 s).

Why ``data_version`` and not a signal beside the database (a Unix datagram socket
per listener, or a FIFO): SQLite changes a connection's ``data_version`` whenever
*another* connection commits to the file, so the watch sees every writer (relaybox's
own processes, a migration, an operator's shell, a script with its own ``Relaybox``)
with no cooperation from them, nothing to send after each COMMIT, no socket files to
clean up after a crash, and no 108-byte limit on a socket's path. It also cannot fire
before the rows are visible, which a signal sent by the writer could. The price is a
poll: one short read transaction (the WAL index in shared memory, no disk read),
~5 µs of CPU, every :data:`WATCH_INTERVAL`, on the listening process's event loop
(``python -m bench latency`` prints an idle dispatcher's CPU). Commits of the
listening process's own connection wake it too (the watch cannot tell them apart):
at most one extra, empty claim or lease per interval while it writes.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import Callable
from pathlib import Path

__all__ = ["WATCH_INTERVAL", "CommitWatch"]

WATCH_INTERVAL = 0.015
"""Seconds between two reads of ``data_version``: a commit by another process wakes
the listeners within this (plus the event loop's own delay). 15 ms keeps a publish
from another process well inside 100 ms of its delivery; an idle process spends
about 1-2 % of a core on it on a loaded 2-core VM (the wake-up of the event loop
costs more than the read)."""

_RETRY_OPEN = 1.0
"""Seconds between attempts to open the watch's connection (the file does not exist
yet, or cannot be read): the listeners' polling covers the gap."""


class CommitWatch:
    """Calls ``on_change`` when the file at ``path`` changed since the last look."""

    def __init__(
        self, path: Path, on_change: Callable[[], None], *, interval: float = WATCH_INTERVAL
    ) -> None:
        self.path = path
        self.on_change = on_change
        self.interval = interval

    def _open(self) -> sqlite3.Connection:
        # mode=rw: never create the file (the store does, with its own settings);
        # timeout=0: a read that would wait for a lock fails at once instead of
        # blocking the event loop (see _version).
        return sqlite3.connect(
            f"{self.path.resolve().as_uri()}?mode=rw", uri=True, timeout=0, isolation_level=None
        )

    @staticmethod
    def _version(conn: sqlite3.Connection) -> int | None:
        """The connection's ``data_version``; ``None`` when the read was refused (a
        lock held while a writer recovers or resets the WAL: treated as a change).
        ``fetchall`` steps the statement to its end, so no read transaction stays
        open between looks (it would hold back checkpoints)."""
        try:
            rows = conn.execute("PRAGMA data_version").fetchall()
        except sqlite3.OperationalError:
            return None
        return int(rows[0][0])

    async def run(self) -> None:
        """Watch until cancelled."""
        while True:
            try:
                conn = self._open()
            except sqlite3.Error:
                await asyncio.sleep(_RETRY_OPEN)
                continue
            try:
                last = self._version(conn)
                while True:
                    await asyncio.sleep(self.interval)
                    now = self._version(conn)
                    if now != last or now is None:
                        last = now
                        self.on_change()
            finally:
                with contextlib.suppress(sqlite3.Error):
                    conn.close()
