"""Running router processes on a router host, under its Celery `routers` worker."""
