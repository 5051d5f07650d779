"""``manage.py migrate`` makes relaybox's schema exactly as ``relaybox migrate`` does
(both backends), records it where ``relaybox migrate`` looks, and a relaybox
migration without its Django migration fails here."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.db import connections
from django.db.migrations.loader import MigrationLoader
from sqlalchemy.engine import make_url

from relaybox.contrib.django import get_box
from relaybox.contrib.django.portal import run
from relaybox.store import open_store
from relaybox.store.base import load_migrations
from relaybox.store.schema_sync import latest_migration
from tests.conftest import create_pg_database, drop_pg_database
from tests.django.conftest import BOTH

pytestmark = pytest.mark.django_db(transaction=True, databases=BOTH)

PG_SCHEMA = [
    "SELECT table_name, column_name, data_type, is_nullable, column_default"
    " FROM information_schema.columns"
    " WHERE table_schema = 'public' AND table_name LIKE 'relaybox%'",
    "SELECT tablename, indexname, indexdef FROM pg_indexes"
    " WHERE schemaname = 'public' AND tablename LIKE 'relaybox%'",
    "SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid) FROM pg_constraint"
    " WHERE conrelid::regclass::text LIKE 'relaybox%'",
    "SELECT sequence_name, data_type FROM information_schema.sequences"
    " WHERE sequence_name LIKE 'relaybox%'",
]
SQLITE_SCHEMA = [
    "SELECT type, name, tbl_name, sql FROM sqlite_master WHERE name LIKE 'relaybox%'",
]


def _read(cursor: Any, queries: list[str]) -> list[set[tuple[Any, ...]]]:
    found = []
    for query in queries:
        cursor.execute(query)
        found.append({tuple(r) for r in cursor.fetchall()})
    return found


def _relaybox_migrated(alias: str, tmp_path: Path) -> list[set[tuple[Any, ...]]]:
    """The schema of a database that ``relaybox migrate`` (the asynchronous store)
    set up."""
    if alias == "default":
        path = tmp_path / "reference.db"
        store = open_store(f"sqlite:///{path}")
        asyncio.run(store.migrate())
        asyncio.run(store.close())
        with sqlite3.connect(path) as db:
            return _read(db.cursor(), SQLITE_SCHEMA)
    url = asyncio.run(create_pg_database())  # a clone of a database relaybox migrated
    try:
        dsn = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
        with psycopg.connect(dsn) as db:
            return _read(db.cursor(), PG_SCHEMA)
    finally:
        asyncio.run(drop_pg_database(url))


def test_manage_py_migrate_makes_relayboxs_own_schema(alias: str, tmp_path: Path) -> None:
    queries = SQLITE_SCHEMA if alias == "default" else PG_SCHEMA
    with connections[alias].cursor() as cur:
        django_made = _read(cur, queries)
        cur.execute("SELECT version, name FROM relaybox_migrations")
        recorded = set(cur.fetchall())
    reference = _relaybox_migrated(alias, tmp_path)
    for made, expected in zip(django_made, reference, strict=True):
        assert made == expected
    backend = "sqlite" if alias == "default" else "postgres"
    assert recorded == {(v, n) for v, n, _ in load_migrations(backend)}
    # relaybox agrees: nothing to apply, schema current.
    box = get_box()
    assert run(box.store.migrate()) == []
    current, latest = run(box.store.schema_version())
    assert current == latest


def test_every_relaybox_migration_has_its_django_migration() -> None:
    """A new file in relaybox/store/migrations needs a Django migration of
    ``relaybox.contrib.django`` whose ``ApplyRelayboxMigrations`` names its version."""
    loader = MigrationLoader(None, ignore_no_migrations=True)
    covered = max(
        getattr(operation, "relaybox_upto", 0)
        for (app, _), migration in loader.disk_migrations.items()
        if app == "relaybox"
        for operation in migration.operations
    )
    for backend in ("sqlite", "postgres"):
        assert latest_migration(backend) == covered, (
            f"relaybox's {backend} migrations reach {latest_migration(backend)}, its Django "
            f"migrations {covered}: add relaybox/contrib/django/migrations/NNNN_*.py with "
            f"ApplyRelayboxMigrations({latest_migration(backend)})"
        )
