from django.apps import AppConfig


class ControlPlaneConfig(AppConfig):
    name = "controlplane"
    verbose_name = "Switchyard control plane"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # A bad SWITCHYARD_CANARY_DEFAULTS stops the process at start-up, naming the variable,
        # rather than the first canary form that reads it.
        from .services.canaries import site_defaults

        site_defaults()
        # Open websockets re-check their access when a user logs out or their roles change.
        from .realtime.access import connect_signals

        connect_signals()
        # OpenTelemetry spans of requests and Celery tasks, when OTEL_* ask for traces
        from .tracing import setup

        setup()
