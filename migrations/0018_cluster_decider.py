from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("controlplane", "0017_instance_grey_override"),
    ]

    operations = [
        migrations.AddField(
            model_name="cluster",
            name="decider",
            field=models.CharField(
                choices=[
                    ("cost", "Cost"),
                    ("prefix_threshold", "Prefix Threshold"),
                    ("always", "Always"),
                    ("never", "Never"),
                ],
                default="cost",
                max_length=16,
            ),
        ),
    ]
