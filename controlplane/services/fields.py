"""What a model's columns allow, for checks made before a row is written."""

from __future__ import annotations

from django.db import models

INT_COLUMN = 2**31 - 1  # models.IntegerField in Postgres


def max_length(model: type[models.Model], name: str) -> int:
    """The ``max_length`` of one of ``model``'s character fields."""
    field = model._meta.get_field(name)
    assert isinstance(field, models.Field) and field.max_length is not None, (model, name)
    return field.max_length
