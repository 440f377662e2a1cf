"""One canary's own page: its configuration, its state, and every judgement of the judge
with the evidence it rested on, during the canary (polled by htmx) and after it ended."""

from __future__ import annotations

from typing import Any

from django.http import Http404, HttpRequest, HttpResponse
from django.views.decorators.http import require_GET

from controlplane.models import CanarySplit
from controlplane.selectors.canaries import TimelineRow
from controlplane.services import canaries as canary_service
from controlplane.services import judge
from controlplane.services.errors import NotFound

from . import reads
from .access import viewer_required
from .clusters import get_cluster
from .pages import is_htmx, page

# Enough for hours of a halted canary judged every 10 s; older rows stay in the API.
TIMELINE_ROWS = 500
FINAL_STATES = (
    CanarySplit.State.PROMOTED,
    CanarySplit.State.ROLLED_BACK,
    CanarySplit.State.ABORTED,
)
METRICS = ("ttft", "tpot")
TEST_FIELDS = (
    "n_baseline",
    "n_candidate",
    "median_baseline",
    "median_candidate",
    "effect",
    "p_value",
    "outcome",
)


@viewer_required
@require_GET
def canary_detail(request: HttpRequest, cluster_id: int, canary_id: int) -> HttpResponse:
    cluster = get_cluster(cluster_id)
    try:
        canary = reads.canary_with_policies(canary_id)
    except NotFound as error:
        raise Http404(error.message) from None
    if canary.cluster_id != cluster.pk:
        raise Http404("canary is not on this cluster")
    template = "web/partials/canary_timeline.html" if is_htmx(request) else "web/canary_detail.html"
    return page(
        request, template, cluster=cluster, tab="canary", canary=canary, **timeline_context(canary)
    )


def timeline_context(canary: CanarySplit) -> dict[str, Any]:
    newest = list(reads.judgements(canary.pk).reverse()[:TIMELINE_ROWS])
    rows = [judgement_row(r) for r in reversed(reads.timeline(reversed(newest)))]
    return {
        "rows": rows,
        "chart": chart_series(rows[::-1]),
        "truncated": len(newest) == TIMELINE_ROWS,
        "rollout": reads.canary_audit(canary),
        "polling": canary.state not in FINAL_STATES,
        "expected": expected_view(canary),
    }


def expected_view(canary: CanarySplit) -> dict[str, Any] | None:
    """When the current step's verdict is expected, at the arms' measured sample rates."""
    waiting = judge.expected_verdict(canary)
    if waiting is None:
        return None
    guardrails = canary_service.guardrails_of(canary)
    until_due = max(0.0, guardrails.step_seconds - waiting.step_age_s)
    rates = ", ".join(f"{arm} {rate:.2f}/s" for arm, rate in waiting.rates_per_s.items())
    samples = ", ".join(f"{arm} {n}" for arm, n in waiting.samples.items())
    return {
        "in_s": None if waiting.expected_in_s is None else max(until_due, waiting.expected_in_s),
        "reachable": waiting.wait or waiting.expected_in_s == 0,
        "rates": rates,
        "samples": samples,
        "min_samples": guardrails.min_samples,
        "max_wait_s": guardrails.max_wait_seconds,
    }


def judgement_row(row: TimelineRow) -> dict[str, Any]:
    """A timeline row's newest evidence flattened for the table (tolerates older, thinner
    evidence)."""
    judgement = row.last
    evidence = judgement.evidence if isinstance(judgement.evidence, dict) else {}
    tests = {t.get("metric"): t for t in evidence.get("tests", []) if isinstance(t, dict)}
    arms = evidence.get("arms") or {}
    return {
        "judgement": judgement,
        "first_at": row.first.at,
        "count": row.count,
        "weight": evidence.get("candidate_weight"),
        "requests": " / ".join(
            _number((arms.get(arm) or {}).get("requests")) for arm in ("baseline", "candidate")
        ),
        "tests": [
            {"metric": metric, **{key: (tests.get(metric) or {}).get(key) for key in TEST_FIELDS}}
            for metric in METRICS
        ],
        "guards": [guard_view(g) for g in _guards(evidence.get("guards"))],
        "reasons": evidence.get("reasons") or [],
    }


def _guards(guards: Any) -> list[dict[str, Any]]:
    if isinstance(guards, dict):  # stored before guards carried their limit and outcome
        return [{"name": name, "value": value} for name, value in guards.items()]
    return [g for g in guards or [] if isinstance(g, dict)]


def guard_view(guard: dict[str, Any]) -> dict[str, Any]:
    name, value, limit = str(guard.get("name", "?")), guard.get("value"), guard.get("limit")
    if name.endswith("rate"):  # a ceiling on a share of the candidate's requests
        shown = _percent(value) + (f" (max {_percent(limit)})" if limit is not None else "")
    else:  # min_samples: a floor on the samples of the thinner arm
        shown = _number(value) + (f" (min {_number(limit)})" if limit is not None else "")
    return {"name": name, "shown": shown, "passed": guard.get("passed")}


def _number(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "–"
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:,.3g}"


def _percent(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "–"
    return f"{value * 100:.1f}%"


def chart_series(rows: list[dict[str, Any]]) -> dict[str, list[Any]]:
    """Median TTFT/TPOT per arm at each judgement (rows oldest first), as uPlot columns."""
    series: dict[str, list[Any]] = {"t": [], "weight": []}
    for metric in METRICS:
        series[f"{metric}_baseline"], series[f"{metric}_candidate"] = [], []
    for row in rows:
        series["t"].append(row["judgement"].at.timestamp())
        series["weight"].append(row["weight"])
        for test in row["tests"]:
            for arm in ("baseline", "candidate"):
                series[f"{test['metric']}_{arm}"].append(test.get(f"median_{arm}"))
    return series
