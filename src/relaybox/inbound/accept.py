"""Accepting deliveries into the inbox, with group commit.

A request hands its row and a future to a queue and waits. Committer tasks take
everything queued, insert it in one transaction and COMMIT once, then answer every
future of that batch. With no commit in flight a request gets a commit of its own at
once; beside a commit in flight a second one starts only for ``parallel_at`` queued
rows (or when the one in flight is slow), so that at moderate load the rows that
arrive during a flush share the next one instead of each paying its own. No answer is
given before the COMMIT that holds its row. A batch the database refuses because of a
row's values (:meth:`InboxStore.row_error`) is committed again in halves, down to that row,
so that only it fails; any other error fails the whole batch (the receiver answers 503
and the sender retries: a row that did commit is then found as a duplicate).

In a process that also runs the worker (PostgreSQL), the worker takes the new rows it
has room for straight from the batch (:class:`Handoff`): they go in started and held
for it, and it runs them once the COMMIT returns, without a claim's round trip.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Sequence
from typing import Protocol

import structlog

from relaybox.errors import TABLES_MISSING, StoreUnavailable, tables_missing
from relaybox.inbound.probes import AcceptHooks
from relaybox.log import short_error
from relaybox.store import AcceptOutcome, NewDelivery, Store

__all__ = ["Acceptor", "Handoff"]

_Item = tuple[NewDelivery, "asyncio.Future[AcceptOutcome]", float]
"""A queued delivery, the future its request awaits, and when it was queued."""

log = structlog.get_logger("relaybox.inbox")


class Handoff(Protocol):
    """This process's worker, taking rows from the accept (``worker.handoff``)."""

    def offer(self, batch: Sequence[NewDelivery]) -> int:
        """Before the batch's insert: set :attr:`NewDelivery.held_until` on the
        deliveries the worker has room for; how many."""
        ...

    def settle(
        self, batch: Sequence[NewDelivery], outcomes: Sequence[AcceptOutcome] | None
    ) -> None:
        """After it: run the held deliveries that were inserted (``accepted``), and
        free the room of the others; ``outcomes`` is ``None`` when the insert failed."""
        ...


