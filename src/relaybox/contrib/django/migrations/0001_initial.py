"""relaybox's tables (its migrations 0001-0013) and the admin's read-only models."""

from django.db import migrations, models

from relaybox.contrib.django.migrating import ApplyRelayboxMigrations


class Migration(migrations.Migration):
    initial = True

    dependencies: list[tuple[str, str]] = []

    operations = [
        ApplyRelayboxMigrations(13),
        migrations.CreateModel(
            name="Delivery",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("channel", models.TextField()),
                ("key", models.TextField()),
                ("tenant", models.TextField(null=True)),
                ("status", models.TextField()),
                ("attempts", models.IntegerField()),
                ("next_attempt_at", models.FloatField()),
                ("last_error", models.TextField(null=True)),
                ("last_status", models.IntegerField(null=True)),
                ("dead_reason", models.TextField(null=True)),
                ("endpoint_id", models.TextField(null=True)),
                ("message_id", models.TextField(null=True)),
                ("created_at", models.FloatField()),
                ("updated_at", models.FloatField()),
                ("sent_at", models.FloatField(null=True)),
            ],
            options={
                "verbose_name_plural": "deliveries",
                "db_table": "relaybox_outbox",
                "ordering": ("-id",),
                "managed": False,
            },
        ),
        migrations.CreateModel(
            name="InboxEvent",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("source", models.TextField()),
                ("account", models.TextField()),
                ("event_id", models.TextField()),
                ("event_type", models.TextField()),
                ("tenant", models.TextField(null=True)),
                ("status", models.TextField()),
                ("dead_reason", models.TextField(null=True)),
                ("attempts", models.IntegerField()),
                ("next_attempt_at", models.FloatField()),
                ("last_error", models.TextField(null=True)),
                ("received_at", models.FloatField()),
                ("updated_at", models.FloatField()),
                ("done_at", models.FloatField(null=True)),
                ("discarded_at", models.FloatField(null=True)),
                ("discarded_by", models.TextField(null=True)),
                ("discard_reason", models.TextField(null=True)),
            ],
            options={
                "verbose_name": "inbox event",
                "db_table": "relaybox_inbox",
                "ordering": ("-id",),
                "managed": False,
            },
        ),
        migrations.CreateModel(
            name="Message",
            fields=[
                ("id", models.TextField(primary_key=True, serialize=False)),
                ("tenant", models.TextField()),
                ("event_type", models.TextField()),
                ("idempotency_key", models.TextField(null=True)),
                ("body", models.TextField()),
                ("created_at", models.FloatField()),
            ],
            options={
                "db_table": "relaybox_messages",
                "ordering": ("-created_at",),
                "managed": False,
            },
        ),
        migrations.CreateModel(
            name="Quarantined",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("inbox_id", models.BigIntegerField()),
                ("source", models.TextField()),
                ("account", models.TextField()),
                ("event_id", models.TextField()),
                ("event_type", models.TextField()),
                ("tenant", models.TextField(null=True)),
                ("received_at", models.FloatField()),
                ("resolved_at", models.FloatField(null=True)),
                ("resolution", models.TextField(null=True)),
            ],
            options={
                "verbose_name": "quarantined delivery",
                "verbose_name_plural": "quarantine",
                "db_table": "relaybox_quarantine",
                "ordering": ("-id",),
                "managed": False,
            },
        ),
        migrations.CreateModel(
            name="DeadLetter",
            fields=[],
            options={
                "verbose_name": "dead letter",
                "proxy": True,
                "indexes": [],
                "constraints": [],
            },
            bases=("relaybox.inboxevent",),
        ),
    ]
