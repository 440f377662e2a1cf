"""Create the role groups viewer, operator and admin (controlplane.services.roles)."""

from django.db import migrations

ROLES = ("viewer", "operator", "admin")


def create_role_groups(apps, schema_editor):
    group = apps.get_model("auth", "Group")
    for name in ROLES:
        group.objects.get_or_create(name=name)


def delete_role_groups(apps, schema_editor):
    apps.get_model("auth", "Group").objects.filter(name__in=ROLES).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("controlplane", "0003_rollup_samples"),
        ("auth", "0012_alter_user_first_name_max_length"),
    ]

    operations = [migrations.RunPython(create_role_groups, delete_role_groups)]
