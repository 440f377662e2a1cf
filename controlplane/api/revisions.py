"""Optimistic concurrency for edits of a cluster's routing state.

GET /clusters/{id} returns the cluster's `revision` (also as `ETag: "r<N>"`). An edit sends
the revision it was prepared against, as `expected_revision` in the body or as
`If-Match: "r<N>"`; if the cluster changed since, the edit is refused with 409 and
`current_revision` (the services' StaleEdit). An edit that sends neither is applied as is.
"""

from __future__ import annotations

import re

from django.http import HttpRequest

from controlplane.models import Cluster
from controlplane.services.errors import ServiceError

ETAG = re.compile(r'(?:W/)?"r(\d{1,18})"')


def etag(cluster: Cluster) -> str:
    return f'"r{cluster.revision}"'


def expected_revision(request: HttpRequest, from_body: int | None = None) -> int | None:
    """The body's `expected_revision`, else the `If-Match` header's; None if neither."""
    if from_body is not None:
        return from_body
    header = request.headers.get("If-Match")
    if header is None:
        return None
    match = ETAG.fullmatch(header.strip())
    if match is None:
        raise ServiceError('If-Match must be the ETag of GET /clusters/{id}, e.g. "r7"', "If-Match")
    return int(match.group(1))
