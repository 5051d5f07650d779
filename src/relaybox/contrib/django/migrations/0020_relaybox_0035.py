"""relaybox's migration 0035: the event keys' and the idempotency keys' digests as
uuid (16 bytes with no length header), as the business keys keep theirs."""

from django.db import migrations

from relaybox.contrib.django.migrating import ApplyRelayboxMigrations


class Migration(migrations.Migration):
    dependencies = [("relaybox", "0018_relaybox_0033")]

    operations = [ApplyRelayboxMigrations(35)]
