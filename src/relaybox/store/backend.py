"""The seam between the store's areas and a database: :class:`Backend`.

Each area of the store (:class:`~relaybox.store.inbox.InboxStore`,
:class:`~relaybox.store.outbox.OutboxStore`, …) holds one backend and runs its
statements through it alone: the named SQL blocks (:attr:`Backend.q`), transactions,
:meth:`Backend.rows` and :meth:`Backend.first`, and how a parameter of a kind the
drivers differ on travels (:meth:`Backend.array`, :meth:`Backend.flag`). The SQLite
and PostgreSQL backends (:mod:`relaybox.store.sqlite`, :mod:`relaybox.store.postgres`)
subclass it with their engines, pools, wake-ups and locks.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import textwrap
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from importlib import resources
from typing import TYPE_CHECKING, Any, ClassVar

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from relaybox.store.inbox_rows import Listener

if TYPE_CHECKING:
    from relaybox.store.operator import DatabaseHealth

__all__ = ["Backend", "load_migrations", "load_queries"]


_BLOCK = re.compile(r"^-- (name|part): (\w+)\s*$", re.MULTILINE)
_INCLUDE = re.compile(r"^([ \t]*)-- include: (\w+)[ \t]*$", re.MULTILINE)


def load_queries(backend: str) -> dict[str, str]:
    """Named SQL blocks of ``sql/<backend>.sql`` and ``sql/<backend>_<area>.sql``
    (one file per area: core, outbound, ordering, operations), comment lines dropped.

    A block ``-- part: x`` is no statement: it is SQL that several statements share,
    written once; a line ``-- include: x`` of a statement (or of another part) stands
    for its text, indented as that line is. What both backends run as written, with no
    parameters (their styles differ: ``$n``, ``?n``), is in ``sql/shared_<area>.sql``,
    read for either. A name defined twice, a part nothing includes and an include line
    that names no part are errors."""
    folder = resources.files("relaybox.store").joinpath("sql")
    return _named_blocks(
        (entry.name, entry.read_text())
        for entry in sorted(folder.iterdir(), key=lambda e: e.name)
        if re.fullmatch(rf"({backend}|shared)(_\w+)?\.sql", entry.name)
    )


def _named_blocks(files: Iterable[tuple[str, str]]) -> dict[str, str]:
    """The statements of ``files`` ((name, text) pairs), their parts included."""
    blocks: dict[str, dict[str, str]] = {"name": {}, "part": {}}
    for file, text in files:
        parts = _BLOCK.split(text)
        for kind, name, body in zip(parts[1::3], parts[2::3], parts[3::3], strict=True):
            if name in blocks[kind]:
                raise RuntimeError(f"{kind} {name!r} is defined twice ({file})")
            if re.search(r"^[ \t]*-- include:", _INCLUDE.sub("", body), re.MULTILINE):
                raise RuntimeError(f"{name!r}: an include line names one part alone ({file})")
            blocks[kind][name] = body
    unused = set(blocks["part"])

    def include(m: re.Match[str], within: tuple[str, ...] = ()) -> str:
        indent, name = m.groups()
        if name not in blocks["part"] or name in within:
            raise RuntimeError(f"no part {name!r} to include here (within {within})")
        unused.discard(name)
        part = _INCLUDE.sub(lambda n: include(n, (*within, name)), blocks["part"][name])
        return textwrap.indent(part.strip("\n"), indent)

    queries = {
        name: _uncommented(_INCLUDE.sub(include, body)) for name, body in blocks["name"].items()
    }
    if unused:
        raise RuntimeError(f"parts nothing includes: {sorted(unused)}")
    return queries


def _uncommented(sql: str) -> str:
    lines = [ln for ln in sql.splitlines() if not ln.lstrip().startswith("--")]
    return "\n".join(lines).strip()


def load_migrations(backend: str) -> list[tuple[int, str, list[str]]]:
    """(version, name, statements) for every migration file of ``backend``, in order."""
    folder = resources.files("relaybox.store").joinpath(f"migrations/{backend}")
    found = []
    for entry in folder.iterdir():
        m = re.fullmatch(r"(\d{4})_(\w+)\.sql", entry.name)
        if not m:
            continue
        body = "\n".join(
            ln for ln in entry.read_text().splitlines() if not ln.lstrip().startswith("--")
        )
        statements = [s.strip() for s in body.split(";") if s.strip()]
        found.append((int(m.group(1)), m.group(2), statements))
    return sorted(found)


class Backend:
    """One database as the store's areas use it. Subclasses set :attr:`backend` and
    build :attr:`engine`.

    Capabilities a backend declares, so that no caller compares backends:

    ``single_writer``: the database takes one write transaction at a time (SQLite).
    Concurrent transactions would only queue, so the worker runs one at a time, a
    claimed batch runs in one transaction (one COMMIT, one fsync, a savepoint per
    event), the claimed rows' hold needs no renewal (no other claimer passes a batch
    in its write transaction), and the acceptor uses one committer.

    ``groups``: the inbox runs a group of events in one transaction
    (:meth:`InboxStore.lock_group <relaybox.store.inbox.InboxStore.lock_group>`).

    ``starts_at_accept``: the accept honours :attr:`NewDelivery.held_until
    <relaybox.store.inbox_rows.NewDelivery.held_until>`.

    ``clock_from_database``: processes sharing this database may run on several hosts,
    so holds, leases and schedules take the database server's clock
    (:meth:`OperatorStore.db_time <relaybox.store.operator.OperatorStore.db_time>`,
    read by :class:`relaybox.clock.ClockGuard`); not on SQLite, which is one host.
    """

    backend: ClassVar[str]
    float_type: ClassVar[str] = "DOUBLE PRECISION"
    single_writer: ClassVar[bool] = False
    groups: ClassVar[bool] = False
    starts_at_accept: ClassVar[bool] = False
    clock_from_database: ClassVar[bool] = True
    engine: AsyncEngine

    def __init__(self, url: str) -> None:
        self.url = url
        self.q: Mapping[str, str] = load_queries(self.backend)

    async def close(self) -> None:
        await self.engine.dispose()

    # -- connections and transactions -----------------------------------------------------

    @asynccontextmanager
    async def connect(self) -> AsyncIterator[AsyncConnection]:
        """A connection with an open transaction, committed on success."""
        async with self.engine.connect() as conn, conn.begin():
            yield conn

    transaction = connect

    def connection(self) -> AbstractAsyncContextManager[AsyncConnection]:
        """A connection of the pool, no transaction begun (a worker chain holds one
        while its events run, one transaction after another)."""
        return self.engine.connect()

    def event_transaction(self, conn: AsyncConnection) -> AbstractAsyncContextManager[Any]:
        """One event's own transaction on ``conn``, committed on success; its first
        statement is :meth:`InboxStore.begin <relaybox.store.inbox.InboxStore.begin>`."""
        return conn.begin()

    # -- statements -----------------------------------------------------------------------

    async def rows(self, conn: AsyncConnection, name: str, params: Sequence[Any] = ()) -> list[Any]:
        """Run the named query in ``conn``'s transaction; rows support ``row[i]`` and
        ``row["column"]``. Backends may run it below SQLAlchemy (same transaction)."""
        result = await conn.exec_driver_sql(self.q[name], tuple(params))
        return list(result.all()) if result.returns_rows else []

    async def first(self, conn: AsyncConnection, name: str, params: Sequence[Any] = ()) -> Any:
        found = await self.rows(conn, name, params)
        return found[0] if found else None

    async def maps(
        self, conn: AsyncConnection, name: str, params: Sequence[Any] = ()
    ) -> list[dict[str, Any]]:
        """The named query's rows as dicts, through SQLAlchemy."""
        result = await conn.exec_driver_sql(self.q[name], tuple(params))
        return [dict(r._mapping) for r in result]

    # -- parameters and rows ----------------------------------------------------------------

    def array(self, values: Sequence[Any]) -> Any:
        """A list parameter (ids, texts, flags) as the driver takes it: a list here (a
        PostgreSQL array), JSON text on SQLite."""
        return list(values)

    def flag(self, value: bool) -> Any:
        """A boolean parameter as the backend compares it with a boolean expression."""
        return value

    def mapping(self, row: Any) -> Mapping[str, Any]:
        """A row of :meth:`rows` read by column name."""
        mapping: Mapping[str, Any] = row._mapping
        return mapping

    # -- wake-ups -----------------------------------------------------------------------

    async def notify(self, conn: AsyncConnection, channel: str) -> None:
        """Wake listeners of ``channel`` when the transaction commits (PostgreSQL)."""

    def wake(self, channel: str) -> None:
        """Wake listeners of ``channel`` about rows committed already. Callers that
        commit themselves (accept, the worker) use this rather than :meth:`notify`:
        on PostgreSQL a NOTIFY in a transaction serialises its COMMIT with every other
        notifying COMMIT (a database-wide lock held through the WAL flush)."""

    async def listen(self, channel: str, wake: asyncio.Event) -> Listener | None:
        """Set ``wake`` whenever rows for ``channel`` (``inbox``, ``outbox``) commit.
        Returns something to ``close()``, or ``None`` when listening is not possible:
        callers poll anyway, this only shortens their wait."""
        return None

    # -- what differs by backend ------------------------------------------------------------

    def maintenance_try_lock(self) -> AbstractAsyncContextManager[bool]:
        """Yield whether this process is the maintenance runner now; the lock is held
        until the block ends."""
        raise NotImplementedError

    def erasing(self, conn: AsyncConnection) -> AbstractAsyncContextManager[None]:
        """Around one erasure batch's statements: how the backend makes the bytes it
        frees unreadable (SQLite: ``secure_delete``); nothing by default."""
        return contextlib.nullcontext()

    async def checkpoint(self) -> None:
        """Move what was changed out of the backend's logs where it can (SQLite: a
        checkpoint that truncates the WAL); nothing by default (PostgreSQL keeps old
        row versions until VACUUM: docs/operating.md)."""

    async def copy_event_keys(self, conn: AsyncConnection, page: Sequence[Any]) -> None:
        """Insert the keys of inbox rows read as (id, source, account, event_id,
        fingerprint, received_at) in ``conn``'s transaction (each backend's way)."""
        raise NotImplementedError

    async def copy_message_keys(self, conn: AsyncConnection, page: Sequence[Any]) -> None:
        """Insert the idempotency keys of messages read as (id, tenant, idempotency key,
        created_at) in ``conn``'s transaction (each backend's way)."""
        raise NotImplementedError

    async def copy_operation_keys(self, conn: AsyncConnection, page: Sequence[Any]) -> None:
        """Insert the business keys of operations read as (business key, fingerprint,
        source, created_at) in ``conn``'s transaction (each backend's way)."""
        raise NotImplementedError

    async def health(self) -> DatabaseHealth:
        """:meth:`OperatorStore.database_health
        <relaybox.store.operator.OperatorStore.database_health>`."""
        raise NotImplementedError

    async def lock_migrations(self, conn: AsyncConnection) -> None:
        """Serialise concurrent migrators (PostgreSQL: advisory lock)."""

    def insert_migration_sql(self) -> str:
        raise NotImplementedError
