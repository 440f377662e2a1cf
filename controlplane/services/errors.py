from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


class ServiceError(Exception):
    """A refused change, with a message for the operator and the field at fault if any."""

    status = 400
    details: dict[str, Any] = {}  # read-only here; subclasses set their own

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field


class Invalid(ServiceError):
    """Several refusals at once, each field named.

    ``details["problems"]`` lists every one as ``{"field": ..., "message": ...}`` (the API
    returns it as is, the forms put each message next to its input); ``field`` is the first
    problem's and ``message`` joins them all.
    """

    def __init__(self, problems: list[dict[str, Any]]) -> None:
        super().__init__("; ".join(p["message"] for p in problems), problems[0]["field"])
        self.details = {"problems": problems}


def problems_of(error: ServiceError, prefix: str = "") -> list[dict[str, Any]]:
    """The problems an error stands for, their fields under ``prefix`` (``policies.0``)."""
    listed = error.details.get("problems") or [{"field": error.field, "message": error.message}]
    return [
        {"field": ".".join(filter(None, (prefix, p["field"]))) or None, "message": p["message"]}
        for p in listed
    ]


class Problems:
    """Runs independent checks and refuses all their problems together, so an operator
    fixes a form once instead of once per field. Only 400s are collected: a missing
    cluster (404) or a conflict (409) ends the checking at once."""

    def __init__(self) -> None:
        self.found: list[dict[str, Any]] = []

    def check(self, check: Callable[..., T], *args: Any, prefix: str = "") -> T | None:
        """``check(*args)``, or None after noting its problems."""
        try:
            return check(*args)
        except ServiceError as error:
            if error.status != ServiceError.status:
                raise
            self.found.extend(problems_of(error, prefix))
            return None

    def raise_any(self) -> None:
        if self.found:
            raise Invalid(self.found)


class NotFound(ServiceError):
    status = 404


class Forbidden(ServiceError):
    status = 403


class Conflict(ServiceError):
    status = 409


class StaleEdit(Conflict):
    """The edit was made against an older revision of the cluster than the current one."""

    def __init__(self, cluster_name: str, expected: int, current: int) -> None:
        super().__init__(
            f"{cluster_name} changed since this edit was prepared (made against "
            f"revision {expected}, it is now at revision {current}): review the "
            "current state and submit again",
            "expected_revision",
        )
        self.details = {"current_revision": current}
