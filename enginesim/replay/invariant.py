"""The never-collapse invariant (v2) Switchyard's own policies must keep on every seed.

A policy of ours may lose to the best baseline by a little; it must never collapse. Judged
on each seed's run (one replicate of one replay cell) against the baselines' runs on the
same seed:

* goodput ≥ 0.95 × the better of round robin's and least load's (requests per second
  meeting the cell's TTFT and TPOT SLO: what the policies are for);
* mean TTFT ≤ 2 × the best baseline's, and mean TPOT ≤ 2 × the best baseline's (a policy
  must not win TTFT by wrecking decode). The best baseline is the baseline with the
  highest goodput on that seed (lower mean TTFT among equals), so a reference that
  collapses at high load does not lift the ceiling.

A value missing on either side (no completed request, a reference that did not run) fails
the leg: the invariant never passes for want of a measurement. The checks read the
summaries :func:`enginesim.replay.metrics.summarize` writes (``goodput_rps``,
``ttft_mean_s``, ``tpot_mean_s``; ``throughput_tok_s`` is reported beside them, not
judged). Baselines are not held to it: a report states where one breaks it
(docs/algorithms.md, "The invariant").
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# The policies the invariant binds (later policies of ours join this list).
OWN_POLICIES: tuple[str, ...] = ("lmetric", "smetric", "predicted_ttft")
GOODPUT_FLOOR = 0.95  # × the better of the references' goodput
TTFT_CEILING = 2.0  # × the best baseline's mean TTFT
TPOT_CEILING = 2.0  # × the best baseline's mean TPOT
REFERENCES: tuple[str, ...] = ("round_robin", "least_load")
VERSION = 2
STATEMENT = (
    f"per seed: goodput ≥ {GOODPUT_FLOOR:g} × the better of round robin's and least load's; "
    f"mean TTFT ≤ {TTFT_CEILING:g} × and mean TPOT ≤ {TPOT_CEILING:g} × the best "
    "baseline's (highest goodput on that seed); a missing value fails"
)

Summary = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class InvariantCheck:
    """One policy's standing against the baselines on one seed (None = not measured)."""

    policy: str
    best_baseline: str | None
    goodput_ratio: float | None  # policy ÷ the better reference (higher is better)
    ttft_ratio: float | None  # policy ÷ the best baseline (lower is better)
    tpot_ratio: float | None  # policy ÷ the best baseline (lower is better)
    throughput_ratio: float | None  # policy ÷ round robin's output throughput (not judged)
    breaches: tuple[str, ...]  # human-readable, empty when the invariant holds

    @property
    def holds(self) -> bool:
        return not self.breaches

    def to_json(self) -> dict[str, Any]:
        """The ratios and the breaches, for a report's JSON."""
        return {
            "policy": self.policy,
            "best_baseline": self.best_baseline,
            "goodput_ratio": self.goodput_ratio,
            "ttft_ratio": self.ttft_ratio,
            "tpot_ratio": self.tpot_ratio,
            "throughput_ratio": self.throughput_ratio,
            "breaches": list(self.breaches),
        }


def _value(summary: Summary | None, key: str) -> float | None:
    value = None if summary is None else summary.get(key)
    if value is None or value != value:  # nan counts as missing
        return None
    return float(value)


def _ratio(value: float | None, reference: float | None) -> float | None:
    if value is None or reference is None or reference <= 0:
        return None
    return value / reference


def best_baseline(summaries: Mapping[str, Summary], baselines: Iterable[str]) -> str | None:
    """The baseline with the highest goodput (lower mean TTFT among equals; None if no
    baseline has a goodput)."""
    measured = [b for b in baselines if _value(summaries.get(b), "goodput_rps") is not None]
    if not measured:
        return None

    def order(name: str) -> tuple[float, float, str]:
        ttft = _value(summaries[name], "ttft_mean_s")
        return (-(_value(summaries[name], "goodput_rps") or 0.0), ttft or float("inf"), name)

    return min(measured, key=order)


