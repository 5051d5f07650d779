"""Processing the inbox: claim due rows, run handlers, commit effect and completion together.

1. **claim** (one autocommit statement): hold up to ``batch`` due rows back
   ``claim_hold`` seconds, returning their columns; the same statement dead-letters
   rows whose budget was used up by workers that died (``exhausted``). A claimed row
   waiting for its turn is not charged: it costs no attempt if the process dies. The
   rows that free chains start at once (PostgreSQL) are the exception: the claim counts
   their attempts itself, as their start (2) would, a round trip sooner.
2. **start**: an attempt is counted (``attempts + 1``, ``started_at``) and committed as
   the event starts, before its handler runs, so an event that kills its worker
   (segfault, SIGKILL, OOM) still uses its budget. Events that start together share one
   statement (on PostgreSQL a group's events all at once, the chain's first among
   them); on PostgreSQL the next group of a connection is started by the previous
   group's COMMIT itself (the same round trip), right as it starts.
3. **process**, PostgreSQL: a group of events (``group``, 16 by default) per
   transaction, at most ``concurrency`` groups at once: one COMMIT, one WAL flush, for
   the group. Its BEGIN locks the rows (fenced by the attempts counted in 2); the
   handlers run one after another, and their outbox rows, the completions and the
   next group's start marks go with the COMMIT. When a handler fails, the group rolls
   back and runs again with a savepoint per event (so do the next 16 groups): the
   failed event keeps its outcome, recorded in the group: transient errors reschedule
   it (backoff + jitter), a :class:`~relaybox.errors.PermanentError` sends it to dead
   letters as ``invalid``. The group gives up waiting for a row lock after 50 ms
   (another group holds it, or a deadlock): that event runs again alone. With
   ``group = 1`` an event is its own transaction and its BEGIN carries its
   completion. SQLite: the claimed batch in one transaction (one writer, one
   fsync), each event in a SAVEPOINT.

A row whose attempt started and never recorded an outcome comes back as a *suspect*
and runs with nothing else in flight in its process: a poison event charges only itself.
No remote call happens inside a transaction: handlers record outgoing actions in the
outbox.

The modules: :mod:`~relaybox.inbound.worker.context` (the handler API),
:mod:`~relaybox.inbound.worker.loop` (:class:`Worker`: the claim loop, chains, suspects,
the accept's hand-off), and the objects the worker holds, each given what it needs and
none calling back into it: :mod:`~relaybox.inbound.worker.claims` (claims, hold
renewal), :mod:`~relaybox.inbound.worker.queue` (claimed events waiting for a chain,
start marks), :mod:`~relaybox.inbound.worker.handlers` (finding and running an ``async
def`` handler), :mod:`~relaybox.inbound.worker.transactions` (a chain's transactions:
one event, groups), :mod:`~relaybox.inbound.worker.batches` (SQLite's batch, inline
acceptance), :mod:`~relaybox.inbound.worker.threaded` (plain-def handlers: a thread and
a synchronous transaction each), :mod:`~relaybox.inbound.worker.outcomes` (recording
what became of an attempt).
"""

from relaybox.inbound.worker.context import _UNKNOWN_CHANNELS_SAID as _UNKNOWN_CHANNELS_SAID
from relaybox.inbound.worker.context import (
    Context,
    Handler,
    Hooks,
    Outbox,
    Registration,
)
from relaybox.inbound.worker.loop import Worker

__all__ = ["Context", "Handler", "Hooks", "Outbox", "Registration", "Worker"]
