"""Client API keys for routers (hashed), a per-cluster switch that makes them required, and
an expiry and revocation time on API tokens. Tokens that existed before get 90 days."""

import datetime

import django.db.models.deletion
from django.db import migrations, models
from django.utils import timezone

EXISTING_TOKENS_VALID_FOR = datetime.timedelta(days=90)


def expire_existing_tokens(apps, schema_editor):
    ApiToken = apps.get_model("controlplane", "ApiToken")
    ApiToken.objects.filter(expires_at=None).update(
        expires_at=timezone.now() + EXISTING_TOKENS_VALID_FOR
    )


class Migration(migrations.Migration):
    dependencies = [
        ("controlplane", "0005_replay_heartbeat"),
    ]

    operations = [
        migrations.AlterModelOptions(
            name="apitoken",
            options={"ordering": ["-created_at", "-id"]},
        ),
        migrations.AddField(
            model_name="apitoken",
            name="expires_at",
            field=models.DateTimeField(null=True),
        ),
        migrations.RunPython(expire_existing_tokens, migrations.RunPython.noop),
        migrations.AlterField(
            model_name="apitoken",
            name="expires_at",
            field=models.DateTimeField(help_text="The token is refused from this time on."),
        ),
        migrations.AddField(
            model_name="apitoken",
            name="revoked_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="cluster",
            name="client_keys_required",
            field=models.BooleanField(
                default=False, help_text="Routers refuse requests without a valid client API key."
            ),
        ),
        migrations.CreateModel(
            name="ClientKey",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("name", models.CharField(max_length=64)),
                ("prefix", models.CharField(db_index=True, max_length=16)),
                ("key_hash", models.CharField(max_length=64, unique=True)),
                (
                    "can_debug",
                    models.BooleanField(
                        default=False,
                        help_text="The router honours x-switchyard-debug for this key.",
                    ),
                ),
                ("created_at", models.DateTimeField(auto_now_add=True)),
                ("created_by", models.CharField(max_length=150)),
                ("revoked_at", models.DateTimeField(blank=True, null=True)),
                ("revoked_by", models.CharField(blank=True, default="", max_length=150)),
                (
                    "cluster",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="client_keys",
                        to="controlplane.cluster",
                    ),
                ),
            ],
            options={
                "ordering": ["cluster", "-created_at", "-id"],
                "constraints": [
                    models.UniqueConstraint(
                        condition=models.Q(("revoked_at", None)),
                        fields=("cluster", "name"),
                        name="active_client_key_name_per_cluster",
                    )
                ],
            },
        ),
    ]
