"""relaybox's migration 0029: retention per tenant (relaybox_retention_policies) and
the partial indexes a purge pass per tenant group or per source reads."""

from django.db import migrations

from relaybox.contrib.django.migrating import ApplyRelayboxMigrations


class Migration(migrations.Migration):
    dependencies = [("relaybox", "0012_relaybox_0027")]

    operations = [ApplyRelayboxMigrations(29)]
