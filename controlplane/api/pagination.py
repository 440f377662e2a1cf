from __future__ import annotations

from ninja import Field, Schema
from ninja.pagination import LimitOffsetPagination

MAX_LIMIT = 1000
MAX_OFFSET = 10**9


class Pages(LimitOffsetPagination):
    """limit/offset pages ({"items": [...], "count": N}) with bounded limit and offset."""

    class Input(Schema):
        limit: int = Field(100, ge=1, le=MAX_LIMIT)
        offset: int = Field(0, ge=0, le=MAX_OFFSET)
