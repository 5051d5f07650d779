"""relaybox's migration 0026: the W3C trace context of a received event and of a
published message (``traceparent`` on relaybox_inbox and relaybox_messages)."""

from django.db import migrations

from relaybox.contrib.django.migrating import ApplyRelayboxMigrations


class Migration(migrations.Migration):
    dependencies = [("relaybox", "0010_relaybox_0025")]

    operations = [ApplyRelayboxMigrations(26)]
