"""``manage.py migrate`` makes relaybox's schema exactly as ``relaybox migrate`` does
(both backends), records it where ``relaybox migrate`` looks, and a relaybox
migration without its Django migration fails here."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connections
from django.db.migrations.loader import MigrationLoader

from relaybox.contrib.django import get_box
from relaybox.contrib.django.portal import run
from relaybox.store.backend import load_migrations
from relaybox.store.schema_sync import latest_migration
from tests.django.conftest import BOTH
from tests.support.schema import committed, describe_postgres, describe_sqlite

pytestmark = pytest.mark.django_db(transaction=True, databases=BOTH)


def _describe(alias: str, cursor: Any) -> str:
    return describe_sqlite(cursor) if alias == "default" else describe_postgres(cursor)


def test_manage_py_migrate_makes_relayboxs_own_schema(alias: str) -> None:
    """Compared with the committed schema, which ``tests/store/test_schema.py`` holds
    to what ``relaybox migrate`` makes."""
    with connections[alias].cursor() as cur:
        django_made = _describe(alias, cur)
        cur.execute("SELECT version, name FROM relaybox_migrations")
        recorded = set(cur.fetchall())
    assert django_made == committed("sqlite" if alias == "default" else "postgres")
    backend = "sqlite" if alias == "default" else "postgres"
    assert recorded == {(v, n) for v, n, _ in load_migrations(backend)}
    # relaybox agrees: nothing to apply, schema current.
    box = get_box()
    assert run(box.store.migrate()) == []
    current, latest = run(box.store.schema_version())
    assert current == latest


def test_every_relaybox_migration_has_its_django_migration() -> None:
    """A new file in relaybox/store/migrations needs a Django migration of
    ``relaybox.contrib.django`` whose ``ApplyRelayboxMigrations`` names its version
    (or a later one). A version may exist for one backend only (SQLite's 0019 redoes
    what PostgreSQL's 0007 did): the Django migrations reach the newest of either."""
    loader = MigrationLoader(None, ignore_no_migrations=True)
    covered = max(
        getattr(operation, "relaybox_upto", 0)
        for (app, _), migration in loader.disk_migrations.items()
        if app == "relaybox"
        for operation in migration.operations
    )
    newest = {backend: latest_migration(backend) for backend in ("sqlite", "postgres")}
    assert max(newest.values()) == covered, (
        f"relaybox's migrations reach {newest}, its Django migrations {covered}: add "
        "relaybox/contrib/django/migrations/NNNN_*.py with "
        f"ApplyRelayboxMigrations({max(newest.values())})"
    )
