"""relaybox's migration 0038: the keys kept for good, narrower (an event key's 8-byte
fingerprint digest, 32-bit scopes, an idempotency key's message id as 16 bytes)."""

from django.db import migrations

from relaybox.contrib.django.migrating import ApplyRelayboxMigrations


class Migration(migrations.Migration):
    dependencies = [("relaybox", "0022_relaybox_0037")]

    operations = [ApplyRelayboxMigrations(38)]
