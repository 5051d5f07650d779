"""relaybox's migration 0024: silence detection's state (``relaybox_silences``) and an
endpoint's last successful delivery (``relaybox_endpoints.last_success_at``)."""

from django.db import migrations

from relaybox.contrib.django.migrating import ApplyRelayboxMigrations


class Migration(migrations.Migration):
    dependencies = [("relaybox", "0008_relaybox_0023")]

    operations = [ApplyRelayboxMigrations(24)]
