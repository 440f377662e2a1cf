from django.apps import AppConfig


class ControlPlaneConfig(AppConfig):
    name = "controlplane"
    verbose_name = "Switchyard control plane"
    default_auto_field = "django.db.models.BigAutoField"
