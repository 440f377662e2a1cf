"""The side-by-side report holds each Switchyard row against the router overhead goals."""

from __future__ import annotations

from bench.lib.router_sidebyside import Row, Samples, goal_table


def _row(router: str, streams: int, whole_ms: float, first_ms: float, cpu_us: float) -> Row:
    """One run whose routed requests took ``whole_ms`` / ``first_ms`` longer than direct."""
    samples = Samples()
    for k in range(20):
        base = 0.001 + k * 1e-5
        for metric, added in (("whole", whole_ms), ("first", first_ms)):
            samples.add("direct", metric, base)
            samples.add("routed", metric, base + added / 1000)
    return Row(router, streams, samples, load=1.0, stages={}, cpu_us=cpu_us)


def _cells(lines: list[str], router: str, streams: int) -> list[str]:
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        if cells[0] == router and cells[1] == str(streams):
            return cells
    raise AssertionError(f"no row for {router} at {streams}")


def test_a_row_is_judged_on_the_worse_of_whole_and_first_chunk() -> None:
    lines = goal_table(
        [
            _row("switchyard lmetric", 1, 0.30, 0.42, cpu_us=500),
            _row("vllm-router round_robin", 1, 0.20, 0.15, cpu_us=250),
            _row("vllm-router cache_aware", 1, 0.80, 0.90, cpu_us=480),
            _row("python floor round_robin", 1, 0.10, 0.12, cpu_us=200),
        ]
    )
    cells = _cells(lines, "switchyard lmetric", 1)
    assert cells[2] == "+0.42"
    assert cells[3].startswith("met: p50 +0.42 vs +0.50; met: p99")
    assert cells[4] == "missed: p50 +0.42 vs +0.20"
    assert cells[5] == "met: p50 +0.42 vs +0.90"
    assert cells[6] == "+0.30"  # 0.42 over the floor's worse figure, 0.12
    assert cells[7] == "2.5×"
    assert len(lines) == 3  # only Switchyard rows are judged


def test_the_200_stream_goal_and_missing_contenders() -> None:
    lines = goal_table(
        [
            _row("switchyard round_robin", 200, 1.40, 1.10, cpu_us=300),
            _row("switchyard round_robin", 200, 1.60, 1.20, cpu_us=320),
            _row("switchyard round_robin", 200, 1.50, 1.30, cpu_us=310),
            _row("switchyard round_robin", 8, 0.70, 0.60, cpu_us=400),
        ]
    )
    cells = _cells(lines, "switchyard round_robin", 200)
    assert cells[2] == "+1.50"  # the median of the three runs
    assert cells[3] == "missed: p50 +1.50 vs +1.00"
    assert cells[4:] == ["–", "–", "–", "–"]  # neither vllm-router nor the floor was run
    assert _cells(lines, "switchyard round_robin", 8)[3] == "–"  # no goal of its own at 8
