"""Django's database connection seen as a synchronous SQLAlchemy ``Connection``.

relaybox's synchronous statements (``publish``, ``ctx.once()``, the inbox completion)
run on the very DBAPI connection Django's ORM uses, inside its
``transaction.atomic()``: one transaction for the application's rows and relaybox's.
Django owns that transaction; the SQLAlchemy side never commits, rolls back or
closes the connection."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from django.db import close_old_connections, connections, transaction
from sqlalchemy import Connection, Engine, NullPool, create_engine
from sqlalchemy.engine import URL

from relaybox.contrib.django.errors import ImproperlyConfigured
from relaybox.errors import NotInTransaction

__all__ = ["async_database_url", "connection", "sync_transaction"]

_DIALECTS = {"postgresql": "postgresql+psycopg://", "sqlite": "sqlite://"}


class _Borrowed:
    """Django's DBAPI connection lent to SQLAlchemy: transaction control and closing
    stay with Django (``atomic()`` commits or rolls back; Django closes)."""

    def __init__(self, raw: Any) -> None:
        self._raw = raw

    def __getattr__(self, name: str) -> Any:
        return getattr(self._raw, name)

    def commit(self) -> None:
        pass

    def rollback(self) -> None:
        pass

    def close(self) -> None:
        pass


_engines: dict[str, Engine] = {}
_engines_lock = threading.Lock()


def _engine(using: str) -> Engine:
    """One engine per database alias. Its first connection (the dialect reading the
    server's version, then rolling back) is a connection of its own, so it never
    touches a transaction of Django's; every later one is Django's connection of the
    calling thread."""
    with _engines_lock:
        engine = _engines.get(using)
        if engine is not None:
            return engine
        wrapper = connections[using]
        vendor = wrapper.vendor
        if vendor not in _DIALECTS:
            raise ImproperlyConfigured(
                f"relaybox runs on PostgreSQL or SQLite; DATABASES[{using!r}] is {vendor}"
            )
        first = [True]

        def creator() -> Any:
            if first[0]:
                first[0] = False
                return wrapper.get_new_connection(wrapper.get_connection_params())
            current = connections[using]
            current.ensure_connection()
            return _Borrowed(current.connection)

        engine = create_engine(
            _DIALECTS[vendor], creator=creator, poolclass=NullPool, pool_reset_on_return=None
        )
        with engine.connect():  # the dialect's first-connect work, on its own connection
            pass
        _engines[using] = engine
        return engine


@contextlib.contextmanager
def connection(using: str = "default") -> Iterator[Connection]:
    """A SQLAlchemy ``Connection`` over Django's connection ``using`` of this thread,
    in the transaction Django has open (call it inside ``transaction.atomic()``)."""
    if not connections[using].in_atomic_block:
        raise NotInTransaction(
            "relaybox writes in the application's transaction, so that the message commits"
            " with the change it belongs to, or not at all: call it inside"
            f" django.db.transaction.atomic(using={using!r})"
        )
    with _engine(using).connect() as conn:
        yield conn


@contextlib.contextmanager
def sync_transaction(using: str = "default") -> Iterator[Connection]:
    """The worker's transaction for a synchronous handler: ``transaction.atomic()``
    on Django's connection (committed on a clean exit, rolled back when the handler
    raises), yielded as a SQLAlchemy ``Connection``. Like a request, it starts and
    ends with ``close_old_connections()``: a connection that broke or outlived
    ``CONN_MAX_AGE`` is replaced (with the default ``CONN_MAX_AGE = 0``, every
    transaction has a connection of its own: set it for persistent connections)."""
    close_old_connections()
    try:
        with transaction.atomic(using=using), connection(using) as conn:
            yield conn
    finally:
        close_old_connections()


def async_database_url(using: str = "default") -> str:
    """The URL of relaybox's own (asynchronous) connections: the same database as
    ``DATABASES[using]``."""
    wrapper = connections[using]
    params = wrapper.settings_dict
    if wrapper.vendor == "sqlite":
        name = str(params["NAME"])
        if wrapper.is_in_memory_db():
            raise ImproperlyConfigured(
                "relaybox needs a SQLite database file that its worker can open too; "
                f"DATABASES[{using!r}] is in memory"
            )
        return f"sqlite:///{name}"
    if wrapper.vendor != "postgresql":
        raise ImproperlyConfigured(
            f"relaybox runs on PostgreSQL or SQLite; DATABASES[{using!r}] is {wrapper.vendor}"
        )
    options = params.get("OPTIONS") or {}
    query = {k: str(options[k]) for k in ("sslmode",) if k in options}
    host = str(params.get("HOST") or "") or None
    port = str(params.get("PORT") or "") or None
    if host is not None and host.startswith("/"):  # a socket directory: in the query
        query["host"] = host
        if port is not None:
            query["port"] = port
        host = port = None
    url = URL.create(
        "postgresql",
        username=params.get("USER") or None,
        password=params.get("PASSWORD") or None,
        host=host,
        port=int(port) if port else None,
        database=params.get("NAME") or None,
        query=query,
    )
    return url.render_as_string(hide_password=False)
