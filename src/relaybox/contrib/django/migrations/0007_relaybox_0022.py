"""relaybox's migration 0022: the attempts earlier versions recorded show credential
headers as ``[redacted]`` (data only: no table changes)."""

from django.db import migrations

from relaybox.contrib.django.migrating import ApplyRelayboxMigrations


class Migration(migrations.Migration):
    dependencies = [("relaybox", "0006_relaybox_0021")]

    operations = [ApplyRelayboxMigrations(22)]
