"""relaybox's migration 0030: an event type's subject path (``subject`` on
relaybox_event_types) and the count of handler attempts an erasure redacted
(``inbox_attempts`` on relaybox_erasures)."""

from django.db import migrations

from relaybox.contrib.django.migrating import ApplyRelayboxMigrations


class Migration(migrations.Migration):
    dependencies = [("relaybox", "0014_relaybox_0029")]

    operations = [ApplyRelayboxMigrations(30)]
