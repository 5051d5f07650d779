"""relaybox's migration 0032: day-encoded ids for time partitions of the history
(PostgreSQL; the partitioning itself is ``relaybox migrate --partitions``)."""

from django.db import migrations

from relaybox.contrib.django.migrating import ApplyRelayboxMigrations


class Migration(migrations.Migration):
    dependencies = [("relaybox", "0016_relaybox_0031")]

    operations = [ApplyRelayboxMigrations(32)]
