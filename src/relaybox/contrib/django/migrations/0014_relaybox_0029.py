"""relaybox's migration 0029: retention per tenant (relaybox_retention_policies) and
the partial indexes a purge pass per tenant group or per source reads."""

from django.db import migrations

from relaybox.contrib.django.migrating import ApplyRelayboxMigrations


class Migration(migrations.Migration):
    dependencies = [("relaybox", "0013_relaybox_0028")]

    operations = [ApplyRelayboxMigrations(29)]
