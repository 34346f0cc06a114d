"""benchmarks/sim_validation.py's leave-one-out: each kept sync-table run gets full speed fitted on the other three
(the repository's profile timings and sharing probe, four synthetic kept runs that differ only in how slow their
generation calls ran), over repeats too; repeated runs' mean, range and summary line (hand-worked); and a usage
error before anything runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from asp.config import load_params
from tests.sim.test_timemodel import _launch

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def bench(bench_module):
    return bench_module("sim_validation")


def _kept_run(folder: Path, slower: float, n: int) -> None:
    """A kept GRPO run: 40 steps of 16 prompts, 30 calls of one engine between the steps, `slower` x a fixed law."""
    folder.mkdir(parents=True)
    steps = _launch(16, n, seed=0)
    steps["runtime/iteration_time_s"], steps["runtime/train_step_s"] = 10.0, 1.5
    steps.to_parquet(folder / "iterations.parquet")
    longest = np.random.default_rng(1).integers(20, 150, 30)
    pd.DataFrame(
        {
            "gen_s": slower * (0.05 + 0.004 * longest),
            "prompts": 16,
            "responses": 16 * n,
            "tokens": longest * 16 * n // 2,
            "max_length": longest,
            "split_responses": 0,
            "gen_start_s": np.arange(30) * 10.0 + 1.0,  # between the steps: one engine, no trainer beside it
        }
    ).to_parquet(folder / "minibatches.parquet")


def test_each_run_is_fitted_on_the_other_three(bench, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # the pipeline's profile timings and committed sharing probe
    params = load_params(ROOT / "params.yaml")
    n = params.runtime.sampling.n_samples
    slower = {"sync C0": 1.0, "async C0": 2.0, "async C4": 3.0, "async C4 partial": 4.0}
    for name, factor in slower.items():
        _kept_run(tmp_path / name.replace(" ", "_"), factor, n)
    terms = bench.left_out_terms(params, [tmp_path], None)
    assert sorted(terms) == sorted(slower)
    assert terms["sync C0"].note.startswith("fitted on async_C0, async_C4, async_C4_partial: ")
    assert terms["async C4"].note.startswith("fitted on sync_C0, async_C0, async_C4_partial: ")
    # identical calls but for their speed: a pooled least-squares factor is the mean of the others' slowness
    ratio = terms["sync C0"].sharing_factor / terms["async C4 partial"].sharing_factor
    assert ratio == pytest.approx((2 + 3 + 4) / (1 + 2 + 3), rel=1e-3)
    assert terms["async C0"].sharing_factor / terms["async C4"].sharing_factor == pytest.approx(8 / 7, rel=1e-3)


def test_leave_one_out_pools_every_repeat_of_the_other_settings(
    bench, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)
    params = load_params(ROOT / "params.yaml")
    n = params.runtime.sampling.n_samples
    first = {"sync C0": 1.0, "async C0": 2.0, "async C4": 3.0, "async C4 partial": 4.0}
    for name, factor in first.items():
        _kept_run(tmp_path / "a" / name.replace(" ", "_"), factor, n)
        _kept_run(tmp_path / "b" / name.replace(" ", "_"), 5.0, n)  # a second sitting, every call 5 x
    terms = bench.left_out_terms(params, [tmp_path / "a", tmp_path / "b"], None)
    assert terms["sync C0"].note.startswith("fitted on async_C0, async_C4, async_C4_partial (2 repeats each): ")
    # sync C0 left out: (2 + 3 + 4 + 3 x 5) / 6 = 4; partial left out: (1 + 2 + 3 + 3 x 5) / 6 = 3.5
    ratio = terms["sync C0"].sharing_factor / terms["async C4 partial"].sharing_factor
    assert ratio == pytest.approx(4 / 3.5, rel=1e-3)


def test_repeats_give_their_mean_range_and_a_summary(bench) -> None:
    key = "runtime/summary/mean_iteration_time_s"
    runs = [{key: 2.0, "runtime/summary/generation_time_mean_s": 1.0, "runtime/summary/train_step_mean_s": 1.0}]
    runs.append({key: 3.0, "runtime/summary/generation_time_mean_s": 1.0, "runtime/summary/train_step_mean_s": 2.0})
    sim = {key: 2.6, "runtime/summary/generation_time_mean_s": 1.2, "runtime/summary/train_step_mean_s": 1.5}
    assert bench.cell(runs, sim, "mean_iteration_time_s") == "2.5 (2-3) | 2.6 | +4.0 %"
    assert bench.cell(runs[:1], sim, "mean_iteration_time_s") == "2 | 2.6 | +30.0 %"  # one run: no range
    assert bench.cell(None, sim, "mean_iteration_time_s") == "- | 2.6 | -"
    # generation 1.2 against 1.0 (+20 %, outside [1, 1]); iteration and training inside their ranges
    line = bench.within_summary({"sync C0": runs}, {"sync C0": sim})
    assert line == (
        "largest error on iteration, generation and training time: 20.0 %; "
        "simulated inside the range of 2 repeats on 2 of 3 of those cells"
    )
    assert "repeats" not in bench.within_summary({"sync C0": runs[:1]}, {"sync C0": sim})
    # a live run's notes are not averaged
    note = {key: 2.0, "train/eval_accuracy": "not measured: runtime.heldout_problems is 0", "flag": True}
    assert bench.numeric(note) == {key: 2.0}
    assert bench.cell([bench.numeric(note), runs[1]], sim, "mean_iteration_time_s").startswith("2.5 (2-3)")


def test_generation_time_s_two_factors_are_rows(bench) -> None:
    # 1.0 s a minibatch, 50 tokens/s x 10 s / 5 minibatches = 100 tokens, 10 ms a token; simulated 1.2 s, 120 tokens
    base = {"generation_time_mean_s": 1.0, "tokens_per_s": 50.0, "wall_s": 10.0, "minibatches": 5.0}
    run = {f"runtime/summary/{k}": v for k, v in base.items()}
    sim = {**run, "runtime/summary/generation_time_mean_s": 1.2, "runtime/summary/tokens_per_s": 60.0}
    assert bench.cell([run], sim, "tokens_per_minibatch") == "100 | 120 | +20.0 %"  # the lengths
    assert bench.cell([run], sim, "generation_time_per_token_s") == "0.01 | 0.01 | +0.0 %"  # not the time model
    assert "tokens_per_minibatch" in bench.ROWS_SYNC and "generation_time_per_token_s" in bench.ROWS_4B


def test_leave_one_out_without_kept_runs_is_a_usage_error() -> None:
    res = subprocess.run(
        [sys.executable, "benchmarks/sim_validation.py", "--table", "4b", "--leave-one-out"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 2 and "--leave-one-out needs --table sync and --measured-from" in res.stderr
    assert "load average" not in res.stderr and "Traceback" not in res.stderr


def test_a_missing_kept_run_is_named_with_exit_code_2(bench, tmp_path: Path, capsys) -> None:
    """A folder without the kept runs (or a launch without its tables) ends the script as a user error: the file
    and what to do on stderr, exit code 2, no traceback."""
    with pytest.raises(SystemExit) as exc:
        bench.measured_sync(load_params(ROOT / "params.yaml"), "sync_C0", None, [tmp_path / "runs"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"error: {tmp_path / 'runs' / 'sync_C0' / 'metrics.json'}: missing; keep the runs first" in err
    with pytest.raises(SystemExit) as exc:
        bench.launch_tables(tmp_path / "launch")
    assert exc.value.code == 2 and "iterations.parquet: missing; run the launch stage" in capsys.readouterr().err


def test_the_probe_given_is_the_one_the_fit_reads(bench, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--probe FILE`` travels through the functions as the stage's paths (no module state): the fit's note names
    the probe it read, and the next fit without one reads the stage's own again."""
    from dataclasses import replace

    from asp.pipeline import simulate as stage

    monkeypatch.chdir(ROOT)
    params = load_params(ROOT / "params.yaml")
    _kept_run(tmp_path / "launch", 1.0, params.runtime.sampling.n_samples)
    probe = tmp_path / "other_probe.json"
    probe.write_bytes(stage.Paths().sharing_probe.read_bytes())
    given = bench.fitted_terms(params, [tmp_path / "launch"], None, paths=replace(stage.Paths(), sharing_probe=probe))
    assert f"measured slowdowns ({probe})" in given.note
    default = bench.fitted_terms(params, [tmp_path / "launch"], None)
    assert f"measured slowdowns ({stage.Paths().sharing_probe})" in default.note
