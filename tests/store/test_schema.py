"""Replaying every migration on a fresh database gives the committed schema
(``src/relaybox/store/schema/<backend>.txt``): a migration that changes the schema
changes that file in the same commit (``python -m tests.support.schema --write``), so
a review sees the schema it makes, and a migration edited after the fact is caught."""

from __future__ import annotations

from tests.support.schema import committed, migrated_postgres, migrated_sqlite

_HOW = (
    "the migrations no longer give the committed schema; if that is intended, "
    "run `python -m tests.support.schema --write` and commit the file"
)


def test_sqlite_migrations_give_the_committed_schema() -> None:
    assert migrated_sqlite() == committed("sqlite"), _HOW


def test_postgres_migrations_give_the_committed_schema(pg_url: str) -> None:
    assert migrated_postgres(pg_url) == committed("postgres"), _HOW
