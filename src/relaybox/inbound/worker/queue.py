"""Claimed events waiting for a chain (PostgreSQL): each the store's
:class:`~relaybox.store.InboxEvent` as claimed, in a :class:`_Job` that says where it
stands (its claim's :class:`_Batch`, its attempt once counted, whether it runs alone);
the :class:`ReadyQueue` the chains take them from; :class:`StartMarks`, the statement
that counts the attempts of events starting together."""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

from relaybox.store import InboxEvent

if TYPE_CHECKING:
    from relaybox.clock import Clock
    from relaybox.inbound.worker.context import Context
    from relaybox.inbound.worker.outcomes import _Outcome
    from relaybox.store import Store

__all__ = ["ReadyQueue", "StartMarks"]


class _Batch:
    """One claim's events, run by whichever chains take them: ``run_once`` returns
    when all of them have finished, raising the first failure."""

    __slots__ = ("done", "failures", "left")

    def __init__(self, n: int) -> None:
        self.left = n
        self.failures: list[BaseException] = []
        self.done = asyncio.get_running_loop().create_future()
        if n == 0:
            self.done.set_result(None)

    def finish(self, failure: BaseException | None = None) -> None:
        if failure is not None:
            self.failures.append(failure)
        self.left -= 1
        if self.left == 0 and not self.done.done():
            self.done.set_result(None)

    async def wait(self) -> None:
        await self.done
        if self.failures:
            raise self.failures[0]


@dataclass(slots=True)
class _Job:
    """A claimed event on its way through the chains: the store's row itself
    (``event``, not a copy) and where it stands."""

    event: InboxEvent  # as claimed
    batch: _Batch
    attempt: int | None = None  # set once the attempt is counted (started)
    alone: bool = False  # its group rolled back: it runs in a transaction of its own
    # Its handler failed in a group that then rolled back: the outcome to record (the
    # handler does not run again for this attempt).
    failed: tuple[Context, _Outcome] | None = None
    # Its group's BEGIN could not claim every declared business key (one existed, or
    # two events named one): its next group asks with a round trip per ctx.once().
    plain: bool = False


class ReadyQueue:
    """Claimed events waiting for a chain, oldest first. While a suspect waits to run
    alone (:attr:`isolating`), chains take nothing."""

    def __init__(self) -> None:
        self.jobs: deque[_Job] = deque()
        self.isolating = 0
        """Suspects waiting to run alone."""

    def __len__(self) -> int:
        return len(self.jobs)

    def append(self, job: _Job) -> None:
        self.jobs.append(job)

    def take(self) -> _Job | None:
        """The next claimed event, unless a suspect is waiting to run alone."""
        if self.isolating or not self.jobs:
            return None
        return self.jobs.popleft()

    def take_group(self, most: int) -> list[_Job]:
        """Up to ``most`` claimed events for a group, stopping at one that runs alone."""
        taken: list[_Job] = []
        while len(taken) < most:
            job = self.take()
            if job is None:
                break
            if job.alone:
                self.jobs.appendleft(job)
                break
            taken.append(job)
        return taken

    def put_back(self, jobs: list[_Job]) -> None:
        """Return ``jobs`` to the front of the queue, in order."""
        for job in reversed(jobs):
            self.jobs.appendleft(job)


class StartMarks:
    """Start marks of events that start together, in one statement: whoever asks
    while a mark is in flight goes in the next one (group commit)."""

    def __init__(self, store: Store, clock: Clock) -> None:
        self.store = store
        self.clock = clock
        self._waiting: list[tuple[int, asyncio.Future[int | None]]] = []
        self._flusher: asyncio.Task[None] | None = None

    async def start(self, inbox_id: int) -> int | None:
        """Count an attempt on ``inbox_id``; its attempt number, or ``None`` when the
        row is no longer pending."""
        future: asyncio.Future[int | None] = asyncio.get_running_loop().create_future()
        self._waiting.append((inbox_id, future))
        if self._flusher is None:
            self._flusher = asyncio.create_task(self._flush())
        return await future

    async def _flush(self) -> None:
        try:
            while self._waiting:
                batch, self._waiting = self._waiting, []
                try:
                    started = await self.store.inbox_start([i for i, _ in batch], self.clock.now())
                except Exception as exc:
                    for _, future in batch:
                        if not future.done():
                            future.set_exception(exc)
                    continue
                for inbox_id, future in batch:
                    if not future.done():
                        future.set_result(started.get(inbox_id))
        finally:
            self._flusher = None
