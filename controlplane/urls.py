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
    path("", include("controlplane.web.urls")),
]
