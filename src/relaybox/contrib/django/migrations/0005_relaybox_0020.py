"""relaybox's migration 0020: SQLite counts finished rows from a partial index
(nothing on PostgreSQL)."""

from django.db import migrations

from relaybox.contrib.django.migrating import ApplyRelayboxMigrations


class Migration(migrations.Migration):
    dependencies = [("relaybox", "0004_relaybox_0019")]

    operations = [ApplyRelayboxMigrations(20)]
