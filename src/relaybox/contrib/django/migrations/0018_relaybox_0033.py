"""relaybox's migration 0033: the indexes by which erasing a tenant reaches the events
received for it and its quarantine entries."""

from django.db import migrations

from relaybox.contrib.django.migrating import ApplyRelayboxMigrations


class Migration(migrations.Migration):
    dependencies = [("relaybox", "0015_relaybox_0030")]

    operations = [ApplyRelayboxMigrations(33)]
