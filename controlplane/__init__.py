"""Switchyard's control plane: Django project and app in one package."""

from .celery import app as celery_app

__all__ = ["celery_app"]
