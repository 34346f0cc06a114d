"""benchmarks/learning.py --quick on a toy project (the tiny demo policy, 48 chat-formatted demo prompts, a C4
schedule and predictions of their intended lengths): four real launches (sync C0, async C0, async C4, async C4
with partial rollouts), each with its learning curve; the table, the JSON and the figure are written, the curves
hold the same steps, the baseline's time to its own final reward and its ratio are consistent, and the paired
difference of the baseline to itself is 0. Also the pure statistics by hand."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest
import yaml

from asp.demo.task import generate_problems, intended_length
from asp.schedule import build_schedule, schedule_to_frame
from asp.steps.loaders import load_policy_tokenizer

from .conftest import Built, chat_template, make_params, write_prompts

N = 48


@pytest.fixture
def bench(bench_module):
    return bench_module("learning")


def test_statistics_by_hand(bench) -> None:
    points = [
        {"step": 0, "elapsed_s": 0.0, "reward": 0.5},
        {"step": 5, "elapsed_s": 10.0, "reward": 0.6},
        {"step": 10, "elapsed_s": 30.0, "reward": 0.8},
    ]
    assert bench.time_to(points, 0.7) == pytest.approx(20.0)  # halfway between 10 s and 30 s
    assert bench.time_to(points, 0.4) == 0.0 and math.isnan(bench.time_to(points, 0.9))
    mean, lo, hi = bench.paired_interval([0.1, 0.0, -0.1])
    assert mean == pytest.approx(0.0) and hi == pytest.approx(4.303 * 0.1 / math.sqrt(3))
    assert lo == pytest.approx(-hi)


def _run(seed: int, rewards: list[float], seconds: float) -> dict:
    points = [{"step": 4 * i, "elapsed_s": seconds * i, "reward": r} for i, r in enumerate(rewards)]
    spread = {"prompt_reward_std": 0.3, "batch_reward_std": 0.1, "adv_abs_mean": 0.5, "grad_norm_mean": 1.0}
    spread |= {"grad_norm_std": 0.2, "iteration_time_s": seconds / 4, "lag_mean": 1.0}
    return {"seed": seed, "metrics": {"learning/auc_step": 0.5}, "points": points, "spread": spread}


def test_summary_of_saved_runs(bench, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """--from-json: the table and figure of runs cut short (async C4 ran one seed of two): paired by seed."""
    runs = {
        "sync C0": [_run(0, [0.4, 0.5, 0.6], 10.0), _run(1, [0.4, 0.45, 0.5], 10.0)],
        "async C4": [_run(0, [0.4, 0.6, 0.7], 5.0)],
    }
    saved = tmp_path / "saved.json"
    saved.write_text(json.dumps({"setting": {"iterations": 8}, "runs": runs}))
    png = tmp_path / "fig.png"
    summary = bench.main(["--from-json", str(saved), "--plot", str(png)])
    c4, sync = summary["async C4"], summary["sync C0"]
    assert c4["seeds"] == [0] and sync["seeds"] == [0, 1]
    assert c4["diff_vs_sync"][0] == pytest.approx(0.1) and math.isnan(c4["diff_vs_sync"][1])  # one pair: no interval
    assert c4["time_to_target_s"][0] == pytest.approx(5.0)  # sync's final 0.6, reached by C4 at its 2nd point
    assert c4["ratio"][0] == pytest.approx(5.0 / 20.0) and sync["ratio"][0] == pytest.approx(1.0)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| … its ratio to sync's | 1.00 ± 0.00 | 0.25 |" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.extended
def test_quick_run_writes_table_json_and_figure(
    bench, demo_policy: Built, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    root = tmp_path / "project"
    (root / "outputs").mkdir(parents=True)
    (root / "outputs/policy").symlink_to(demo_policy.paths.out_dir.resolve())
    template = chat_template(load_policy_tokenizer(root / "outputs/policy"))
    records = generate_problems(N, seed=11)
    roles = {"train": list(range(N)), "profile": [0, 1, 2, 3], "heldout": [4, 5]}
    ids = write_prompts(root / "outputs/prompts", records, roles, template)["train"]["prompt_id"].to_numpy()
    lengths = [float(intended_length(r)) for r in records]
    pd.DataFrame({"prompt_id": ids, "predicted_length": lengths}).to_parquet(root / "outputs/predictions.parquet")
    sched = build_schedule(ids, lengths, b=4, kappa=0, k=2, iterations=200_000, seed=0, method="asp")
    (root / "outputs/schedule").mkdir()
    schedule_to_frame(sched).to_parquet(root / "outputs/schedule/schedule.parquet", index=False)
    runtime = {
        "sampling": {"n_samples": 2, "max_new_tokens": 12},
        "ray": {"actor_num_cpus": 0.25, "placement": "none"},
    }
    params = make_params({"runtime": {**runtime, "memory": {"check": False}, "grpo": {"lr": 1e-3}}})
    (root / "params.yaml").write_text(yaml.safe_dump(params.model_dump(mode="json")))
    monkeypatch.chdir(root)

    out, png = tmp_path / "learning.json", tmp_path / "learning.png"
    summary = bench.main(["--quick", "--root", str(root), "--json", str(out), "--plot", str(png)])
    printed = capsys.readouterr().out
    assert "| final held-out reward |" in printed and "| time to sync's final reward (s) |" in printed
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    data = json.loads(out.read_text())
    assert list(data["runs"]) == list(bench.CONDITIONS) and all(len(r) == 1 for r in data["runs"].values())
    for runs in data["runs"].values():
        assert [p["step"] for p in runs[0]["points"]] == [0, 2, 4]
    sync = summary["sync C0"]
    assert sync["diff_vs_sync"][0] == 0.0 and sync["time_to_target_s"][0] <= sync["run_s"][0]
    assert sync["ratio"][0] == pytest.approx(1.0) or sync["time_to_target_s"][0] == 0  # 0: reached at step 0
    assert not (root / "plots").exists() and not (root / "metrics").exists()  # nothing written into the project
