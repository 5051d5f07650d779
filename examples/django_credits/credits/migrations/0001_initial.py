from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True

    dependencies = []

    operations = [
        migrations.CreateModel(
            name="Balance",
            fields=[
                ("workspace", models.TextField(primary_key=True, serialize=False)),
                ("credits", models.IntegerField(default=0)),
            ],
        ),
        migrations.CreateModel(
            name="Grant",
            fields=[
                ("business_key", models.TextField(primary_key=True, serialize=False)),
                ("kind", models.TextField(choices=[("grant", "grant"), ("reversal", "reversal")])),
                ("workspace", models.TextField()),
                ("invoice_id", models.TextField()),
                ("credits", models.IntegerField()),
                ("event_id", models.TextField()),
                ("created_at", models.DateTimeField(auto_now_add=True)),
            ],
        ),
        migrations.CreateModel(
            name="Order",
            fields=[
                (
                    "id",
                    models.AutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("workspace", models.TextField()),
                ("credits", models.IntegerField()),
                ("completed", models.BooleanField(default=False)),
            ],
        ),
    ]
