"""relaybox from synchronous code (Flask, scripts, Django): publishing in the
application's transaction, and handlers written as plain ``def``.

- :meth:`Relaybox.publish_sync(conn_or_session, ...) <relaybox.Relaybox.publish_sync>`:
  a message and its outbox rows in the transaction of a sync SQLAlchemy ``Connection``
  or ORM ``Session`` (:mod:`relaybox.sync.publish`).
- A handler registered as a plain function (``@box.handler(...) def grant(ctx)``) runs
  in a worker thread inside one synchronous transaction from ``box.sync_transaction()``,
  with :class:`SyncContext` (``ctx.once``, ``ctx.outbox.add``, ``ctx.project``,
  ``ctx.conn``, ``ctx.session``); the inbox row's completion commits in it
  (:mod:`relaybox.inbound.worker.threaded`).
- ``box.sync_transaction``: the provider of those transactions, a zero-argument
  callable returning a context manager that yields a ``Connection`` in a transaction
  (committed on a clean exit, rolled back on an exception). Default: a pooled sync
  engine on the box's database (``Relaybox(..., sync_transaction=...)`` replaces it).
"""

from relaybox.sync.context import SyncContext, SyncOutbox, SyncTransaction
from relaybox.sync.publish import connection_of, publish_sync

__all__ = ["SyncContext", "SyncOutbox", "SyncTransaction", "connection_of", "publish_sync"]
