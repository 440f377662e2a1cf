from typing import Any


class ServiceError(Exception):
    """A refused change, with a message for the operator and the field at fault if any."""

    status = 400
    details: dict[str, Any] = {}  # read-only here; subclasses set their own

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field


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
