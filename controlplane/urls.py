from django.contrib import admin
from django.urls import include, path
from django.views.generic import RedirectView

from controlplane.api.api import api
from controlplane.web.health import healthz
from controlplane.web.login import ThrottledAdminAuthenticationForm

admin.site.login_form = ThrottledAdminAuthenticationForm

urlpatterns = [
    path("healthz", healthz, name="healthz"),
    path("admin/", admin.site.urls),
    path("api/v1/", api.urls),
    path("api/docs", RedirectView.as_view(url="/api/v1/docs", permanent=False)),
    # browsers ask for /favicon.ico on every page that names none (API answers, errors)
    path(
        "favicon.ico",
        RedirectView.as_view(url="/static/switchyard/favicon.svg", permanent=True),
        name="favicon",
    ),
    path("", include("controlplane.web.urls")),
]
