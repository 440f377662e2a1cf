"""DualMap's queued-request migration in the replay simulator: a forced hotspot makes it
move requests, and every moved request completes exactly once."""

from __future__ import annotations

import pytest

from enginesim.replay.simulator import SimConfig, SimResult, Simulator
from tests.replay.helpers import hotspot


def replay(migrate: bool) -> tuple[Simulator, SimResult]:
    config = SimConfig(
        instances=4,
        scrape_interval_s=0.5,
        policy_params={"dualmap": {"slo_ttft_s": 1.0, "migrate_queued": migrate}},
    )
    sim = Simulator(hotspot(), "dualmap", config)
    return sim, sim.run()


@pytest.fixture(scope="module")
def migrated():
    return replay(True)


def test_a_hotspot_makes_dualmap_migrate_queued_requests(migrated):
    _, result = migrated
    assert result.migrations > 0
    assert result.decision_reasons["migration"] == result.migrations
    _, quiet = replay(False)
    assert quiet.migrations == 0 and "migration" not in quiet.decision_reasons


def test_migrated_requests_complete_exactly_once(migrated):
    sim, result = migrated
    assert sorted(r.id for r in result.requests) == sorted(f"r{k}" for k in range(60))
    for request in result.requests:
        assert request.status == "ok"
        assert request.output_tokens == request.output_tokens_asked == 20
        assert request.arrival_s < request.first_token_s <= request.finish_s
    stats = [i.engine.stats() for i in sim.instances]
    # each migration is one abort (a finish with no token) plus the one real completion
    assert sum(s.num_finished for s in stats) == len(result.requests) + result.migrations
    assert sum(s.generation_tokens for s in stats) == 20 * len(result.requests)
    assert not sim.flights
    for router in sim.routers:  # the router's accounting is back to zero
        view = router.state.view()
        assert view.in_flight.sum() == 0 and abs(view.pending_prefill).sum() < 1e-9
