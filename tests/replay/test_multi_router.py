"""Several routers on one fleet in the simulator: each keeps its own view, the balancer
spreads arrivals, replica sync shares dispatches, and arrivals in one timestamp bucket
are spread over it."""

from __future__ import annotations

import pytest

from enginesim.replay.simulator import SimConfig, Simulator
from enginesim.replay.traces import TraceRecord, spread_ties


def _private(index: int, arrival: float, tokens: int = 8000) -> TraceRecord:
    """A prompt shared with no other request (its own hash ids)."""
    blocks = tokens // 512
    return TraceRecord(
        index, arrival, tokens, 20, tuple(range(index * 100, index * 100 + blocks)), 512
    )


def _instances(config: SimConfig, records: list[TraceRecord]) -> list[str | None]:
    return [r.instance for r in Simulator(records, "least_load", config).run().requests]


def test_two_routers_without_sync_herd_and_with_sync_spread():
    """Requests 1 ms apart, one to each router: without replica sync the second router
    cannot know the first one's request and picks the same idle instance; with it (a
    0.1 ms peer hop) it sees the busy one and picks another, as one router would."""
    records = [_private(0, 0.0), _private(1, 0.001)]
    base = SimConfig(instances=2, routers=2, scrape_interval_s=0, seed=1)
    one = _instances(SimConfig(instances=2, scrape_interval_s=0, seed=1), records)
    blind = _instances(base, records)
    synced = _instances(
        SimConfig(**{**base.__dict__, "replica_sync": True, "replica_sync_delay_s": 0.0001}),
        records,
    )
    assert one[0] != one[1]
    assert blind[0] == blind[1]
    assert synced[0] != synced[1]


def test_peer_requests_leave_the_peers_view_when_they_end():
    records = [_private(k, k * 0.01) for k in range(6)]
    config = SimConfig(instances=3, routers=2, replica_sync=True, replica_sync_delay_s=0.002)
    sim = Simulator(records, "lmetric", config)
    result = sim.run()
    assert all(r.status == "ok" for r in result.requests)
    for router in sim.routers:  # everything a router accounted (own and peer) was removed
        assert router.state.pending.sum() == pytest.approx(0.0)
        assert router.state.in_flight.sum() == 0
        assert router.state.decoding.sum() == 0


def test_balancer_spreads_round_robin_and_by_session():
    records = [
        TraceRecord(k, k * 0.5, 600, 5, (k,), 512, session_id=f"s{k % 3}") for k in range(12)
    ]
    for spread in ("round_robin", "session", "random"):
        sim = Simulator(
            records, "round_robin", SimConfig(instances=2, routers=3, router_spread=spread, seed=4)
        )
        routed: list[tuple[str | None, int]] = []
        original = sim._dispatch

        def spy(flight, tokens=None, routed=routed, original=original):
            routed.append((flight.record.session_id, flight.router))
            original(flight, tokens)

        sim._dispatch = spy  # type: ignore[method-assign]  # a spy around the dispatch
        sim.run()
        if spread == "round_robin":
            assert [router for _, router in routed] == [k % 3 for k in range(12)]
        elif spread == "session":  # sticky: one router per session
            assert all(
                len({r for s, r in routed if s == session}) == 1 for session in ("s0", "s1", "s2")
            )
        else:
            assert len({router for _, router in routed}) > 1


@pytest.mark.parametrize("bad", [{"routers": 0}, {"router_spread": "least_conn"}])
def test_bad_router_settings_are_refused(bad):
    with pytest.raises(ValueError, match="router"):
        SimConfig(**bad)


def test_spread_ties_moves_bucketed_arrivals_within_their_bucket():
    records = [TraceRecord(k, 3.0 * (k // 4), 100, 5) for k in range(12)]
    spread = spread_ties(records, seed=2)
    times = [r.arrival_s for r in spread]
    assert times == sorted(times) and len(set(times)) == 12
    assert [r.index for r in spread] == list(range(12))
    for bucket in range(3):
        inside = [t for t in times if 3.0 * bucket <= t < 3.0 * (bucket + 1)]
        assert len(inside) == 4
    assert spread_ties(records, seed=2) == spread
