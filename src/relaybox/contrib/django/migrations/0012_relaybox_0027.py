"""relaybox's migration 0027: the keys that decide a duplicate across time, apart from
the history (relaybox_event_keys, relaybox_message_keys, relaybox_keys_backfill)."""

from django.db import migrations

from relaybox.contrib.django.migrating import ApplyRelayboxMigrations


class Migration(migrations.Migration):
    dependencies = [("relaybox", "0011_relaybox_0026")]

    operations = [ApplyRelayboxMigrations(27)]
