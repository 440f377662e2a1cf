"""The control plane's REST API (django-ninja), mounted at /api/v1/."""
