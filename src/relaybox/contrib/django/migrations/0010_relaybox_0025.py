"""relaybox's migration 0025: erasing one subject (relaybox.erasure): the subject index,
the erasures record and erased_at columns."""

from django.db import migrations

from relaybox.contrib.django.migrating import ApplyRelayboxMigrations


class Migration(migrations.Migration):
    dependencies = [("relaybox", "0009_relaybox_0024")]

    operations = [ApplyRelayboxMigrations(25)]
