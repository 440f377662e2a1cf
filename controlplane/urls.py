from django.contrib import admin
from django.urls import path

from controlplane.web.health import healthz

urlpatterns = [
    path("healthz", healthz, name="healthz"),
    path("admin/", admin.site.urls),
]
