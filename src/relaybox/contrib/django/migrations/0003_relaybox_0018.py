"""relaybox's migration 0018: when the tenant portal showed a signing secret."""

from django.db import migrations

from relaybox.contrib.django.migrating import ApplyRelayboxMigrations


class Migration(migrations.Migration):
    dependencies = [("relaybox", "0002_relaybox_0017")]

    operations = [ApplyRelayboxMigrations(18)]
