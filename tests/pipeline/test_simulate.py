"""The `simulate` stage and `asp simulate` on synthetic pipeline outputs (predictions, held-out profile samples,
profile timings, a schedule) written directly: metrics per condition, files, determinism, and the bad inputs the
issue names (negative times, zero actors, a schedule that does not match the predictions) exit 2 naming them."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from asp.config import Params, deep_merge, validate_params
from asp.errors import UserError
from asp.pipeline import simulate
from asp.schedule import build_schedule, schedule_to_frame
from asp.sim.inputs import MAX_DRAWN_VISITS
from asp.steps.launch_check import launch_errors
from asp.steps.paths import rebase
from asp.tracking import NullTracker
from tests.inprocess import run_asp as _asp  # in this process unless process=True

N_TRAIN, N_HELDOUT, N_SAMPLES, CAP = 480, 120, 4, 96
OVERLAY = {
    "profile": {"max_new_tokens": CAP, "n_samples": N_SAMPLES},
    "schedule": {"b": 8, "kappa": 1, "k": 3, "iterations": 2000},
    "runtime": {
        "iterations": 20,
        "global_batch_prompts": 16,
        "sampling": {"n_samples": N_SAMPLES, "max_new_tokens": CAP},
        "queue": {"q_max": 48},
        "ray": {"actors_per_unit": 3},
        "trainer": {"kind": "simulated", "step_s": 0.4},
    },
    "simulate": {"conditions": ["C0", "C4"], "sharing": "processor"},  # measured: its own test below
}


def _params(extra: dict | None = None) -> Params:
    return validate_params(deep_merge(deep_merge(Params.defaults().model_dump(mode="json"), OVERLAY), extra or {}))


def write_inputs(root: Path, params: Params) -> simulate.Paths:
    """Predictions for train + held-out prompts, held-out samples around the true lengths, timings of
    16-prompt minibatches that follow a static-batching law, and the C4 schedule of the predictions."""
    rng = np.random.default_rng(0)
    ids = [f"p{i:04d}" for i in range(N_TRAIN + N_HELDOUT)]
    true = rng.lognormal(3.3, 0.5, len(ids)).clip(4, CAP * 0.9)
    predicted = true * rng.lognormal(0, 0.15, len(ids))
    preds = pd.DataFrame({"prompt_id": ids, "predicted_length": predicted, "calibrated_length": predicted})
    heldout = ids[N_TRAIN:]
    lengths = (true[N_TRAIN:, None] * rng.lognormal(0, 0.2, (N_HELDOUT, N_SAMPLES))).round().clip(1, CAP)
    samples = pd.DataFrame(
        {"prompt_id": np.repeat(heldout, N_SAMPLES), "sample": np.tile(np.arange(N_SAMPLES), N_HELDOUT)}
    ).assign(length=lengths.reshape(-1).astype(int))
    mx = rng.integers(20, CAP, 40)
    timings = pd.DataFrame(
        {
            "minibatch": np.arange(40),
            "wall_s": 0.05 + 0.004 * mx + rng.normal(0, 0.005, 40).clip(-0.02, 0.02),
            "num_prompts": 16,
            "n": N_SAMPLES,
            "max_new_tokens": CAP,
            "total_tokens": (mx * 16 * N_SAMPLES * 0.5).astype(int),
            "max_length": mx,
            "prompt_tokens": 16 * 30,
        }
    )
    paths = simulate.Paths(
        predictions=root / "predictions.parquet",
        calibration=root / "calibration.json",  # absent: raw predictions are the loads
        samples=root / "profile/samples.parquet",
        heldout=root / "prompts/heldout.parquet",
        timings=root / "m/profile_timings.csv",
        schedule=root / "schedule/schedule.parquet",
        out_dir=root / "simulate",
        trainer_alone=root / "m/trainer_alone.json",  # absent: the probe's step on the profile's clock
        metrics=root / "m/simulate.json",
        plot=root / "p/timeline.png",
    )
    for d in ("profile", "prompts", "m", "schedule"):
        (root / d).mkdir(parents=True, exist_ok=True)
    preds.to_parquet(paths.predictions, index=False)
    samples.to_parquet(paths.samples, index=False)
    pd.DataFrame({"prompt_id": heldout}).to_parquet(paths.heldout, index=False)
    timings.to_csv(paths.timings, index=False)
    s = params.schedule
    sched = build_schedule(
        preds.prompt_id.to_numpy(),
        predicted,
        b=s.b,
        kappa=s.kappa,
        k=s.k,
        iterations=s.iterations,
        seed=0,
        method="asp",
    )
    schedule_to_frame(sched).to_parquet(paths.schedule, index=False)
    return paths


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Params, simulate.Paths]:
    params = _params()
    return params, write_inputs(tmp_path_factory.mktemp("sim"), params)


def test_stage_writes_metrics_per_condition_and_is_deterministic(inputs: tuple[Params, simulate.Paths]) -> None:
    params, paths = inputs
    metrics = simulate.run(params, paths, NullTracker())
    assert metrics["simulate/gen_fit/r2_heldout"] > 0.9  # the timings follow a linear law in max_length
    for cond in ("C0", "C4"):
        assert metrics[f"simulate/{cond}/mean_iteration_time_s"] >= params.runtime.trainer.step_s
        assert 0 <= metrics[f"simulate/{cond}/padding_rate_mean"] < 1
    # the balanced schedule pads less than the original order, as the scheduler promises
    assert metrics["simulate/C4/padding_rate_mean"] < metrics["simulate/C0/padding_rate_mean"]
    assert json.loads(paths.metrics.read_text()) == pytest.approx(metrics)
    frame = pd.read_parquet(paths.out_dir / "iterations.parquet")
    assert sorted(frame.condition.unique()) == ["C0", "C4"] and len(frame) == 2 * params.runtime.iterations
    models = json.loads((paths.out_dir / "models.json").read_text())
    assert set(models) == {"generation", "lengths", "training", "prompt_tokens"}
    assert paths.plot.stat().st_size > 10_000
    first = (paths.out_dir / "models.json").read_bytes(), frame
    again = simulate.run(params, paths, NullTracker())
    assert again == metrics and (paths.out_dir / "models.json").read_bytes() == first[0]


def test_a_profile_timed_while_the_machine_slowed_is_flagged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    params = _params()
    paths = write_inputs(tmp_path, params)
    metrics = simulate.run(params, paths, NullTracker())
    assert metrics["simulate/gen_fit/speed_drift"] < 0.1 and "speed moved" not in capsys.readouterr().err
    timings = pd.read_csv(paths.timings)
    timings.loc[20:, "wall_s"] *= 1.4  # the machine 40 % slower for the second half of the profile
    timings.to_csv(paths.timings, index=False)
    metrics = simulate.run(params, paths, NullTracker())
    assert metrics["simulate/gen_fit/speed_drift"] > 0.15
    err = capsys.readouterr().err
    assert f"[simulate] warning: {paths.timings}: the machine's speed moved by " in err
    assert "dvc repro -f -s profile" in err


def test_drift_warning_names_the_file_and_the_drift() -> None:
    assert simulate.drift_warning({"speed_drift": 0.1}, Path("m/t.csv")) is None
    assert simulate.drift_warning({}, Path("m/t.csv")) is None  # a preset: no profile fit
    warning = simulate.drift_warning({"speed_drift": 0.17}, Path("m/t.csv"))
    assert warning is not None and warning.startswith("warning: m/t.csv: the machine's speed moved by 17 % ")


def test_probe_clock_warning_names_the_probe_and_the_factor() -> None:
    probe = Path("m/p.json")
    for report in ({}, {"probe_clock": 1.08}, {"probe_clock": 0.91}):  # no probe anchor, or a few per cent apart
        assert simulate.probe_clock_warning(report, "grpo", probe) is None
    # the trainer's step timed in this sitting (the trainer_alone stage): the clock moves no simulated time
    assert simulate.probe_clock_warning({"probe_clock": 0.82, "trainer_alone_s": 0.75}, "grpo", probe) is None
    # nor for the simulated trainer, which computes nothing (generation is on the profile's own clock)
    assert simulate.probe_clock_warning({"probe_clock": 0.82}, "simulated", probe) is None
    for clock in (1.18, 0.85):  # vLLM's profile on every core against one-thread actors was 1.18x
        warning = simulate.probe_clock_warning({"probe_clock": clock}, "grpo", probe)
        assert warning is not None and warning.startswith(
            f"warning: m/p.json: its calls of one engine alone ran {clock:.2f}x"
        )
        assert "dvc repro -f -s profile, then asp simulate probe-sharing" in warning


def test_schedule_not_matching_predictions_is_named(inputs: tuple[Params, simulate.Paths], tmp_path: Path) -> None:
    params, paths = inputs
    frame = pd.read_parquet(paths.schedule)
    bad = tmp_path / "schedule.parquet"
    frame.assign(prompt_id=frame.prompt_id.str.replace("p0001", "zzz")).to_parquet(bad, index=False)
    with pytest.raises(UserError, match=r"schedule\.parquet: the schedule does not match .*zzz"):
        simulate.run(params, replace(paths, schedule=bad, out_dir=tmp_path / "o"), NullTracker())
    assert not (tmp_path / "o").exists()


def test_disabled_stage_writes_only_the_flag(inputs: tuple[Params, simulate.Paths], tmp_path: Path) -> None:
    params, paths = inputs
    out = replace(paths, out_dir=tmp_path / "o", metrics=tmp_path / "m.json", plot=tmp_path / "p.png")
    assert simulate.run(_params({"simulate": {"enabled": False}}), out, NullTracker()) == {"simulate/enabled": 0}
    assert out.plot.is_file() and json.loads((out.out_dir / "models.json").read_text()) == {"enabled": False}


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory laid out like the repository (params.yaml, outputs/, metrics/) for `asp simulate`."""
    root = tmp_path_factory.mktemp("project")
    params = _params()
    raw = params.model_dump(mode="json")
    import yaml

    (root / "params.yaml").write_text(yaml.safe_dump(raw))
    paths = write_inputs(root / "staging", params)
    default = simulate.Paths()
    for src, dst in (
        (paths.predictions, default.predictions),
        (paths.samples, default.samples),
        (paths.heldout, default.heldout),
        (paths.timings, default.timings),
        (paths.schedule, default.schedule),
    ):
        (root / dst).parent.mkdir(parents=True, exist_ok=True)
        (root / dst).write_bytes(src.read_bytes())
    return root


