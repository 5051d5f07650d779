"""relaybox's migration 0037: a webhook delivery's key kept with its message (its own
table, partitioned with the messages), one index by day per keys table, and the
outbox's keys' index by day for their keys window."""

from django.db import migrations

from relaybox.contrib.django.migrating import ApplyRelayboxMigrations


class Migration(migrations.Migration):
    dependencies = [("relaybox", "0021_relaybox_0036")]

    operations = [ApplyRelayboxMigrations(37)]
