"""relaybox's migration 0019: SQLite's event key in PostgreSQL's column order (nothing
to do on PostgreSQL, whose migration 0007 did it)."""

from django.db import migrations

from relaybox.contrib.django.migrating import ApplyRelayboxMigrations


class Migration(migrations.Migration):
    dependencies = [("relaybox", "0003_relaybox_0018")]

    operations = [ApplyRelayboxMigrations(19)]