def test_cli_prints_the_table_and_writes_out(project: Path) -> None:
    res = _asp(["simulate", "-c", "C4", "--set", "runtime.ray.actors_per_unit=4", "--out", "sim-out"], project)
    assert res.returncode == 0, res.stderr
    assert "| mean iter (s) |" in res.stdout and "| C4 |" in res.stdout.splitlines()[1]
    saved = json.loads((project / "sim-out/simulate.json").read_text())
    assert "simulate/C4/mean_iteration_time_s" in saved and (project / "sim-out/timeline.png").is_file()
    assert not (project / "metrics/simulate.json").exists()  # the CLI leaves the stage's outputs alone


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("simulate.training.step_base_s=-1", "simulate.training.step_base_s"),
        ("runtime.trainer.step_s=-0.5", "runtime.trainer.step_s"),
        ("runtime.ray.actors_per_unit=0", "runtime.ray.actors_per_unit"),
        ("simulate.cores=0", "simulate.cores"),
    ],
)
def test_cli_bad_values_exit_2_naming_them(project: Path, override: str, named: str) -> None:
    res = _asp(["simulate", "--set", override], project, process=override.startswith("simulate.cores"))
    assert res.returncode == 2 and named in res.stderr and "Traceback" not in res.stderr


def test_cli_missing_inputs_exit_2(tmp_path: Path, project: Path) -> None:
    (tmp_path / "params.yaml").write_bytes((project / "params.yaml").read_bytes())
    res = _asp(["simulate"], tmp_path, process=True)
    assert res.returncode == 2 and "metrics/profile_timings.csv: missing" in res.stderr, res.stderr


