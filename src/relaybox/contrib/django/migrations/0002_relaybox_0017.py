"""relaybox's migrations 0014-0017: attempt headers, an endpoint's flow (pause, payload
filter), ordered delivery, endpoint headers and credentials."""

from django.db import migrations

from relaybox.contrib.django.migrating import ApplyRelayboxMigrations


class Migration(migrations.Migration):
    dependencies = [("relaybox", "0001_initial")]

    operations = [ApplyRelayboxMigrations(17)]
