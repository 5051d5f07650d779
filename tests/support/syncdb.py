"""Synchronous SQLAlchemy engines on the test databases, as an application that is not
async (Flask, a script) makes them: sqlite3 with its default transaction handling, or
psycopg 3 on PostgreSQL."""

from __future__ import annotations

from sqlalchemy import Engine, create_engine
from sqlalchemy.engine import make_url

__all__ = ["app_engine", "sync_url"]


def sync_url(url: str) -> str:
    """The test database's URL with a synchronous driver."""
    u = make_url(url)
    if u.get_backend_name() == "sqlite":
        return u.set(drivername="sqlite").render_as_string(hide_password=False)
    return u.set(drivername="postgresql+psycopg").render_as_string(hide_password=False)


def app_engine(url: str) -> Engine:
    """The application's own engine (nothing of relaybox's settings in it)."""
    return create_engine(sync_url(url))