def test_plan_layout_prints_b6_and_search_and_writes_an_overlay(project: Path) -> None:
    res = _asp(["plan", "layout", "--devices", "4", "--k", "3", "--out", "plan.yaml", "--curve", "2,4"], project)
    assert res.returncode == 0, res.stderr
    assert "| B.6 heuristic |" in res.stdout and "| search best |" in res.stdout
    import yaml

    overlay = yaml.safe_load((project / "plan.yaml").read_text())
    runtime = overlay["runtime"]
    assert runtime["ray"]["generation_units"] * runtime["ray"]["actors_per_unit"] + overlay["plan"]["tu_devices"] <= 4
    assert overlay["schedule"] == {"b": 8, "k": 3}
    applied = {k: overlay[k] for k in ("runtime", "schedule")}
    assert validate_params(deep_merge(_params().model_dump(mode="json"), applied))


def test_plan_layout_refuses_a_cluster_too_small(project: Path) -> None:
    res = _asp(["plan", "layout", "--devices", "1"], project)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert res.stderr.startswith("error: --devices 1: a cluster needs at least 2 devices"), res.stderr


def test_plan_layout_searches_the_narrowed_grid(project: Path) -> None:
    """--tu-devices / --actors-per-unit / --generation-units narrow a grid that is refused without them (64 devices:
    tests/sim/test_plan_layout_cli.py)."""
    args = ["--devices", "64", "--tu-devices", "1,9", "--actors-per-unit", "4", "--generation-units", "1,2"]
    args += ["--k", "3"]
    res = _asp(["plan", "layout", *args], project)
    assert res.returncode == 0, res.stderr
    rows = [line for line in res.stdout.splitlines() if line.startswith("| search")]
    assert rows and all(" x 4 |" in row for row in rows)  # every layout searched has 4 actors per GU
    assert "layouts simulated" in res.stdout


def test_runtime_mode_sync_is_simulated(inputs: tuple[Params, simulate.Paths]) -> None:
    """``runtime.mode: sync`` reaches the simulator (the Control Unit core's sync rounds): lag 0, one round of a
    global batch at a time, so slower than the asynchronous run of the same schedule."""
    params, paths = inputs
    models = simulate.fit_models(params, paths)
    runs = {}
    for mode in ("async", "sync"):
        p = params.model_copy(update={"runtime": params.runtime.model_copy(update={"mode": mode})})
        runs[mode] = simulate.simulate_conditions(p, paths, models)["C0"].metrics
    sync, asyn = runs["sync"], runs["async"]
    assert sync["runtime/summary/mode_sync"] == 1 and asyn["runtime/summary/mode_sync"] == 0
    assert sync["sim/policy_lag_max"] == 0 and asyn["sim/policy_lag_max"] > 0
    assert sync["runtime/summary/pauses"] == 0
    assert sync["runtime/summary/mean_iteration_time_s"] > asyn["runtime/summary/mean_iteration_time_s"]


def test_cli_set_runtime_mode_sync_simulates_sync(project: Path) -> None:
    res = _asp(["simulate", "-c", "C0", "--set", "runtime.mode=sync", "--out", "sim-sync"], project)
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines()[0].endswith("runtime.mode: sync")
    lag_row = next(line for line in res.stdout.splitlines() if line.startswith("| policy lag max |"))
    assert lag_row == "| policy lag max | 0 |"
    saved = json.loads((project / "sim-sync/simulate.json").read_text())
    assert saved["simulate/C0/policy_lag_mean"] == 0


