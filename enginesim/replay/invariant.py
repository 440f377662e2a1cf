"""The never-collapse invariant Switchyard's own policies must keep in every replay cell.

A policy of ours may lose to the best baseline by a little; it must never collapse. Against
two baselines that cannot collapse (round robin spreads blindly, least load balances on
what is in flight), in the same cell:

* output throughput ≥ 0.95 × round robin's (tokens out per second of makespan: a policy
  that piles requests onto a few instances while the rest idle finishes late);
* mean TTFT ≤ 2 × least load's;
* mean TPOT ≤ 2 × least load's (a policy must not win TTFT by wrecking decode).

The checks read the summaries :func:`enginesim.replay.metrics.summarize` writes
(``throughput_tok_s``, ``ttft_mean_s``, ``tpot_mean_s``). Baselines are not held to it: a
report states where one breaks it (docs/algorithms.md, "The invariant").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# The policies the invariant binds (later policies of ours join this list).
OWN_POLICIES: tuple[str, ...] = ("lmetric", "smetric", "predicted_ttft")
THROUGHPUT_FLOOR = 0.95  # × round robin's output throughput
TTFT_CEILING = 2.0  # × least load's mean TTFT
TPOT_CEILING = 2.0  # × least load's mean TPOT
REFERENCES: tuple[str, ...] = ("round_robin", "least_load")


@dataclass(frozen=True, slots=True)
class InvariantCheck:
    """One policy's ratios against the references in one cell (None = not measurable)."""

    policy: str
    throughput_ratio: float | None  # policy ÷ round robin (higher is better)
    ttft_ratio: float | None  # policy ÷ least load (lower is better)
    tpot_ratio: float | None  # policy ÷ least load (lower is better)

    @property
    def breaches(self) -> list[str]:
        """Human-readable breaches, empty when the invariant holds."""
        out = []
        if self.throughput_ratio is not None and self.throughput_ratio < THROUGHPUT_FLOOR:
            out.append(f"throughput {self.throughput_ratio:.2f}× round robin's")
        if self.ttft_ratio is not None and self.ttft_ratio > TTFT_CEILING:
            out.append(f"mean TTFT {self.ttft_ratio:.2f}× least load's")
        if self.tpot_ratio is not None and self.tpot_ratio > TPOT_CEILING:
            out.append(f"mean TPOT {self.tpot_ratio:.2f}× least load's")
        return out

    @property
    def holds(self) -> bool:
        return not self.breaches

    def to_json(self) -> dict[str, Any]:
        """The ratios and the breaches, for a report's JSON."""
        return {
            "policy": self.policy,
            "throughput_ratio": self.throughput_ratio,
            "ttft_ratio": self.ttft_ratio,
            "tpot_ratio": self.tpot_ratio,
            "breaches": self.breaches,
        }


def _ratio(value: Any, reference: Any) -> float | None:
    if value is None or reference is None or reference <= 0:
        return None
    return float(value) / float(reference)


def check(policy: str, summaries: Mapping[str, Mapping[str, Any]]) -> InvariantCheck:
    """``policy``'s ratios in one cell; ``summaries`` maps policy name → its summary and
    must hold the references. Raises KeyError naming a missing reference."""
    missing = [name for name in (policy, *REFERENCES) if name not in summaries]
    if missing:
        raise KeyError(f"the invariant needs the runs of {', '.join(missing)} in this cell")
    own = summaries[policy]
    robin, least = summaries["round_robin"], summaries["least_load"]
    return InvariantCheck(
        policy=policy,
        throughput_ratio=_ratio(own.get("throughput_tok_s"), robin.get("throughput_tok_s")),
        ttft_ratio=_ratio(own.get("ttft_mean_s"), least.get("ttft_mean_s")),
        tpot_ratio=_ratio(own.get("tpot_mean_s"), least.get("tpot_mean_s")),
    )
