"""ASGI entry point: Django for HTTP, Channels for websockets (session auth + Origin check)."""

from __future__ import annotations

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")

from channels.auth import AuthMiddlewareStack
from channels.routing import ProtocolTypeRouter, URLRouter
from channels.security.websocket import AllowedHostsOriginValidator
from django.conf import settings
from django.core.asgi import get_asgi_application

django_http = get_asgi_application()

from controlplane.body_limit import BodySizeLimit  # noqa: E402
from controlplane.realtime.routing import websocket_urlpatterns  # noqa: E402


def _http_app():
    """Django (and static files), behind the body-size limit: Django spools a whole body
    before anything else runs, so its size is checked in front of it."""
    if os.environ.get("SWITCHYARD_SERVE_STATIC", "1") == "1":
        from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler

        # django-stubs types a handler's scope as dict and its messages as Mapping
        return BodySizeLimit(ASGIStaticFilesHandler(django_http))  # type: ignore[arg-type]
    return BodySizeLimit(django_http)  # type: ignore[arg-type]


application = ProtocolTypeRouter(
    {
        "http": _http_app(),
        "websocket": AllowedHostsOriginValidator(
            AuthMiddlewareStack(URLRouter(websocket_urlpatterns))
        ),
    }
)
__all__ = ["application", "settings"]