def test_plan_layout_with_a_preset_shows_each_layout_s_range(project: Path) -> None:
    """A preset time model: each shown layout's iteration time with its min-max over the 13-point sensitivity grid
    (the value inside it) and at how many grid points it is the fastest shown (13 in all, ties counted for each)."""
    args = ["--devices", "4", "--k", "3", "--set", "simulate.time_model=h100-qwen3-8b"]
    res = _asp(["plan", "layout", *args], project)
    assert res.returncode == 0, res.stderr
    assert "preset h100-qwen3-8b" in res.stdout and "| bottleneck | fastest |" in res.stdout
    rows = [line.split(" | ") for line in res.stdout.splitlines() if line.startswith(("| B.6", "| search"))]
    assert len(rows) >= 2
    wins = 0
    for cells in rows:
        value, span = cells[6].split(" [")
        low, high = (float(v) for v in span.rstrip("]").split("-"))
        assert low <= float(value) <= high and low < high  # the grid scales trainer and decode costs
        win, points = cells[-1].rstrip(" |").split("/")
        assert points == "13" and 0 <= int(win) <= 13
        wins += int(win)
    assert wins >= 13  # every grid point has a fastest layout


def test_plan_layout_with_the_fit_prints_no_range(project: Path) -> None:
    res = _asp(["plan", "layout", "--devices", "4", "--k", "3"], project)
    assert res.returncode == 0, res.stderr
    assert "fastest" not in res.stdout and " [" not in res.stdout and "| bottleneck |\n" in res.stdout


def _fake_launch(root: Path, params: Params, metrics: dict) -> None:
    """params.yaml, dvc.lock recording a launch of `params`, its metrics/launch.json and summary.json."""
    import hashlib

    raw = params.model_dump(mode="json")
    (root / "params.yaml").write_text(yaml.safe_dump(raw))
    (root / "metrics").mkdir(exist_ok=True)
    (root / "outputs/launch").mkdir(parents=True, exist_ok=True)
    body = json.dumps(metrics).encode()
    (root / "metrics/launch.json").write_bytes(body)
    (root / "outputs/launch/summary.json").write_text(json.dumps({"condition": "C4"}))
    recorded = {k: raw[k] for k in ("runtime", "schedule", "profile")} | {"common.seed": raw["common"]["seed"]}
    recorded["runtime"]["grpo"]["adam_eps"] = "@EPS@"  # dvc.lock writes 1e-08, a str in YAML 1.1
    lock = {
        "stages": {
            "launch": {
                "params": {"params.yaml": recorded},
                "outs": [{"path": "metrics/launch.json", "md5": hashlib.md5(body).hexdigest()}],
            }
        }
    }
    (root / "dvc.lock").write_text(yaml.safe_dump(lock).replace("'@EPS@'", "1e-08"))


def test_last_launch_of_the_same_setting_is_checked_and_others_are_named(tmp_path: Path) -> None:
    params = _params({"runtime": {"grpo": {"adam_eps": 1e-8}}})
    measured = {"runtime/summary/mean_iteration_time_s": 2.0, "runtime/summary/policy_lag_mean": 0.0}
    _fake_launch(tmp_path, params, measured)
    condition, found = simulate.last_launch(params, tmp_path)
    assert condition == "C4" and found == measured
    other = params.model_copy(
        update={
            "runtime": params.runtime.model_copy(
                update={"ray": params.runtime.ray.model_copy(update={"actors_per_unit": 5})}
            )
        }
    )
    why = simulate.last_launch(other, tmp_path)
    assert why == (
        "no launch of this setting to check against; the last launch differs in runtime.ray.actors_per_unit "
        "(launch 3, here 5)"
    )
    longer = params.model_copy(update={"simulate": params.simulate.model_copy(update={"iterations": 7})})
    assert "simulate.iterations (launch ran 20 steps, here 7)" in simulate.last_launch(longer, tmp_path)
    (tmp_path / "metrics/launch.json").write_text("{}")  # not the launch dvc.lock records
    assert "is not the launch dvc.lock records" in simulate.last_launch(params, tmp_path)
    # a launch recorded before the profile's engine keys moved (profile.engine: hf, profile.device ...) is the same
    # setting once migrated, not a refusal of dvc.lock
    _fake_launch(tmp_path, params, measured)
    lock = yaml.safe_load((tmp_path / "dvc.lock").read_text())
    recorded = lock["stages"]["launch"]["params"]["params.yaml"]["profile"]
    recorded.update({"engine": recorded["engine"]["kind"], **{k: recorded["engine"][k] for k in ("device", "vllm")}})
    (tmp_path / "dvc.lock").write_text(yaml.safe_dump(lock))
    assert simulate.last_launch(params, tmp_path) == ("C4", measured)
    # hand-worked errors: (1.5 - 2) / 2 = -25 %; a measured 0 gives NaN, not a division error
    rows = launch_errors(
        {"runtime/summary/mean_iteration_time_s": 1.5, "runtime/summary/policy_lag_mean": 1.0}, measured
    )
    assert rows[0] == ("mean_iteration_time_s", "mean iteration time (s)", 2.0, 1.5, -0.25)
    assert rows[1][1] == "policy lag mean (steps)" and np.isnan(rows[1][4]) and len(rows) == 2


def test_cli_says_when_there_is_no_launch_to_check_against(project: Path) -> None:
    res = _asp(["simulate", "-c", "C4"], project)
    assert res.returncode == 0, res.stderr
    assert res.stdout.rstrip().splitlines()[-1].startswith("no launch to check against (needs dvc.lock")


