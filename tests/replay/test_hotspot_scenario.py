"""LMetric's hotspot detector in a replay: a small ramped burst on one shared prefix.

4 instances; background of private 600-token prompts at 2 req/s; from t = 10 s a class
of requests sharing a 4096-token prefix (32-token suffixes) ramps up to 6 req/s over
10 s. The prefix lands on one instance and the product keeps the class there (P-token
is its suffix), so the ratio test fails once the class outnumbers its holders' share,
2·|M| more placements on M confirm it, and the fallback sends the class elsewhere until
the grown M passes the ratio test again. The tests check what the detector's rules
require of such a run, not the numbers of one run.
"""

from __future__ import annotations

from enginesim.replay.simulator import SimConfig, SimResult, Simulator
from enginesim.replay.synth import BurstParams, hotspot_burst
from enginesim.replay.traces import TraceRecord

BURST = BurstParams(
    at_s=10.0,
    duration_s=20.0,
    burst_rate=6.0,
    prefix_tokens=4096,
    suffix_tokens=32,
    output_tokens=300,
    ramp_s=10.0,
    seed=1,
)
DETECTOR = {"hotspot": {"window_s": 10.0, "min_class_requests": 4}}


def run(params: dict) -> SimResult:
    background = [TraceRecord(i, 0.5 * i, 600, 20) for i in range(120)]
    records = hotspot_burst(background, BURST)
    config = SimConfig(instances=4, policy_params={"lmetric": params}, seed=1)
    return Simulator(records, "lmetric", config).run()


def fails_ratio_test(e) -> bool:
    """The class cannot be a hotspot when x/x̄ ≤ m/m̄ (tested as x·m̄ ≤ x̄·m)."""
    return e.x * e.m_bar > e.x_bar * e.m


def test_the_detector_suspects_confirms_falls_back_and_clears_in_order():
    """What the detector's rules require of any run of this burst (router_worker/routing/
    hotspot.py), not the numbers of one run: a hotspot is suspected and confirmed only
    while the ratio test fails, confirmed by 2·m placements on M, cleared once the grown
    M passes it, every event of the one burst class, M and the other instances covering
    the four."""
    result = run(DETECTOR)
    log = result.hotspot_log
    kinds = [e.kind for e in log]
    assert kinds[:3] == ["suspected", "confirmed", "cleared"]  # at least one whole cycle
    cycles = " ".join(kinds).replace("suspected confirmed cleared", "cycle")
    assert set(cycles.replace("suspected dismissed", "cycle").split()) == {"cycle"}, kinds
    assert len({e.class_id for e in log}) == 1  # the burst's shared prefix, nothing else
    assert all(e.prefix_tokens >= 4096 - 16 for e in log)  # its full blocks, at least
    for e in log:
        assert (e.m, e.m + e.m_bar) == (len(e.instances), 4), e
    for e in (e for e in log if e.kind in ("suspected", "confirmed")):
        assert fails_ratio_test(e) and e.x >= DETECTOR["hotspot"]["min_class_requests"], e
    for e in (e for e in log if e.kind == "cleared"):
        assert not fails_ratio_test(e) or e.x == 0, e
    for i in (i for i, e in enumerate(log) if e.kind == "confirmed"):
        suspected, confirmed, cleared = log[i - 1 : i + 2]
        assert (confirmed.confirmations, confirmed.confirmations_needed) == (
            2 * suspected.m,
            2 * suspected.m,
        )
        assert confirmed.instances == suspected.instances  # placed on M, which held
        assert set(confirmed.instances) < set(cleared.instances)  # fallbacks grew M
    times = [e.time for e in log]
    assert times == sorted(times) and BURST.at_s < times[0] < BURST.at_s + BURST.duration_s
    # each confirmed hotspot sent at least one request elsewhere before it cleared
    confirmed_count = kinds.count("confirmed")
    assert confirmed_count <= result.decision_reasons["hotspot_fallback"]


def test_fallback_requests_go_outside_the_hot_set():
    result = run(DETECTOR)
    confirmed = [e for e in result.hotspot_log if e.kind == "confirmed"]
    cleared = [e for e in result.hotspot_log if e.kind == "cleared"]
    # the instance a fallback request went to is the one that joins M at the clear
    for hot, clear in zip(confirmed, cleared, strict=True):
        joined = set(clear.instances) - set(hot.instances)
        assert len(joined) == 1 and not joined & set(hot.instances)


def test_without_the_detector_no_event_and_no_fallback():
    result = run({**DETECTOR, "hotspot": {**DETECTOR["hotspot"], "enabled": False}})
    assert result.hotspot_log == [] and "hotspot_fallback" not in result.decision_reasons
