"""relaybox's migration 0021: portal sessions ended by a logout, and single-use portal
links once opened."""

from django.db import migrations

from relaybox.contrib.django.migrating import ApplyRelayboxMigrations


class Migration(migrations.Migration):
    dependencies = [("relaybox", "0005_relaybox_0020")]

    operations = [ApplyRelayboxMigrations(21)]