def test_fit_training_cli_fits_batch_size_and_sharing_from_two_launches(project: Path) -> None:
    """Two launches of 16 and 32 prompts x 4 samples (per step 0.3 s + 1e-3 s per sequence + 1e-4 s per token) and
    generation calls that ran at twice the profile's law, never during a trainer step: the overlay holds all three
    trainer costs, a generation factor ~2 and no trainer demand (nothing tells it apart from 0)."""
    import yaml

    from tests.sim.test_timemodel import _launch

    rng = np.random.default_rng(1)
    for name, prompts in (("a", 16), ("b", 32)):
        d = project / "launches" / name
        d.mkdir(parents=True, exist_ok=True)
        steps = _launch(prompts, N_SAMPLES, seed=prompts)  # 40 steps, each ending 10 s after the last
        steps["runtime/iteration_time_s"], steps["runtime/train_step_s"] = 10.0, 1.5
        steps.to_parquet(d / "iterations.parquet")
        mx = rng.integers(20, CAP, 30)
        pd.DataFrame(
            {
                "gen_s": 2 * (0.05 + 0.004 * mx),  # the profile's timing law (write_inputs), twice as slow
                "prompts": 16,
                "responses": 16 * N_SAMPLES,
                "tokens": mx * 16 * N_SAMPLES // 2,
                "max_length": mx,
                "split_responses": 0,
                "gen_start_s": np.arange(30) * 10.0 + 1.0,  # between the steps (each 1.5 s before a 10 s mark)
            }
        ).to_parquet(d / "minibatches.parquet")
    files = [str(project / "launches" / n / "iterations.parquet") for n in ("a", "b")]
    res = _asp(["simulate", "fit-training", *files], project)
    assert res.returncode == 0, res.stderr
    sim = yaml.safe_load(res.stdout)["simulate"]
    assert sim["training"]["step_per_sample_s"] == pytest.approx(1e-3, rel=0.02)
    assert sim["training"]["step_base_s"] == pytest.approx(0.3, abs=0.01)
    assert sim["sharing_factor"] == pytest.approx(2.0, rel=0.05) and sim["trainer_threads"] == 0.0
    assert "calls=60" in res.stdout and "steps=80" in res.stdout


def test_fit_training_cli_under_an_anchored_probe_takes_full_speed_from_it(project: Path) -> None:
    """Measured sharing and a probe that timed the processes alone: the training cost is the probe's step (1.0 s on
    1,000 response tokens and 64 sequences of the profile's 30 prompt tokens, less the launch's export) and the
    generation factor is its calls' 1.5x the profile's law; the launch (made first by the test above) only checks."""
    import yaml

    files = [str(project / "launches" / "a" / "iterations.parquet")]
    raw = yaml.safe_load((project / "params.yaml").read_text())
    raw["simulate"]["sharing"] = "measured"
    (project / "measured.yaml").write_text(yaml.safe_dump(raw))
    calls = [{"seconds": 1.5 * (0.05 + 0.004 * m), "prompts": 16, "responses": 16 * N_SAMPLES, "tokens": m * 32,
              "max_length": m, "prompt_tokens": 16 * 30} for m in (40, 90, 150)]  # fmt: skip
    probe = {
        "generation_slowdown": [[1.0, 1.2]] * 3,
        "training_slowdown": [1.3] * 3,
        "alone_step_s": 1.0,
        "training_load": {"response_tokens": 1000, "sequences": 64},
        "alone_calls": calls,
    }
    probe_path = project / "metrics" / "sharing_probe.json"
    probe_path.parent.mkdir(parents=True, exist_ok=True)
    probe_path.write_text(json.dumps(probe))
    try:
        res = _asp(["simulate", "fit-training", *files, "-p", "measured.yaml"], project)
        # anchored=False (benchmarks/sim_validation.py --full-speed launch): full speed from the launch's own calls
        # (twice the law, none beside a step or another call) and steps, the probe giving only the slowdowns
        launch = project / "launches" / "a"
        tables = [pd.read_parquet(launch / "minibatches.parquet")], [pd.read_parquet(launch / "iterations.parquet")]
        free = simulate.fit_launch_sharing(
            validate_params(raw), rebase(simulate.Paths(), project), *tables, [N_SAMPLES], anchored=False
        )
    finally:
        probe_path.unlink()
    sharing, free_train, report = free
    assert sharing.generation_factor == pytest.approx(2.0, rel=0.05) and "anchored" not in report
    assert report["contention"] == 1.0 and free_train.step_base_s > 0.1  # the launch's 1.5 s steps, not the probe's
    assert res.returncode == 0, res.stderr
    sim = yaml.safe_load(res.stdout)["simulate"]
    train = sim["training"]
    per_token = (1.0 - train["save_s"] - train["convert_s"]) / (1000 + 30 * 64)
    assert train["step_per_token_s"] == pytest.approx(per_token, rel=1e-3) and train["step_base_s"] == 0.0
    assert train["step_per_sample_s"] == pytest.approx(30 * per_token, rel=1e-3)
    assert sim["sharing_factor"] == pytest.approx(1.5, rel=0.05)
    assert "anchored=1" in res.stdout and "generation_anchored=1" in res.stdout


