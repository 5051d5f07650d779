"""relaybox's migration 0033: the indexes by which erasing a tenant reaches the events
received for it and its quarantine entries."""

from django.db import migrations

from relaybox.contrib.django.migrating import ApplyRelayboxMigrations


class Migration(migrations.Migration):
    dependencies = [("relaybox", "0017_relaybox_0032")]

    operations = [ApplyRelayboxMigrations(33)]
