"""LMetric's hotspot detector in a replay: a small ramped burst on one shared prefix.

4 instances; background of private 600-token prompts at 2 req/s; from t = 10 s a class
of requests sharing a 4096-token prefix (32-token suffixes) ramps up to 6 req/s over
10 s. The prefix lands on one instance and the product keeps the class there (P-token
is its suffix), so the ratio test fails once the class outnumbers its holders' share,
2·|M| more placements on M confirm it, and the fallback sends the class elsewhere until
the grown M passes the ratio test again. The exact sequence is pinned: a change to the
score, the detector or the simulator that moves it must be looked at.
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


def test_the_detector_suspects_confirms_falls_back_and_clears_in_order():
    result = run(DETECTOR)
    sequence = [(e.kind, e.x, e.x_bar, e.m, e.m_bar, e.instances) for e in result.hotspot_log]
    assert sequence == [
        ("suspected", 8, 21, 1, 3, ("i1",)),
        ("confirmed", 10, 21, 1, 3, ("i1",)),
        ("cleared", 12, 21, 2, 2, ("i1", "i3")),
        ("suspected", 22, 21, 2, 2, ("i1", "i3")),
        ("confirmed", 26, 21, 2, 2, ("i1", "i3")),
        ("cleared", 28, 21, 3, 1, ("i1", "i2", "i3")),
    ]
    times = [e.time for e in result.hotspot_log]
    assert times == sorted(times) and BURST.at_s < times[0] < BURST.at_s + BURST.duration_s
    # each confirmation needed 2·|M| placements on M by the product
    assert [
        (e.confirmations, e.confirmations_needed)
        for e in result.hotspot_log
        if e.kind == "confirmed"
    ] == [(2, 2), (4, 4)]
    assert result.decision_reasons["hotspot_fallback"] == 2


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