def test_a_preset_is_never_checked_against_this_machine_s_launch(project: Path) -> None:
    res = _asp(["simulate", "-c", "C4", "--set", "simulate.time_model=h100-qwen3-8b"], project)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.rstrip().splitlines()
    assert lines[-1].startswith("no launch to check against: the time model is the preset")
    # the one check at GPU scale is the paper's runs, and it misses their scheduling gain: said under every preset run
    assert lines[-2].startswith("note: a preset's scheduling gain") and "benchmarks/sim_paper.py" in lines[-2]


def test_measured_sharing_reads_the_probe_and_names_a_bad_one(
    inputs: tuple[Params, simulate.Paths], tmp_path: Path
) -> None:
    params, paths = inputs
    measured = _params({"simulate": {"sharing": "measured"}})
    probe = tmp_path / "sharing_probe.json"
    with pytest.raises(UserError, match=r"sharing_probe.json: not found.*asp simulate probe-sharing"):
        simulate.run(measured, replace(paths, sharing_probe=probe), NullTracker())
    probe.write_text(json.dumps({"generation_slowdown": [[1, 1]]}))
    with pytest.raises(UserError, match=r"sharing_probe.json: not a sharing probe.*Re-run `asp simulate probe-"):
        simulate.run(measured, replace(paths, sharing_probe=probe), NullTracker())
    # 3 actors on 2 cores: processor sharing runs each at 2/3; a probe that measured them at 1/2 is slower
    probe.write_text(json.dumps({"generation_slowdown": [[1, 1], [1, 1], [2, 2]], "training_slowdown": [1, 1, 1]}))
    slow = simulate.run(measured, replace(paths, sharing_probe=probe, out_dir=tmp_path / "o"), NullTracker())
    shared = simulate.run(params, replace(paths, out_dir=tmp_path / "p"), NullTracker())
    for cond in ("C0", "C4"):
        key = f"simulate/{cond}/mean_iteration_time_s"
        assert slow[key] > shared[key]


def test_probe_sharing_cli_refuses_bad_counts(project: Path) -> None:
    res = _asp(["simulate", "probe-sharing", "--repeats", "0"], project)
    assert res.returncode == 2
    assert "--engines, --repeats and --call-prompts must be >= 1" in res.stderr and "Traceback" not in res.stderr
    # calls default to the schedule's minibatch size (the launch's calls), named in the refusal
    b = yaml.safe_load((project / "params.yaml").read_text())["schedule"]["b"]
    res = _asp(["simulate", "probe-sharing", "--engines", "0"], project)
    assert res.returncode == 2 and f"got 0, 10, {b}." in res.stderr


def test_full_speed_auto_puts_the_probe_s_trainer_on_the_profile_s_clock(
    inputs: tuple[Params, simulate.Paths], tmp_path: Path
) -> None:
    """The profile's law is 0.05 + 0.004 s per decode step; the probe's sitting ran those calls 1.5x slower and
    timed the step alone at 1.2 s (1,000 response tokens, 64 sequences of the profile's 30 prompt tokens): on the
    profile's clock the step is 0.8 s and generation is the profile fit itself. full_speed: params keeps
    sharing_factor and simulate.training as written."""
    _, paths = inputs
    calls = [{"seconds": 1.5 * (0.05 + 0.004 * m), "prompts": 16, "responses": 16 * N_SAMPLES, "tokens": m * 32,
              "max_length": m, "prompt_tokens": 16 * 30} for m in (40, 90, 150)]  # fmt: skip
    probe = tmp_path / "sharing_probe.json"
    probe.write_text(
        json.dumps(
            {
                "generation_slowdown": [[1.0, 1.2]] * 3,
                "training_slowdown": [1.3] * 3,
                "alone_step_s": 1.2,
                "training_load": {"response_tokens": 1000, "sequences": 64},
                "alone_calls": calls,
            }
        )  # fmt: skip
    )
    paths = replace(paths, sharing_probe=probe)
    overlay = {"runtime": {"trainer": {"kind": "grpo"}}, "simulate": {"sharing": "measured", "sharing_factor": 1.3}}
    auto = simulate.fit_models(_params(overlay), paths)
    as_written = simulate.fit_models(_params(deep_merge(overlay, {"simulate": {"full_speed": "params"}})), paths)
    processor = simulate.fit_models(_params(deep_merge(overlay, {"simulate": {"sharing": "processor"}})), paths)

    assert auto.gen_report["probe_clock"] == pytest.approx(1.5, rel=0.03)
    shape = (16, N_SAMPLES, 120, 120 * 32, 16 * 30)
    assert auto.gen.seconds(*shape) == pytest.approx(0.05 + 0.004 * 120, rel=0.03)  # the profile's law, unscaled
    publish = auto.train.publish_seconds()
    per_token = (1.2 / auto.gen_report["probe_clock"] - publish) / (1000 + 30 * 64)
    assert auto.train.step_per_token_s == pytest.approx(per_token, rel=0.02) and auto.train.step_base_s == 0.0
    assert auto.train.step_seconds(1000, 64) + publish == pytest.approx(0.8, rel=0.03)
    for other in (as_written, processor):  # the factor and the params' training times, no clock
        assert "probe_clock" not in other.gen_report
        assert other.gen.seconds(*shape) == pytest.approx(1.3 * auto.gen.seconds(*shape))
        assert other.train == simulate.training_model(_params(overlay))


