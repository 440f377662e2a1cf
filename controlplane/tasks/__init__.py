"""Thin Celery tasks: each one calls a service or selector and returns a small result."""

from .maintenance import ping

__all__ = ["ping"]
