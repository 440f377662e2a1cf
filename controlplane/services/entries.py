"""Entries of the routers' Redis streams as ingest reads them, before they are parsed: their
raw ``data``, their size, and the error that sends one to quarantine. Shared by the
ingest of events and metrics (``ingest.py``) and of captured traffic (``captures.py``)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

LATEST_UNIX = datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC).timestamp()


class PoisonEntry(ValueError):
    """A stream entry that cannot be stored, whatever the retries: it is quarantined."""


def raw_data(fields: dict) -> bytes:
    """An entry's ``data`` (or all its fields, for one of another shape)."""
    data = fields.get(b"data", fields.get("data"))
    if data is None:  # not the contract's shape: keep every field
        data = json.dumps({text(k): text(v) for k, v in fields.items()})
    return data if isinstance(data, bytes) else str(data).encode()


def text(value: bytes | str) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def entry_bytes(fields: dict) -> int:
    """The size of an entry's ``data`` (or of all its fields, for one of another shape)."""
    return len(raw_data(fields))
