"""Selectors: the read side. Query sets and single objects for the API and the web UI;
they never write. Missing objects raise controlplane.services.errors.NotFound."""