def test_the_step_timed_alone_in_this_sitting_is_the_trainer_s_full_speed(
    inputs: tuple[Params, simulate.Paths], tmp_path: Path
) -> None:
    """With the trainer_alone stage's step (0.7 s on 2,000 response tokens, 128 sequences of the profile's 30 prompt
    tokens) the trainer's full speed is that step as timed: per token (0.7 - export) / (2,000 + 30 x 128), whatever
    the probe's step and clock (1.2 s, 1.5x). The probe's clock is still reported; generation is unchanged. A file
    that timed nothing, or the simulated trainer, leaves the probe's step on the profile's clock."""
    _, paths = inputs
    calls = [{"seconds": 1.5 * (0.05 + 0.004 * m), "prompts": 16, "responses": 16 * N_SAMPLES, "tokens": m * 32,
              "max_length": m, "prompt_tokens": 16 * 30} for m in (40, 90, 150)]  # fmt: skip
    probe, alone = tmp_path / "sharing_probe.json", tmp_path / "trainer_alone.json"
    probe.write_text(json.dumps({"generation_slowdown": [[1.0, 1.2]] * 3, "training_slowdown": [1.3] * 3,
                                 "alone_step_s": 1.2, "training_load": {"response_tokens": 1000, "sequences": 64},
                                 "alone_calls": calls}))  # fmt: skip
    timed = {"trainer_alone/timed": 1, "trainer_alone/step_s": 0.7, "trainer_alone/response_tokens": 2000,
             "trainer_alone/sequences": 128}  # fmt: skip
    alone.write_text(json.dumps(timed))
    paths = replace(paths, sharing_probe=probe, trainer_alone=alone)
    grpo = _params({"runtime": {"trainer": {"kind": "grpo"}}, "simulate": {"sharing": "measured"}})
    models = simulate.fit_models(grpo, paths)
    publish = models.train.publish_seconds()
    assert models.gen_report["trainer_alone_s"] == 0.7
    assert models.gen_report["probe_clock"] == pytest.approx(1.5, rel=0.03)
    assert models.train.step_per_token_s == pytest.approx((0.7 - publish) / (2000 + 30 * 128), rel=0.02)
    assert models.train.step_seconds(2000, 128) + publish == pytest.approx(0.7, rel=0.03)
    without = simulate.fit_models(grpo, replace(paths, trainer_alone=tmp_path / "absent.json"))
    assert without.train.step_seconds(1000, 64) + publish == pytest.approx(0.8, rel=0.03)  # 1.2 s / 1.5
    assert without.gen.seconds(16, N_SAMPLES, 120, 3840, 480) == models.gen.seconds(16, N_SAMPLES, 120, 3840, 480)
    alone.write_text(json.dumps({"trainer_alone/timed": 0}))
    assert simulate.fit_models(grpo, paths).train == without.train
    alone.write_text(json.dumps(timed))
    simulated = simulate.fit_models(_params({"simulate": {"sharing": "measured"}}), paths)
    assert "trainer_alone_s" not in simulated.gen_report and "probe_clock" in simulated.gen_report


def test_a_probe_of_another_engine_is_named(inputs: tuple[Params, simulate.Paths], tmp_path: Path) -> None:
    _, paths = inputs
    probe = tmp_path / "sharing_probe.json"
    probe.write_text(json.dumps({"generation_slowdown": [[1, 1]] * 3, "training_slowdown": [1] * 3, "engine": "hf"}))
    paths = replace(paths, sharing_probe=probe)
    vllm = _params({"simulate": {"sharing": "measured"}, "runtime": {"engine": {"kind": "vllm"}}})
    warning = simulate.probe_engine_warning(vllm, paths)
    assert warning is not None and "sharing_probe.json timed hf engines but runtime.engine.kind is 'vllm'" in warning
    assert simulate.probe_engine_warning(_params({"simulate": {"sharing": "measured"}}), paths) is None  # hf: same
    assert simulate.probe_engine_warning(_params(), paths) is None  # processor sharing reads no probe
    probe.write_text(json.dumps({"generation_slowdown": [[1, 1]] * 3, "training_slowdown": [1] * 3}))
    assert simulate.probe_engine_warning(vllm, paths) is None  # an old probe that did not record its engine


