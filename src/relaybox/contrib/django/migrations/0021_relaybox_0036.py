"""relaybox's migration 0036: the subject index read by kind (its rows deleted once
what they point to holds nothing an erasure empties), and the subject of a
projection's state."""

from django.db import migrations

from relaybox.contrib.django.migrating import ApplyRelayboxMigrations


class Migration(migrations.Migration):
    dependencies = [("relaybox", "0020_relaybox_0035")]

    operations = [ApplyRelayboxMigrations(36)]
