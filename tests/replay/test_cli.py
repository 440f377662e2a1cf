"""``python -m enginesim replay`` end to end on a slice of a real trace."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from enginesim.__main__ import main
from enginesim.replay.metrics import SUMMARY_KEYS
from tests.replay.conftest import CONVERSATION

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
