"""The enginesim ``replay`` command end to end on a slice of a real trace."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from enginesim.__main__ import main
from enginesim.replay.metrics import SUMMARY_KEYS
from tests.replay.helpers import CONVERSATION

REQUEST_KEYS = {
    "id",
    "arrival_s",
    "instance",
    "prompt_tokens",
    "cached_tokens",
    "output_tokens",
    "first_token_s",
    "finish_s",
}


def test_replay_cli_writes_results_requests_and_plots(tmp_path, capsys):
    out = tmp_path / "out"
    code = main(
        [
            "replay",
            "--trace",
            str(CONVERSATION),
            "--instances",
            "4",
            "--max-requests",
            "60",
            "--max-model-len",
            "131072",
            "--policy",
            "lmetric",
            "--policy",
            "round_robin",
            "--rate-scale",
            "2",
            "--seed",
            "5",
            "--no-progress",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    summaries = json.loads((out / "results.json").read_text())
    assert [s["policy"] for s in summaries] == ["lmetric", "round_robin"]
    for summary in summaries:
        assert set(SUMMARY_KEYS) <= summary.keys()
        assert summary["requests"] == summary["completed"] == 60
        lines = (out / summary["policy"] / "requests.jsonl").read_text().splitlines()
        assert len(lines) == 60
        assert json.loads(lines[0]).keys() >= REQUEST_KEYS
        assert (out / summary["policy"] / "pending.png").stat().st_size > 1000
    assert (out / "ttft_cdf.png").stat().st_size > 1000
    printed = capsys.readouterr().out
    assert "lower_bound" in printed and "round_robin" in printed
    bound = json.loads((out / "lower_bound.json").read_text())
    assert bound["ttft_mean_s"] <= min(s["ttft_mean_s"] for s in summaries)


def test_policy_all_expands_to_every_registered_policy():
    from enginesim.replay.cli import policies_from_args
    from router_worker.routing import REGISTRY

    assert policies_from_args(["all"]) == list(REGISTRY)
    assert policies_from_args(["lmetric", "all"])[0] == "lmetric"


def test_same_seed_same_files_across_processes(tmp_path):
    """Determinism must not hinge on one interpreter's string-hash seed, nor on running
    the policies one after another or in parallel processes (``--jobs``)."""
    outputs = []
    for hash_seed, jobs in (("1", "1"), ("2", "2")):
        out = tmp_path / f"run{hash_seed}"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "enginesim",
                "replay",
                "--trace",
                str(CONVERSATION),
                "--instances",
                "4",
                "--max-requests",
                "80",
                "--max-model-len",
                "131072",
                "--policy",
                "dualmap",
                "--policy",
                "smetric",
                "--seed",
                "11",
                "--jobs",
                jobs,
                "--no-plots",
                "--no-progress",
                "--out",
                str(out),
            ],
            check=True,
            capture_output=True,
            env={**os.environ, "PYTHONHASHSEED": hash_seed},
        )
        outputs.append([(out / p / "requests.jsonl").read_text() for p in ("dualmap", "smetric")])
    assert outputs[0] == outputs[1]


def test_jobs_below_one_is_refused_before_any_work(tmp_path):
    with pytest.raises(SystemExit, match="--jobs must be at least 1"):
        main(["replay", "--trace", str(CONVERSATION), "--jobs", "0", "--out", str(tmp_path)])
    assert not any(tmp_path.iterdir())


def _replay(out, *extra: str) -> int:
    return main(
        [
            "replay",
            "--trace",
            str(CONVERSATION),
            "--instances",
            "4",
            "--max-requests",
            "40",
            "--max-model-len",
            "131072",
            "--policy",
            "round_robin",
            "--seed",
            "2",
            "--no-plots",
            "--no-progress",
            "--out",
            str(out),
            *extra,
        ]
    )


def test_replay_cli_fleet_variation_records_each_instances_hardware(tmp_path, capsys):
    varied = ("--mixed-gpu", "h100@3", "--speeds", "0.5@1", "--step-jitter", "0.1")
    assert _replay(tmp_path / "varied", *varied, "--perturb", "0.2") == 0
    assert "# fleet variation: GPUs 3× h20, 1× h100; speeds 0.5@1" in capsys.readouterr().out
    assert _replay(tmp_path / "uniform") == 0
    (summary,) = json.loads((tmp_path / "varied" / "results.json").read_text())
    fleet = summary["fleet"]
    assert fleet["nominal_gpu"] == "h20"
    instances = fleet["instances"]
    assert [i["instance"] for i in instances] == ["i0", "i1", "i2", "i3"]
    assert [i["gpu"] for i in instances] == ["h20", "h20", "h20", "h100"]
    assert [i["speed"] for i in instances] == [1.0, 0.5, 1.0, 1.0]
    assert {i["step_jitter"] for i in instances} == {0.1}
    assert len({i["coefficients"]["t_fixed"] for i in instances}) == 4
    (uniform,) = json.loads((tmp_path / "uniform" / "results.json").read_text())
    assert "fleet" not in uniform
    requests = [
        (tmp_path / run / "round_robin" / "requests.jsonl").read_text()
        for run in ("varied", "uniform")
    ]
    assert requests[0] != requests[1]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--speeds", "1,1,0.5"), "--speeds: 3 values for 4 instances"),
        (("--speeds", "0.5@4"), "--speeds: instance 4 does not exist"),
        (("--speeds", "1,0,1,1"), "argument --speeds: speed must be a positive number, got '0'"),
        (("--speeds", "quick@1"), "argument --speeds: speed 'quick' is not a number"),
        (("--mixed-gpu", "x100@1"), "argument --mixed-gpu: unknown GPU 'x100'"),
        (("--perturb", "1.5"), r"--perturb must be in [0, 1), got 1.5"),
        (("--step-jitter", "-1"), "--step-jitter must be >= 0, got -1"),
    ],
)
def test_replay_cli_refuses_bad_fleet_specs_before_any_work(tmp_path, capsys, flags, message):
    with pytest.raises(SystemExit) as exit_info:
        _replay(tmp_path / "out", *flags)
    code = exit_info.value.code
    said = capsys.readouterr().err if code == 2 else str(code)  # argparse's, or ours
    assert message in said
    assert not (tmp_path / "out").exists()
