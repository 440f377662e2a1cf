from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("controlplane", "0013_capture_config_version_cluster_time_scale"),
    ]

    operations = [
        migrations.AddField(
            model_name="instance",
            name="role",
            field=models.CharField(
                choices=[("prefill", "Prefill"), ("decode", "Decode"), ("both", "Both")],
                default="both",
                max_length=8,
            ),
        ),
    ]