class Acceptor:
    def __init__(
        self,
        store: Store,
        *,
        committers: int | None = None,
        max_batch: int = 256,
        timeout: float = 10.0,
        parallel_at: int = 32,
        patience: float = 0.025,
        hooks: AcceptHooks | None = None,
    ) -> None:
        self.store = store
        self.hooks = hooks or AcceptHooks()
        # One writer (SQLite): a second committer would only queue behind the first.
        # PostgreSQL: one commit in flight leaves the server idle during each fsync; 2
        # and 3 measured within noise of each other here, 4 lower (bench/README.md).
        # ``accept_committers`` in the settings overrides it.
        self.committers = committers or (1 if store.db.single_writer else 3)
        self.max_batch = max_batch
        self.timeout = timeout
        # Beside a commit in flight, the next starts only once ``parallel_at`` rows are
        # queued, or once the one in flight has taken ``patience`` seconds (a commit
        # stuck on one connection must not hold the others back). Without the gate, at
        # 80 % of the peak each commit held ~2 rows (PostgreSQL: 1,757 commits and 999
        # WAL flushes a second for 3,613 rows); bench/README.md has the figures.
        self.parallel_at = parallel_at
        self.patience = patience
        self.handoff: Handoff | None = None
        self._said_tables_missing = False
        self._items: deque[_Item] | None = None  # queued, oldest first
        self._wakeup = asyncio.Event()
        # Batches whose commit is awaited, and when each was sent, oldest first.
        self._inflight: list[tuple[float, list[_Item]]] = []
        # The loop the queue and committers live in, remembered: on Python 3.11
        # asyncio.get_running_loop() makes a getpid() system call, ~3 % of a request's
        # CPU here (py-spy --native under wrk).
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: list[asyncio.Task[None]] = []

    def _start(self) -> deque[_Item]:
        if self._items is None:
            self._loop = asyncio.get_running_loop()
            self._items = deque()
            self._wakeup = asyncio.Event()
            self._tasks = [
                asyncio.create_task(self._commit_loop(self._items), name=f"relaybox-accept-{i}")
                for i in range(self.committers)
            ]
            self._tasks.append(
                asyncio.create_task(self._watch(self._items), name="relaybox-accept-watch")
            )
        return self._items

    async def accept(self, delivery: NewDelivery) -> AcceptOutcome:
        """Return once the row (or its duplicate/quarantine record) is committed.

        Raises :class:`StoreUnavailable` when the batch failed or its commit did not
        answer within ``timeout`` (checked every quarter of it: the outcome is then
        uncertain, not acknowledged).
        """
        items = self._start()
        loop = self._loop
        assert loop is not None
        fut: asyncio.Future[AcceptOutcome] = loop.create_future()
        items.append((delivery, fut, loop.time()))
        if len(items) == 1 or len(items) >= self.parallel_at:
            self._wakeup.set()  # a committer waits for the first row, or for enough
        return await fut

    async def _commit_loop(self, items: deque[_Item]) -> None:
        loop = self._loop
        assert loop is not None
        while True:
            while not items:
                self._wakeup.clear()
                await self._wakeup.wait()
            if self._inflight and len(items) < self.parallel_at:
                deadline = self._inflight[0][0] + self.patience
                if deadline > loop.time():
                    # Woken when the queue reaches ``parallel_at``, when a commit ends
                    # with rows queued, or at the deadline: then look again.
                    self._wakeup.clear()
                    timer = loop.call_at(deadline, self._wakeup.set)
                    try:
                        await self._wakeup.wait()
                    finally:
                        timer.cancel()
                    continue
            batch = [items.popleft() for _ in range(min(len(items), self.max_batch))]
            batch = [item for item in batch if not item[1].done()]  # expired while queued
            if not batch:
                continue
            entry = (loop.time(), batch)
            self._inflight.append(entry)
            try:
                outcomes = await self._insert([d for d, _, _ in batch])
            except asyncio.CancelledError:
                for _, fut, _ in batch:
                    if not fut.done():
                        fut.set_exception(StoreUnavailable("relaybox is shutting down"))
                raise
            except Exception as exc:
                if len(batch) > 1 and self.store.inbox.row_error(exc):
                    log.warning("accept_batch_split", size=len(batch), error=short_error(exc))
                    await self._commit_apart(batch)
                    continue
                if tables_missing(exc):
                    # Every request until someone migrates: one line, not one per batch.
                    message = TABLES_MISSING
                    if not self._said_tables_missing:
                        self._said_tables_missing = True
                        log.error("relaybox_tables_missing", hint=TABLES_MISSING)
                else:
                    message = "the database is unavailable"
                    log.warning("accept_batch_failed", size=len(batch), error=short_error(exc))
                _fail(batch, message)
                continue
            finally:
                self._inflight.remove(entry)
                if items:
                    self._wakeup.set()  # rows that waited for this commit
            await self._answer(batch, outcomes)

    async def _insert(self, batch: list[NewDelivery]) -> list[AcceptOutcome]:
        """One batch's insert and COMMIT, the worker taking what it has room for
        (:class:`Handoff`); a part of a refused batch is offered again."""
        handoff = self.handoff
        if handoff is None or not handoff.offer(batch):
            return await self.store.inbox.accept(batch)
        try:
            outcomes = await self.store.inbox.accept(batch)
        except BaseException:
            handoff.settle(batch, None)
            for d in batch:  # not taken: a part committed again is offered afresh
                d.held_until = None
            raise
        handoff.settle(batch, outcomes)
        return outcomes

    async def _commit_apart(self, batch: list[_Item]) -> None:
        """Commit the rows of a batch refused for a row's values in halves, halving
        again each part that is refused the same way: a single refused row fails
        alone (503: it is logged with its key), every other row is committed and
        answered as usual, at the cost of ~2·log2(size) commits per refused row. Any
        other error fails the rows not yet answered."""
        parts = [batch[len(batch) // 2 :], batch[: len(batch) // 2]]
        while parts:
            part = [item for item in parts.pop() if not item[1].done()]
            if not part:
                continue
            try:
                outcomes = await self._insert([d for d, _, _ in part])
            except asyncio.CancelledError:
                _fail(part, "relaybox is shutting down")
                for rest in parts:
                    _fail(rest, "relaybox is shutting down")
                raise
            except Exception as exc:
                if not self.store.inbox.row_error(exc):
                    log.warning("accept_batch_failed", size=len(part), error=short_error(exc))
                    _fail(part, "the database is unavailable")
                    for rest in parts:
                        _fail(rest, "the database is unavailable")
                    return
                if len(part) > 1:
                    parts += [part[len(part) // 2 :], part[: len(part) // 2]]
                    continue
                # ascii(): the refused values may not even be printable text.
                log.error("accept_row_refused", key=ascii(part[0][0].key), error=short_error(exc))
                _fail(part, "the database refused this delivery")
                continue
            await self._answer(part, outcomes)

    async def _answer(self, batch: list[_Item], outcomes: list[AcceptOutcome]) -> None:
        """Answer the requests of a committed batch, after the ``after_commit`` hooks
        (tests only: a hook that raises answers them as a lost COMMIT answer would)."""
        if self.hooks.after_commit:
            accepted = [(d, o) for (d, _, _), o in zip(batch, outcomes, strict=True)]
            try:
                await self.hooks.committed(accepted)
            except asyncio.CancelledError:
                _fail(batch, "relaybox is shutting down")
                raise
            except StoreUnavailable as exc:
                log.warning("accept_commit_uncertain", size=len(batch), error=short_error(exc))
                _fail(batch, str(exc))
                return
        for (_, fut, _), outcome in zip(batch, outcomes, strict=True):
            if not fut.done():
                fut.set_result(outcome)

    async def _watch(self, items: deque[_Item]) -> None:
        """Every quarter of ``timeout``: answer the requests waiting longer than it, in
        the queue or in a batch whose commit has not answered (the commit goes on: a
        row it holds is found as a duplicate when the sender retries). One timer for
        all of them: a timer per request cost ~3 % of the accept's CPU."""
        while True:
            await asyncio.sleep(self.timeout / 4)
            assert self._loop is not None
            cutoff = self._loop.time() - self.timeout
            for _, fut, queued in items:
                if queued > cutoff:
                    break
                _expire(fut)
            for _, batch in self._inflight:
                for _, fut, queued in batch:
                    if queued <= cutoff:
                        _expire(fut)

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._items:
            for _, fut, _ in self._items:
                if not fut.done():
                    fut.set_exception(StoreUnavailable("relaybox is shutting down"))
        self._tasks = []
        self._items = None


def _fail(items: list[_Item], message: str) -> None:
    for _, fut, _ in items:
        if not fut.done():
            fut.set_exception(StoreUnavailable(message))


def _expire(fut: asyncio.Future[AcceptOutcome]) -> None:
    if not fut.done():
        fut.set_exception(StoreUnavailable("the database did not confirm the commit in time"))
