"""The store's side of the keys kept apart from the history (:mod:`relaybox.store.keys`):
the resumable backfill of the keys of rows stored before them, and their expiry."""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence
from typing import Any

from relaybox.store import keys, keys_index
from relaybox.store.backend import Backend
from relaybox.store.keys import BackfillProgress, KeyKind

__all__ = ["KeysStore"]

BACKFILL_KINDS = ("event", "message", "operation", "outbox")


class KeysStore:
    """Backfill and expiry of the keys tables (``store.keys``)."""

    def __init__(self, db: Backend) -> None:
        self.db = db

    async def backfill(self, kind: str, *, limit: int = 1000) -> BackfillProgress:
        """Copy the keys of up to ``limit`` stored rows of ``kind`` (``event``: inbox
        rows; ``message``: messages; ``operation``: the readable business keys of
        ``relaybox_operations``, in key order; ``outbox``: outbox rows, PostgreSQL's
        keys of (channel, key), migration 0034) into their keys table, in one short
        transaction,
        resuming after the last row a previous call did (``relaybox_keys_backfill``
        records it). Keys that exist are left alone, so a batch run twice, or beside
        accepts that write the same keys, changes nothing. Returns where the backfill
        stands; ``finished`` once a batch read fewer than ``limit`` rows (rows stored
        since migrations 0027 and 0031 have their keys already). A finished backfill does
        nothing."""
        if kind not in BACKFILL_KINDS:
            raise ValueError(f"no backfill of {kind!r} keys: one of {', '.join(BACKFILL_KINDS)}")
        limit = max(1, int(limit))
        async with self.db.transaction() as conn:
            state = await self.db.first(conn, "keys_backfill_state", (kind,))
            if state is not None and state[3] is not None:
                return BackfillProgress(kind, int(state[2]), True, state[1])
            last = None if state is None else state[1]
            if kind == "event":
                page = await self.db.rows(
                    conn, "keys_backfill_events_page", (int(last or 0), limit)
                )
                if page:
                    await self.db.copy_event_keys(conn, page)
            elif kind == "operation":
                page = await self.db.rows(
                    conn, "keys_backfill_operations_page", (last or "", limit)
                )
                if page:
                    await self.db.copy_operation_keys(conn, page)
            elif kind == "outbox":
                page = await self.db.rows(
                    conn, "keys_backfill_outbox_page", (int(last or 0), limit)
                )
            else:
                page = await self.db.rows(conn, "keys_backfill_messages_page", (last or "", limit))
                keyed = [r for r in page if r[2] is not None]
                if keyed:
                    await self.db.copy_message_keys(conn, keyed)
            new_last = str(page[-1][0]) if page else last
            finished = len(page) < limit
            await self.db.rows(
                conn,
                "keys_backfill_save",
                (kind, new_last, len(page), time.time() if finished else None),
            )
            done = (0 if state is None else int(state[2])) + len(page)
        return BackfillProgress(kind, done, finished, new_last, len(page))

    async def backfill_status(self) -> list[BackfillProgress]:
        """Where the backfill of each kind stands (not started: 0 rows, unfinished)."""
        found = []
        async with self.db.transaction() as conn:
            for kind in BACKFILL_KINDS:
                row = await self.db.first(conn, "keys_backfill_state", (kind,))
                if row is None:
                    found.append(BackfillProgress(kind, 0, False))
                else:
                    found.append(BackfillProgress(kind, int(row[2]), row[3] is not None, row[1]))
        return found

    async def expire(
        self,
        kind: KeyKind,
        before_day: int,
        *,
        scope: str | None = None,
        limit: int = 1000,
        keep: Sequence[str] = (),
    ) -> int:
        """Forget the keys of ``kind`` first seen before day ``before_day`` (whole days
        since 1970-01-01 UTC, :func:`relaybox.store.keys.day_of`), only those of
        ``scope`` when given (``event`` and ``operation``: a source name; ``message``:
        a tenant), else of every scope but those named in ``keep``, ``limit`` keys a
        transaction until none is left. Returns how many
        were deleted. An expired key decides nothing any more: a delivery of that
        event again is accepted as new (where its inbox row still exists the inbox's
        own UNIQUE key, kept on SQLite, still recognises it), a publish with that
        idempotency key creates a new message, ``once()`` with that business key
        returns True again. Relaybox never calls it by itself: keys are kept forever
        unless a retention setting says otherwise.

        ``outbox``: the keys of the outbox's (channel, key) on PostgreSQL (migrations
        0034 and 0037; a delivery's by its message's day), which have no scope; an
        outbox row still stored keeps its own UNIQUE key until the sending side is
        partitioned. SQLite keeps no outbox keys apart (each lives with its row): none
        to forget.

        The expiry of every scope walks the index by day from the oldest key; that of
        one scope, or of all but ``keep``, goes day by day from the oldest day, so a
        batch reads the keys of one day, not every key older than the cutoff."""
        if kind not in keys.KEY_KINDS:
            raise ValueError(f"unknown kind of keys {kind!r}: one of {', '.join(keys.KEY_KINDS)}")
        limit = max(1, int(limit))
        cutoff = int(before_day)
        if kind == "outbox":
            if scope is not None or keep:
                raise ValueError("the outbox's keys have no scope")
            name = f"keys_expire_{kind}"
            if name not in self.db.q:  # SQLite: none apart from the rows
                return 0
            total = await self._batches(name, (cutoff, limit), limit)
            table = "delivery"  # PostgreSQL's delivery keys, by their message's day
            return total + await self._by_day(f"keys_expire_{table}", table, cutoff, (limit,))
        if scope is None and not keep:
            return await self._batches(f"keys_expire_{kind}", (cutoff, limit), limit)
        if scope is None:
            kept = self.db.array([keys.scope_of(k) for k in keep])
            return await self._by_day(f"keys_expire_{kind}_keep", kind, cutoff, (limit, kept))
        which = keys.scope_of(scope)
        return await self._by_day(f"keys_expire_{kind}_scope", kind, cutoff, (limit, which))

    async def day_indexes(self) -> dict[KeyKind, bool]:
        """Each kind of keys whose table exists (SQLite keeps no outbox keys apart):
        whether its table has its index by day, valid (:mod:`relaybox.store.keys_index`)."""
        return {k: bool(v) for k, v in (await keys_index.sqlite_state(self.db)).items()}

    async def keep_day_indexes(self, wanted: Collection[KeyKind]) -> dict[KeyKind, bool]:
        """Build the index by day of the tables of the kinds ``wanted`` (those a keys
        window applies to) where it is missing or invalid, drop the others'; then, as
        :meth:`day_indexes`, which have theirs. The expiry of a kind whose table has
        none must wait (a build failed, or another process is building it)."""
        state = await keys_index.sqlite_keep(self.db, wanted)
        return {k: bool(v) for k, v in state.items()}

    async def _by_day(self, name: str, kind: str, cutoff: int, params: tuple[Any, ...]) -> int:
        """Statement ``name`` (day, ``params``: the batch's limit first) for each day
        before ``cutoff`` that has keys, oldest first (``keys_oldest_<kind>`` finds the
        next one through the index by day)."""
        total = 0
        day = -(2**31)
        while True:
            async with self.db.transaction() as conn:
                row = await self.db.first(conn, f"keys_oldest_{kind}", (cutoff, day))
            if row is None or row[0] is None:
                return total
            day = int(row[0])
            total += await self._batches(name, (day, *params), params[0])
            day += 1

    async def _batches(self, name: str, params: tuple[Any, ...], limit: int) -> int:
        """Statement ``name``, one transaction a batch, until a batch deletes fewer than
        ``limit`` keys; how many it deleted."""
        total = 0
        while True:
            async with self.db.transaction() as conn:
                result = await conn.exec_driver_sql(self.db.q[name], params)
                deleted = max(0, result.rowcount or 0)
            total += deleted
            if deleted < limit:
                return total
