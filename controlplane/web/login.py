"""Login forms that refuse further attempts after repeated failures
(controlplane.services.login_throttle); used by the UI login and the Django admin login."""

from __future__ import annotations

from typing import Any

from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth.forms import AuthenticationForm
from django.core.exceptions import ValidationError

from controlplane.services import login_throttle

THROTTLED_MESSAGE = (
    "Too many failed login attempts for this account from your address; try again in a few minutes."
)


class ThrottleMixin:
    request: Any
    cleaned_data: dict[str, Any]

    def clean(self) -> dict[str, Any]:
        username = self.cleaned_data.get("username") or ""
        ip = self.request.META.get("REMOTE_ADDR", "") if self.request is not None else ""
        if login_throttle.is_locked(username, ip):
            raise ValidationError(THROTTLED_MESSAGE, code="throttled")
        try:
            cleaned = super().clean()  # type: ignore[misc]
        except ValidationError:
            login_throttle.record_failure(username, ip)
            raise
        login_throttle.clear(username, ip)
        return cleaned


class ThrottledAuthenticationForm(ThrottleMixin, AuthenticationForm):
    pass


class ThrottledAdminAuthenticationForm(ThrottleMixin, AdminAuthenticationForm):
    pass
