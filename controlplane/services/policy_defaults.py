"""Policy parameters implied by a cluster's GPU and model (enginesim's cost model).

``predicted_ttft`` takes its cost coefficients as validated parameters, so the router never
imports ``enginesim``; the control plane may. Every coefficient the operator leaves unset
(``None``: omitted in the API, blank in the policy form) is derived from the calibrated
roofline model (``enginesim.replay.policy_costs``, which the replay simulator uses too)
for the cluster's GPU (``Cluster.gpu_type``, an enginesim GPU key such as ``h20``) and
served model (``Cluster.model``: an enginesim model key, its served name, or that name
without the organisation or the ``-Instruct`` suffix, e.g. ``Qwen/Qwen2-7B``). Values the
operator set are kept. A cluster whose hardware enginesim does not know is refused with
the field to set by hand, never given another GPU's numbers.

Used by the policy and replay services when a policy is created or a replay requested.
"""

from __future__ import annotations

from typing import Any

from controlplane.models import Cluster
from enginesim.replay.policy_costs import (
    UnknownHardwareError,
    derive_coefficients,
    fill_coefficients,
    unset_fields,
)

from .errors import ServiceError

__all__ = ["UnknownHardwareError", "complete_params", "derive_coefficients"]


def complete_params(kind: str, params: dict[str, Any], cluster: Cluster) -> dict[str, Any]:
    """``params`` (already validated) with every unset cost coefficient of ``kind`` derived
    from ``cluster``'s GPU and model; unchanged for kinds without coefficients.

    Raises ServiceError naming the first unset field when the hardware is unknown.
    """
    try:
        return fill_coefficients(kind, params, cluster.gpu_type, cluster.model)
    except UnknownHardwareError as error:
        missing = unset_fields(kind, params)
        fields = ", ".join(f"params.{name}" for name in missing)
        raise ServiceError(
            f"params.{missing[0]}: cannot derive {kind}'s cost coefficients "
            f"for {cluster.name}: {error}; set {fields}",
            f"params.{missing[0]}",
        ) from None
