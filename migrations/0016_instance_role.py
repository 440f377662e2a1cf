from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("controlplane", "0015_tenants"),
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
