"""The `sim_check` stage: the simulated launch against the measured one (hand-worked errors, the probe's range, the
cases with nothing to check), run on real metrics files with a real MLflow run, and files that are missing or not
JSON named with what to do. The stage on a real pipeline's outputs: tests/e2e/test_stages_demo.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mlflow import MlflowClient

from asp.config import Params, deep_merge, validate_params
from asp.errors import UserError
from asp.pipeline import sim_check
from asp.steps.launch_check import token_split
from asp.steps.paths import rebase
from asp.tracking import NullTracker, open_tracker

SIMULATED = {  # metrics/simulate.json of a run simulating C0 and C4
    "simulate/enabled": 1,
    "simulate/C4/mean_iteration_time_s": 1.1,
    "simulate/C4/generation_time_mean_s": 1.5,
    "simulate/C4/train_step_mean_s": 0.8,
    "simulate/C4/policy_lag_mean": 2.0,
    "simulate/C4/depth_at_arrival_batches_mean": 0.5,
    "simulate/C4/padding_rate_mean": 0.3,
    "simulate/C4/mean_iteration_time_s_probe_low": 0.95,
    "simulate/C4/mean_iteration_time_s_probe_high": 1.3,
    "simulate/C0/mean_iteration_time_s": 1.6,
}
MEASURED = {  # metrics/launch.json of the C4 launch
    "runtime/summary/mean_iteration_time_s": 1.0,
    "runtime/summary/generation_time_mean_s": 1.25,
    "runtime/summary/train_step_mean_s": 1.0,
    "runtime/summary/policy_lag_mean": 2.5,
    "runtime/summary/depth_at_arrival_batches_mean": 0.0,
    "runtime/summary/wall_s": 200.0,
}


def _params(extra: dict | None = None) -> Params:
    return validate_params(deep_merge(Params.defaults().model_dump(mode="json"), extra or {}))


def test_generation_time_is_split_into_tokens_per_minibatch_and_time_per_token() -> None:
    # measured: 100 tokens/s x 200 s / 40 minibatches = 500 tokens, 1.25 s / 500 = 2.5 ms a token;
    # simulated: 120 x 200 / 40 = 600 tokens (+20 %), 1.5 / 600 = 2.5 ms (+0 %): the lengths, not the time model
    runs = (
        {"tokens_per_s": 100.0, "minibatches": 40.0},
        {"tokens_per_s": 120.0, "wall_s": 200.0, "minibatches": 40.0},
    )
    measured = {**MEASURED, **{f"runtime/summary/{k}": v for k, v in runs[0].items()}}
    simulated = {**SIMULATED, **{f"simulate/C4/{k}": v for k, v in runs[1].items()}}
    out = sim_check.compare("C4", simulated, measured)
    assert out["sim_check/tokens_per_minibatch_measured"] == pytest.approx(500.0)
    assert out["sim_check/tokens_per_minibatch_error"] == pytest.approx(0.2)
    assert out["sim_check/generation_time_per_token_s_simulated"] == pytest.approx(0.0025)
    assert out["sim_check/generation_time_per_token_s_error"] == pytest.approx(0.0)
    assert out["sim_check/max_time_error"] == pytest.approx(0.2)  # not among the goal's three time rows
    table = sim_check.report("C4", out)
    assert "| generated tokens / minibatch | 500 | 600 | +20.0 % |" in table
    assert "| generation time / token (s) | 0.0025 | 0.0025 | +0.0 % |" in table
    # a file without the inputs (an older simulate stage), or no minibatch: no split
    assert "sim_check/tokens_per_minibatch_error" not in sim_check.compare("C4", SIMULATED, measured)
    assert token_split({"runtime/summary/generation_time_mean_s": 1.0, "runtime/summary/tokens_per_s": 0.0,
                        "runtime/summary/wall_s": 5.0, "runtime/summary/minibatches": 0.0}) == {}  # fmt: skip


def test_compare_hand_worked() -> None:
    out = sim_check.compare("C4", SIMULATED, MEASURED)
    # (1.1 - 1) / 1 = +10 %, (1.5 - 1.25) / 1.25 = +20 %, (0.8 - 1) / 1 = -20 %, (2 - 2.5) / 2.5 = -20 %
    assert out["sim_check/mean_iteration_time_s_error"] == pytest.approx(0.1)
    assert out["sim_check/generation_time_mean_s_error"] == pytest.approx(0.2)
    assert out["sim_check/train_step_mean_s_error"] == pytest.approx(-0.2)
    assert out["sim_check/policy_lag_mean_error"] == pytest.approx(-0.2)
    assert out["sim_check/max_time_error"] == pytest.approx(0.2)  # the time rows only
    assert (out["sim_check/generation_time_mean_s_measured"], out["sim_check/generation_time_mean_s_simulated"]) == (
        1.25,
        1.5,
    )
    assert "sim_check/depth_at_arrival_batches_mean_error" not in out  # measured 0: no ratio
    assert out["sim_check/depth_at_arrival_batches_mean_simulated"] == 0.5
    assert "sim_check/padding_rate_mean_error" not in out  # the launch did not report it
    assert out["sim_check/iteration_in_probe_range"] == 1.0  # 1.0 in [0.95, 1.3]
    outside = sim_check.compare("C4", SIMULATED, {**MEASURED, "runtime/summary/mean_iteration_time_s": 0.9})
    assert outside["sim_check/iteration_in_probe_range"] == 0.0
    no_range = {k: v for k, v in SIMULATED.items() if "probe" not in k}
    assert "sim_check/iteration_in_probe_range" not in sim_check.compare("C4", no_range, MEASURED)
    first = list(out)[:3]  # what the stage's one-line summary shows first
    assert first == ["sim_check/checked", "sim_check/max_time_error", "sim_check/iteration_in_probe_range"]
    table = sim_check.report("C4", out)
    assert "| generation time / minibatch (s) | 1.25 | 1.5 | +20.0 % |" in table
    assert "| queue depth at arrival (batches) | 0 | 0.5 | n/a |" in table
    assert "largest error on the time rows: 20.0 % (beyond the 15 % goal)" in table
    assert "inside the range the sharing probe's spread gives" in table


@pytest.mark.parametrize(
    ("fit", "doubts"),
    [
        ({"simulate/gen_fit/probe_clock": 1.05, "simulate/gen_fit/speed_drift": 0.12}, []),  # within 10 % and 15 %
        (
            {"simulate/gen_fit/probe_clock": 0.772, "simulate/gen_fit/speed_drift": 0.12},
            ["ran 0.77x what the profile"],
        ),
        ({"simulate/gen_fit/probe_clock": 1.18}, ["ran 1.18x"]),
        ({"simulate/gen_fit/probe_clock": 0.95, "simulate/gen_fit/speed_drift": 0.2}, ["moved 20 % while"]),
        # the trainer's step timed alone in this sitting: the probe's clock moves no simulated time, the drift does
        (
            {
                "simulate/gen_fit/probe_clock": 0.82,
                "simulate/gen_fit/speed_drift": 0.2,
                "simulate/gen_fit/trainer_alone_s": 0.75,
            },
            ["moved 20 % while"],
        ),  # fmt: skip
        ({}, []),  # a simulate file without the fit's report (simulated trainer, no probe)
    ],
)
def test_an_unsteady_time_model_is_named_beside_the_error(fit: dict, doubts: list[str]) -> None:
    out = sim_check.compare("C4", {**SIMULATED, **fit}, MEASURED)
    kept = ("sim_check/probe_clock", "sim_check/speed_drift", "sim_check/trainer_alone_s")
    assert {k: out[k] for k in out if k in kept} == {
        k.replace("simulate/gen_fit/", "sim_check/"): v for k, v in fit.items()
    }
    found = sim_check.clock_doubts(out, "grpo")
    assert len(found) == len(doubts) and all(want in got for want, got in zip(doubts, found, strict=True))
    simulated_trainer = sim_check.clock_doubts(out, "simulated")  # the clock moves nothing there; drift still counts
    assert len(simulated_trainer) == sum("moved 20 % while" in want for want in doubts)
    table = sim_check.report("C4", out)
    assert ("rest on timings of an unsteady machine" in table) == bool(doubts)
    if doubts:  # what to do, as the simulate stage's warning says it
        assert table.endswith("(dvc repro -f -s profile, then asp simulate probe-sharing), then dvc repro")


def test_beyond_the_goal_with_steady_timings_it_says_to_probe_this_sitting(tmp_path: Path) -> None:
    beyond = sim_check.compare("C4", SIMULATED, MEASURED)  # largest 20 %, no clock doubt
    hint = "the sharing probe in use was timed on 2026-12-07"
    table = sim_check.report("C4", beyond, "2026-12-07")
    assert hint in table and table.endswith("then compare again: asp simulate -c C4")
    assert "its slowdowns (and a GRPO trainer's step alone) are that sitting's" in table
    assert hint not in sim_check.report("C4", beyond)  # no probe in use
    sitting = sim_check.compare("C4", {**SIMULATED, "simulate/gen_fit/trainer_alone_s": 0.8}, MEASURED)
    assert sitting["sim_check/trainer_alone_s"] == 0.8  # the trainer_alone stage timed the step in this sitting
    assert f"{hint}: its slowdowns are that sitting's" in sim_check.report("C4", sitting, "2026-12-07")
    within = sim_check.compare(
        "C4",
        SIMULATED,
        {**MEASURED, "runtime/summary/train_step_mean_s": 0.8, "runtime/summary/generation_time_mean_s": 1.5},
    )
    assert within["sim_check/max_time_error"] <= sim_check.GOAL and hint not in sim_check.report(
        "C4", within, "2026-12-07"
    )
    doubted = sim_check.compare("C4", {**SIMULATED, "simulate/gen_fit/probe_clock": 0.7}, MEASURED)
    assert hint not in sim_check.report("C4", doubted, "2026-12-07")  # the doubt's own advice instead
    # the simulated trainer: the clock moved nothing, so no doubt; the probe gave only slowdowns
    simulated_trainer = sim_check.report("C4", doubted, "2026-12-07", "simulated")
    assert f"{hint}: its slowdowns are that sitting's" in simulated_trainer

    probe = tmp_path / "sharing_probe.json"
    assert sim_check.probe_date(probe, SIMULATED, "C4") is None  # missing: the simulate stage names it
    probe.write_text("{not json")
    assert sim_check.probe_date(probe, SIMULATED, "C4") is None
    probe.write_text(json.dumps({"date": "2026-12-07", "engine": "hf"}))
    assert sim_check.probe_date(probe, SIMULATED, "C4") == "2026-12-07"
    assert sim_check.probe_date(probe, SIMULATED, "C0") is None  # C0 here has no probe range: the probe unused
    assert sim_check.probe_date(probe, {"simulate/gen_fit/probe_clock": 1.0}, "C0") == "2026-12-07"


@pytest.mark.parametrize(
    ("extra", "simulated", "why"),
    [
        ({}, {"simulate/enabled": 0}, "simulate.enabled is false, or the simulate stage skipped"),
        ({"simulate": {"time_model": "h100-qwen3-8b"}}, SIMULATED, "the preset h100-qwen3-8b"),
        ({"runtime": {"condition": "C2"}}, SIMULATED, "the launch ran C2, which simulate.conditions does not"),
        ({"simulate": {"iterations": 20}}, SIMULATED, "simulate.iterations (20) cut the simulated run short"),
    ],
)
def test_nothing_to_check_says_why(extra: dict, simulated: dict, why: str) -> None:
    assert why in (sim_check.nothing_to_check(_params(extra), simulated) or "")


def test_the_same_setting_is_checked() -> None:
    params = _params({"runtime": {"iterations": 20}, "simulate": {"iterations": 20}})
    assert sim_check.nothing_to_check(params, SIMULATED) is None


def test_the_stage_writes_and_logs_the_check(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    paths = rebase(sim_check.Paths(), tmp_path)
    paths.simulate_metrics.parent.mkdir(parents=True)
    paths.simulate_metrics.write_text(json.dumps({**SIMULATED, "simulate/gen_fit/probe_clock": 0.772}))
    paths.launch_metrics.write_text(json.dumps(MEASURED))
    with open_tracker("sim_check", experiment="sim-check-test") as tracker:
        metrics = sim_check.run(_params(), paths, tracker)
        run_id = tracker.run_id
    assert json.loads(paths.metrics.read_text()) == pytest.approx(metrics)
    err = capsys.readouterr().err
    assert "| mean iteration time (s) | 1 | 1.1 | +10.0 % |" in err and "ran 0.77x what the profile's fit" in err
    logged = MlflowClient().get_run(run_id).data
    assert logged.metrics["sim_check/probe_clock"] == pytest.approx(0.772)
    assert logged.metrics["sim_check/train_step_mean_s_error"] == pytest.approx(-0.2)
    assert logged.metrics["sim_check/max_time_error"] == pytest.approx(0.2)
    assert logged.params["runtime.condition"] == "C4"

    with open_tracker("sim_check", experiment="sim-check-test") as tracker:
        skipped = sim_check.run(_params({"runtime": {"condition": "C1"}}), paths, tracker)
    assert skipped == {"sim_check/checked": 0.0} and json.loads(paths.metrics.read_text()) == skipped
    assert "[sim_check] nothing to check: the launch ran C1" in capsys.readouterr().err


def test_missing_or_broken_files_are_named(tmp_path: Path) -> None:
    paths = rebase(sim_check.Paths(), tmp_path)
    with pytest.raises(UserError, match=r"metrics/simulate.json: not found; run the simulate stage first"):
        sim_check.run(_params(), paths, NullTracker())
    paths.simulate_metrics.parent.mkdir(parents=True)
    paths.simulate_metrics.write_text(json.dumps(SIMULATED))
    paths.launch_metrics.write_text("{not json")
    with pytest.raises(UserError, match=r"metrics/launch.json: not JSON .*dvc repro -f -s launch"):
        sim_check.run(_params(), paths, NullTracker())
    assert not paths.metrics.exists()  # nothing written
