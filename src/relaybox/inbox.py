"""Accepting deliveries into the inbox, with group commit.

A request hands its row and a future to a queue and waits. Committer tasks take
everything queued, insert it in one transaction and COMMIT once, then answer every
future of that batch. At low load a request gets a commit of its own at once; at
high load many requests share one fsync. No answer is given before the COMMIT that
holds its row; any error fails the whole batch (the receiver answers 503 and the
sender retries: a row that did commit is then found as a duplicate).
"""

from __future__ import annotations

import asyncio
import contextlib

import structlog

from relaybox.errors import StoreUnavailable
from relaybox.log import short_error
from relaybox.store import AcceptOutcome, NewDelivery, Store

__all__ = ["Acceptor"]

log = structlog.get_logger("relaybox.inbox")


class Acceptor:
    def __init__(
        self,
        store: Store,
        *,
        committers: int | None = None,
        max_batch: int = 256,
        timeout: float = 10.0,
    ) -> None:
        self.store = store
        # SQLite has one writer: a second committer would only queue behind the first.
        # PostgreSQL: one commit in flight leaves the server idle during each fsync; 2
        # and 3 measured within noise of each other here, 4 lower (bench/README.md).
        # ``accept_committers`` in the settings overrides it.
        self.committers = committers or (1 if store.backend == "sqlite" else 3)
        self.max_batch = max_batch
        self.timeout = timeout
        self._queue: asyncio.Queue[tuple[NewDelivery, asyncio.Future[AcceptOutcome]]] | None = None
        # The loop the queue and committers live in, remembered: on Python 3.11
        # asyncio.get_running_loop() makes a getpid() system call, ~3 % of a request's
        # CPU here (py-spy --native under wrk).
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: list[asyncio.Task[None]] = []

    def _start(self) -> asyncio.Queue[tuple[NewDelivery, asyncio.Future[AcceptOutcome]]]:
        if self._queue is None:
            self._loop = asyncio.get_running_loop()
            self._queue = asyncio.Queue()
            self._tasks = [
                asyncio.create_task(self._commit_loop(self._queue), name=f"relaybox-accept-{i}")
                for i in range(self.committers)
            ]
        return self._queue

    async def accept(self, delivery: NewDelivery) -> AcceptOutcome:
        """Return once the row (or its duplicate/quarantine record) is committed.

        Raises :class:`StoreUnavailable` when the batch failed or its commit did not
        answer within ``timeout`` (the outcome is then uncertain: not acknowledged).
        """
        queue = self._start()
        loop = self._loop
        assert loop is not None
        fut: asyncio.Future[AcceptOutcome] = loop.create_future()
        queue.put_nowait((delivery, fut))
        # A timer, not wait_for(): wait_for wraps every request in a task, which costs
        # more than the whole accept at thousands of requests per second.
        timer = loop.call_later(self.timeout, _expire, fut)
        try:
            return await fut
        finally:
            timer.cancel()

    async def _commit_loop(
        self, queue: asyncio.Queue[tuple[NewDelivery, asyncio.Future[AcceptOutcome]]]
    ) -> None:
        while True:
            batch = [await queue.get()]
            while len(batch) < self.max_batch and not queue.empty():
                batch.append(queue.get_nowait())
            try:
                outcomes = await self.store.inbox_accept([d for d, _ in batch])
            except asyncio.CancelledError:
                for _, fut in batch:
                    if not fut.done():
                        fut.set_exception(StoreUnavailable("relaybox is shutting down"))
                raise
            except Exception as exc:
                log.warning("accept_batch_failed", size=len(batch), error=short_error(exc))
                for _, fut in batch:
                    if not fut.done():
                        fut.set_exception(StoreUnavailable("the database is unavailable"))
                continue
            for (_, fut), outcome in zip(batch, outcomes, strict=True):
                if not fut.done():
                    fut.set_result(outcome)

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        self._queue = None


def _expire(fut: asyncio.Future[AcceptOutcome]) -> None:
    if not fut.done():
        fut.set_exception(StoreUnavailable("the database did not confirm the commit in time"))
