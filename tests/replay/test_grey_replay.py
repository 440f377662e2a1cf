"""Grey failures in replay: an engine slowed mid-run (the ``slow`` fault) is found and
drained by the live router's detector, run by the simulator; a fleet heterogeneous by
design is not flagged. The router-side detector itself: tests/routing/test_grey.py."""

from __future__ import annotations

import pytest

from enginesim.engine.fleet import FleetVariation
from enginesim.replay.simulator import Fault, SimConfig, Simulator
from enginesim.replay.traces import TraceRecord
from router_worker.routing.grey import GreyParams, GreyState

SIZE, RATE, SECONDS = 8, 2.0, 480  # about 2 requests a second per instance
SLOW_AT = 200.0


def _steady() -> list[TraceRecord]:
    every = 1.0 / (RATE * SIZE)
    return [TraceRecord(k, k * every, 600, 64) for k in range(int(SECONDS / every))]


def _share(results, start: float, end: float, instance: str) -> float:
    window = [r for r in results if start <= r.arrival_s < end]
    return sum(r.instance == instance for r in window) / len(window)


@pytest.mark.parametrize("grey", [True, False])
def test_slowed_engine_is_found_and_drained(grey):
    config = SimConfig(
        instances=SIZE,
        faults=(Fault(SLOW_AT, 3, "slow", 3.0),),
        grey=GreyParams(enabled=True) if grey else None,
    )
    run = Simulator(_steady(), "round_robin", config).run()
    assert all(r.status == "ok" for r in run.requests)
    assert _share(run.requests, 0, SLOW_AT, "i3") == pytest.approx(1 / SIZE, abs=0.01)
    after = _share(run.requests, SLOW_AT + 60, SECONDS, "i3")
    if not grey:
        assert run.grey_log == [] and after == pytest.approx(1 / SIZE, abs=0.01)
        return
    changes = [(c.instance, c.after) for c in run.grey_log]
    assert ("i3", GreyState.DRAINED) in changes
    assert {c.instance for c in run.grey_log} == {"i3"}
    degraded = next(c.at for c in run.grey_log if c.after is GreyState.DEGRADED)
    assert degraded - SLOW_AT <= 30  # found within 30 s at 2 requests a second
    assert after < 0.2 / SIZE  # probes only


def test_slow_then_restore_is_probed_back():
    faults = (Fault(SLOW_AT, 3, "slow", 3.0), Fault(SLOW_AT + 120, 3, "restore"))
    config = SimConfig(instances=SIZE, faults=faults, grey=GreyParams(enabled=True))
    run = Simulator(_steady(), "round_robin", config).run()
    last = [c for c in run.grey_log if c.instance == "i3"][-1]
    assert (last.after, last.cause) == (GreyState.HEALTHY, "probes_good")
    assert _share(run.requests, SECONDS - 60, SECONDS, "i3") == pytest.approx(1 / SIZE, abs=0.01)


def test_heterogeneous_fleet_is_not_flagged():
    speeds = (1.0,) * 4 + (0.7,) * 2 + (0.5,) * 2  # mixed GPUs, by design
    config = SimConfig(
        instances=SIZE,
        grey=GreyParams(enabled=True),
        variation=FleetVariation(speeds=speeds, step_jitter=0.1, seed=3),
    )
    run = Simulator(_steady(), "round_robin", config).run()
    assert [c for c in run.grey_log if c.routing] == []


def test_slow_fault_spec_is_checked():
    assert Fault.parse("slow", "3@600x2.5") == Fault(600.0, 3, "slow", 2.5)
    for bad in ("3@600", "3@600x0", "3@x2", "x@600x2"):
        with pytest.raises(ValueError, match="INSTANCE@SECONDSxFACTOR"):
            Fault.parse("slow", bad)


@pytest.mark.parametrize("continuations", [0, 2])
def test_streams_on_a_killed_engine_are_continued(continuations):
    records = _steady()[: int(120 * RATE * SIZE)]
    config = SimConfig(
        instances=SIZE, faults=(Fault(60.0, 3, "fail"),), max_continuations=continuations
    )
    results = Simulator(records, "round_robin", config).run().requests
    cut = [r for r in results if r.attempts > 1 and r.first_token_s is not None]
    failed = [r for r in results if r.status == "failed"]
    if not continuations:
        assert failed and not cut
        return
    assert not failed and cut  # every stream on i3 was continued, none lost
    assert all(r.status == "ok" for r in results)
    assert all(r.output_tokens == r.output_tokens_asked for r in results)
    for r in cut:  # started on i3, finished elsewhere after its death
        assert r.instance != "i3" and r.first_token_s is not None and r.finish_s is not None
        assert r.first_token_s < 60.0 < r.finish_s
