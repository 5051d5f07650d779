"""relaybox's migration 0023: replay-missing jobs (``relaybox_replay_jobs``)."""

from django.db import migrations

from relaybox.contrib.django.migrating import ApplyRelayboxMigrations


class Migration(migrations.Migration):
    dependencies = [("relaybox", "0007_relaybox_0022")]

    operations = [ApplyRelayboxMigrations(23)]