def check(
    policy: str, summaries: Mapping[str, Summary], baselines: Iterable[str] | None = None
) -> InvariantCheck:
    """``policy``'s check on one seed. ``summaries`` maps policy name → that seed's summary;
    ``baselines`` names the baselines among them (default: every name but ours)."""
    names = [n for n in (_others(summaries) if baselines is None else baselines) if n != policy]
    own = summaries.get(policy)
    refs = [_value(summaries.get(r), "goodput_rps") for r in REFERENCES]
    better_ref = None if None in refs else max(r for r in refs if r is not None)
    best = best_baseline(summaries, dict.fromkeys([*names, *REFERENCES]))
    best_summary = summaries.get(best) if best else None
    breaches: list[str] = []
    goodput = _value(own, "goodput_rps")
    _floor(breaches, goodput, better_ref)
    ttft, tpot = _value(own, "ttft_mean_s"), _value(own, "tpot_mean_s")
    ref_ttft, ref_tpot = _value(best_summary, "ttft_mean_s"), _value(best_summary, "tpot_mean_s")
    _ceiling(breaches, "mean TTFT", ttft, ref_ttft, TTFT_CEILING, best)
    _ceiling(breaches, "mean TPOT", tpot, ref_tpot, TPOT_CEILING, best)
    return InvariantCheck(
        policy=policy,
        best_baseline=best,
        goodput_ratio=_ratio(goodput, better_ref),
        ttft_ratio=_ratio(ttft, ref_ttft),
        tpot_ratio=_ratio(tpot, ref_tpot),
        throughput_ratio=_ratio(
            _value(own, "throughput_tok_s"),
            _value(summaries.get(REFERENCES[0]), "throughput_tok_s"),
        ),
        breaches=tuple(breaches),
    )


def _others(summaries: Mapping[str, Summary]) -> list[str]:
    return [name for name in summaries if name not in OWN_POLICIES]


def _floor(breaches: list[str], goodput: float | None, reference: float | None) -> None:
    if goodput is None or reference is None:
        breaches.append("goodput not measured (policy or reference)")
    elif goodput < GOODPUT_FLOOR * reference:
        ratio = _ratio(goodput, reference)
        breaches.append(f"goodput {ratio:.3f}× the better reference's")


def _ceiling(
    breaches: list[str],
    label: str,
    value: float | None,
    reference: float | None,
    ceiling: float,
    best: str | None,
) -> None:
    if value is None or reference is None:
        breaches.append(f"{label} not measured (policy or best baseline)")
    elif value > ceiling * reference:
        breaches.append(f"{label} {value / reference:.2f}× {best}'s")


def check_seeds(
    policy: str,
    runs: Mapping[str, Sequence[Summary]],
    baselines: Iterable[str] | None = None,
) -> list[InvariantCheck]:
    """``check`` on every seed: ``runs`` maps policy name → its summaries in seed order. A
    seed the policy ran on but a reference did not is checked too, and fails."""
    names = list(baselines) if baselines is not None else None
    checks = []
    for i in range(len(runs.get(policy, ()))):
        seed = {name: series[i] for name, series in runs.items() if i < len(series)}
        checks.append(check(policy, seed, names))
    return checks


def worst(checks: Sequence[InvariantCheck]) -> dict[str, Any]:
    """A cell's record for one policy: its worst ratios over the seeds, every breach
    prefixed by its seed (index in seed order), and how many seeds break it."""

    def pick(key: str, fn: Any) -> float | None:
        values = [v for c in checks if (v := getattr(c, key)) is not None]
        return fn(values) if values else None

    return {
        "goodput_ratio": pick("goodput_ratio", min),
        "ttft_ratio": pick("ttft_ratio", max),
        "tpot_ratio": pick("tpot_ratio", max),
        "throughput_ratio": pick("throughput_ratio", min),
        "best_baselines": sorted({c.best_baseline for c in checks if c.best_baseline}),
        "breaches": [f"seed {i}: {b}" for i, c in enumerate(checks) for b in c.breaches],
        "seeds": len(checks),
        "seeds_breaking": sum(not c.holds for c in checks),
    }
