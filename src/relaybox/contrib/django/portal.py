"""The event loop of relaybox's asynchronous parts inside a Django process.

The accept path (group commit on relaybox's own connections) and the operator use
cases are coroutines whose connections belong to one event loop. A Django process
serves requests from threads (WSGI) or from its own loop (ASGI), so they run in one
loop of relaybox's, in a daemon thread started on first use (after a pre-forking
server's fork: a child starts its own)."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from relaybox.app import Relaybox

__all__ = ["close_box", "run", "run_async"]

T = TypeVar("T")

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_pid = 0


def _portal() -> asyncio.AbstractEventLoop:
    global _loop, _pid
    with _lock:
        if _loop is None or _pid != os.getpid() or _loop.is_closed():
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=loop.run_forever, name="relaybox-django", daemon=True)
            thread.start()
            _loop, _pid = loop, os.getpid()
        return _loop


def run(coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
    """Run ``coro`` in relaybox's loop and wait for its result (from a thread)."""
    return asyncio.run_coroutine_threadsafe(coro, _portal()).result(timeout)


async def run_async(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` in relaybox's loop and await its result (from another loop)."""
    return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, _portal()))


def close_box(box: Relaybox) -> None:
    """Close ``box``'s connections in the loop that opened them, and forget its store:
    also when no coroutine has run yet (synchronous code such as ``publish`` made a
    store, whose engine points at the database the box used until now). In a child
    forked from a process that used the loop, the connections are the parent's: left
    alone."""
    if _loop is not None and _pid != os.getpid():
        return
    run(box.close(), timeout=60)
