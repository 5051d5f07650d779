"""Django migrations that run relaybox's own migration files.

Each Django migration of this app names the relaybox migration version it brings
the database to; the operation applies the files up to it that
``relaybox_migrations`` does not record, and records them there, in the Django
migration's transaction. ``relaybox migrate`` and ``manage.py migrate`` therefore
agree, whichever runs first. A relaybox release that adds a migration file adds a
Django migration here naming its version (a test fails while they differ)."""

from __future__ import annotations

from typing import Any

from django.db import migrations

__all__ = ["ApplyRelayboxMigrations"]


def ApplyRelayboxMigrations(upto: int) -> migrations.RunPython:
    """The operation bringing relaybox's tables to migration ``upto``. Irreversible:
    relaybox's migrations go forward only."""

    def forward(apps: Any, schema_editor: Any) -> None:
        from relaybox.contrib.django.db import connection
        from relaybox.store.schema_sync import migrate_sync

        with connection(schema_editor.connection.alias) as conn:
            migrate_sync(conn, upto)

    operation = migrations.RunPython(forward, elidable=False)
    operation.relaybox_upto = upto  # read by the drift test
    return operation
