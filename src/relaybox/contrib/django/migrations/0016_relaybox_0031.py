"""relaybox's migration 0031: business keys as narrow digests
(relaybox_business_keys), apart from the readable history in relaybox_operations."""

from django.db import migrations

from relaybox.contrib.django.migrating import ApplyRelayboxMigrations


class Migration(migrations.Migration):
    dependencies = [("relaybox", "0015_relaybox_0030")]

    operations = [ApplyRelayboxMigrations(31)]
