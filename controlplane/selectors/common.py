from __future__ import annotations

from datetime import datetime
from typing import TypeVar

from django.core.exceptions import ObjectDoesNotExist
from django.db.models import Model, QuerySet

from controlplane.services.errors import NotFound

M = TypeVar("M", bound=Model)


def get_or_404(queryset: QuerySet[M], pk: int, what: str) -> M:
    try:
        return queryset.get(pk=pk)
    except ObjectDoesNotExist:  # the model's own DoesNotExist: get() raises no other
        raise NotFound(f"{what} {pk} does not exist") from None


def in_time_range(
    queryset: QuerySet, field: str, since: datetime | None, until: datetime | None
) -> QuerySet:
    if since is not None:
        queryset = queryset.filter(**{f"{field}__gte": since})
    if until is not None:
        queryset = queryset.filter(**{f"{field}__lt": until})
    return queryset
