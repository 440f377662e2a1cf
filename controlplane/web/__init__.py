"""Server-rendered pages (Django templates + htmx) and plain HTTP endpoints. Views are thin:
they call controlplane.selectors to read and controlplane.services to change anything."""
