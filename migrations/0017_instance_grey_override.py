from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("controlplane", "0016_instance_role"),
    ]

    operations = [
        migrations.AddField(
            model_name="instance",
            name="grey_override",
            field=models.CharField(
                choices=[("auto", "Auto"), ("healthy", "Healthy"), ("drained", "Drained")],
                default="auto",
                max_length=16,
            ),
        ),
    ]
