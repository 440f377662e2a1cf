from django.db import migrations, models

import controlplane.models.cluster


class Migration(migrations.Migration):
    dependencies = [
        ("controlplane", "0013_capture_config_version_cluster_time_scale"),
    ]

    operations = [
        migrations.AddField(
            model_name="cluster",
            name="session_sources",
            field=models.JSONField(default=controlplane.models.cluster.all_session_sources),
        ),
    ]
