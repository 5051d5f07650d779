"""relaybox's migration 0034: the outbox's keys table (PostgreSQL), so that the sending
side's history can be partitioned by time."""

from django.db import migrations

from relaybox.contrib.django.migrating import ApplyRelayboxMigrations


class Migration(migrations.Migration):
    dependencies = [("relaybox", "0018_relaybox_0033")]

    operations = [ApplyRelayboxMigrations(34)]