def test_a_probe_whose_calls_alone_are_unusable_is_named(
    inputs: tuple[Params, simulate.Paths], tmp_path: Path
) -> None:
    """full_speed: auto reads the probe's calls alone and its step: a call without its shape, or a step shorter than
    the export, is one message naming the file, not a traceback."""
    _, paths = inputs
    probe = tmp_path / "sharing_probe.json"
    paths = replace(paths, sharing_probe=probe)
    call = {"seconds": 0.5, "prompts": 16, "responses": 64, "tokens": 2000, "prompt_tokens": 480}  # no max_length
    record = {"generation_slowdown": [[1.0, 1.2]] * 3, "training_slowdown": [1.3] * 3, "alone_step_s": 1.2,
              "training_load": {"response_tokens": 1000, "sequences": 64}, "alone_calls": [call]}  # fmt: skip
    probe.write_text(json.dumps(record))
    for trainer in ("grpo", "simulated"):
        params = _params({"runtime": {"trainer": {"kind": trainer}}, "simulate": {"sharing": "measured"}})
        with pytest.raises(UserError, match=r"sharing_probe.json: a call of one engine alone lacks 'max_length'.*"
                           r"Re-run `asp simulate probe-sharing`"):  # fmt: skip
            simulate.fit_models(params, paths)
    probe.write_text(json.dumps({**record, "alone_step_s": 0.001, "alone_calls": [{**call, "max_length": 60}]}))
    grpo = _params({"runtime": {"trainer": {"kind": "grpo"}}, "simulate": {"sharing": "measured"}})
    with pytest.raises(UserError, match=r"sharing_probe.json: the step timed alone .* must outlast the export"):
        simulate.fit_models(grpo, paths)
    alone = tmp_path / "trainer_alone.json"  # the step timed in this sitting: the same message, naming its file
    alone.write_text(json.dumps({"trainer_alone/timed": 1, "trainer_alone/step_s": 0.001,
                                 "trainer_alone/response_tokens": 1000, "trainer_alone/sequences": 64}))  # fmt: skip
    probe.write_text(json.dumps({**record, "alone_calls": [{**call, "max_length": 60}]}))
    with pytest.raises(UserError, match=r"trainer_alone.json: the step timed alone .* Re-run `dvc repro trainer_"):
        simulate.fit_models(grpo, replace(paths, trainer_alone=alone))


def test_probe_spread_warning_names_the_widest_slowdown_the_launch_meets() -> None:
    probe = Path("metrics/sharing_probe.json")
    intervals = {
        (1, False, "call"): (1.0, 1.0, 1.0),
        (2, False, "call"): (1.13, 0.99, 1.25),  # +-11.5 %: too wide
        (2, True, "step"): (1.60, 1.55, 1.70),  # +-4.7 %
        (3, True, "step"): (2.3, 1.8, 2.9),  # +-24 %, but a launch of 2 actors never meets it
    }
    warning = simulate.probe_spread_warning(intervals, 2, probe)
    assert warning is not None and warning.startswith("warning: metrics/sharing_probe.json: the slowdown of a call")
    assert "with 2 engines decoding is 1.13x, anywhere in 0.99-1.25x at 90 %" in warning
    assert "asp simulate probe-sharing --repeats 20" in warning
    assert "training step with 3 engines" in (simulate.probe_spread_warning(intervals, 3, probe) or "")
    narrow = {k: v for k, v in intervals.items() if k != (2, False, "call")}
    assert simulate.probe_spread_warning(narrow, 2, probe) is None
    assert simulate.probe_spread_warning(None, 2, probe) is None  # an older probe: no rounds kept


def test_the_probe_s_spread_gives_the_simulated_range(inputs: tuple[Params, simulate.Paths], tmp_path: Path) -> None:
    """A probe with per-round ratios: the stage logs the mean iteration time at both ends of the slowdowns'
    intervals around its value, slower slowdowns a slower run; without rounds, no range."""
    _, paths = inputs
    rounds = {
        "1": {"calls": [1.0] * 5, "steps": []},
        "1+training": {"calls": [1.0, 1.1, 1.2, 1.3, 1.4], "steps": [1.0] * 5},
        "2": {"calls": [1.0] * 5, "steps": []},
        "2+training": {"calls": [1.2, 1.4, 1.6, 1.8, 2.0], "steps": [1.1, 1.2, 1.3, 1.4, 1.5]},
        "3": {"calls": [1.4, 1.6, 1.8, 2.0, 2.2], "steps": []},
        "3+training": {"calls": [2.0, 2.2, 2.4, 2.6, 2.8], "steps": [1.5, 1.7, 1.9, 2.1, 2.3]},
    }
    record = {"generation_slowdown": [[1, 1.2], [1, 1.6], [1.8, 2.4]], "training_slowdown": [1, 1.3, 1.9]}
    probe = tmp_path / "sharing_probe.json"
    probe.write_text(json.dumps(record | {"rounds_ratios": rounds}))
    measured = _params({"simulate": {"sharing": "measured"}, "runtime": {"trainer": {"kind": "grpo"}}})
    metrics = simulate.run(measured, replace(paths, sharing_probe=probe, out_dir=tmp_path / "o"), NullTracker())
    for cond in ("C0", "C4"):
        key = f"simulate/{cond}/mean_iteration_time_s"
        assert metrics[f"{key}_probe_low"] < metrics[key] < metrics[f"{key}_probe_high"]
    probe.write_text(json.dumps(record))
    metrics = simulate.run(measured, replace(paths, sharing_probe=probe, out_dir=tmp_path / "p"), NullTracker())
    assert "simulate/C0/mean_iteration_time_s_probe_low" not in metrics


def test_the_workload_draws_a_visit_per_pass_over_the_prompts() -> None:
    # 200 steps x 16 prompts over 2,000 prompts = 1.6 passes -> 2, and 2 more: 4 visits; 3,200 over 3,200 -> 1 + 2
    base = {"runtime": {"iterations": 200, "global_batch_prompts": 16}}
    assert simulate.visits(_params(base), 2000) == 4
    assert simulate.visits(_params(base), 3200) == 3
    shorter = deep_merge(base, {"simulate": {"iterations": 10}})  # 160 prompts: one pass
    assert simulate.visits(_params(shorter), 2000) == 3
    assert simulate.visits(_params(base), 0) == 1
    assert simulate.visits(_params(base), 10) == MAX_DRAWN_VISITS  # 320 passes: cycled through 32
