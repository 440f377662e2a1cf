"""Where replay traces live: the shared public traces and operators' uploads."""

from __future__ import annotations

import os
from pathlib import Path

from django.conf import settings

from .errors import ServiceError

TRACE_SUFFIXES = (".jsonl", ".csv")


def traces_dir() -> Path:
    default = Path(settings.BASE_DIR).parent / "shared" / "traces"
    return Path(os.environ.get("SWITCHYARD_TRACES_DIR", default))


def uploads_dir() -> Path:
    return Path(settings.SWITCHYARD_VAR_DIR) / "replay-uploads"


def shared_traces() -> list[str]:
    folder = traces_dir()
    if not folder.is_dir():
        return []
    return sorted(p.name for p in folder.iterdir() if p.suffix in TRACE_SUFFIXES)


def resolve_trace(trace: str) -> Path:
    """`shared:<name>` or `upload:<name>` → a file path."""
    origin, _, name = trace.partition(":")
    folder = {"shared": traces_dir(), "upload": uploads_dir()}.get(origin)
    if folder is None or not name or Path(name).name != name:
        raise ServiceError(f"unknown trace {trace!r}", "trace")
    return folder / name
