"""Server-rendered pages and plain HTTP endpoints of the control plane."""
