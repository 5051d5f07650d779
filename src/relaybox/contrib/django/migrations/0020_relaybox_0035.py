"""relaybox's migration 0035: the event keys' and the idempotency keys' digests as
uuid (16 bytes with no length header), as the business keys keep theirs."""

from django.db import migrations

from relaybox.contrib.django.migrating import ApplyRelayboxMigrations


class Migration(migrations.Migration):
    dependencies = [("relaybox", "0019_relaybox_0034")]

    operations = [ApplyRelayboxMigrations(35)]
