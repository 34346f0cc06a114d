"""Every stage's `run` on the demo task with tiny params, chained through files in a temporary directory,
logged to a temporary SQLite MLflow store: counts match the configured sizes, the predictor ranks held-out
prompts well, and every metrics file agrees with the outputs and the MLflow runs; then a killed profile run
resumes from its saved chunks; and (`make test-all`) an interrupted GRPO launch resumes in the same MLflow run."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from mlflow import MlflowClient
from scipy import stats

from asp.config import Params, validate_params
from asp.errors import UserError
from asp.pipeline import (
    evaluate,
    launch,
    policy,
    predict,
    prepare,
    profile,
    schedule,
    sim_check,
    simulate,
    train_predictor,
    trainer_alone,
)
from asp.stage import run_stage
from asp.steps.engine import profile_engine
from asp.steps.launch_state import HISTORY_FILE, RUN_FILE, Recorder
from asp.steps.loaders import policy_model_path
from asp.steps.paths import rebase
from asp.tracking import open_tracker

from .conftest import ROOT, TINY, tiny_params

# TINY's 1-layer policy emits lengths unrelated to its prompts (held-out τ about 0: nothing to rank); this one
# learns to stop at the prompt's stop letter in about 70 s (its Spearman of intended vs sampled length 0.88), and the
# predictor then reaches a held-out τ of 0.73 on this machine (the prompt's length: -0.16). A 64-wide policy
# warm-started for 600 steps followed the stop letter too loosely (Spearman 0.16, predictor τ 0.40).
LEARNING_POLICY = {
    "policy": {
        "demo": {
            "hidden_size": 128,
            "num_layers": 2,
            "num_heads": 4,
            "intermediate_size": 256,
            "warm_start_steps": 800,
            "warm_start_problems": 8000,
            "lr": 0.003,
            "target_reward": None,
        }
    },
    # the stop letter is one token among ~40: MiniLM needs ~1,000 prompt visits before it reads it (the demo's 340
    # training prompts: val tau 0.30 after epoch 2, 0.80 after epoch 3), so this predictor sees its 82 more often
    "predictor": {"epochs": 8, "lr": 0.003, "patience": 8},
}
MIN_TAU = 0.5  # held-out Kendall τ (and Spearman) required of the predictor


def _paths(t: Path) -> dict[str, object]:
    """Every stage's paths from the one table (`asp.steps.paths`), moved under `t`."""
    return {name: rebase(module.Paths(), t) for name, module in STAGES.items()}


STAGES = {
    "policy": policy,
    "prepare": prepare,
    "profile": profile,
    "train_predictor": train_predictor,
    "evaluate": evaluate,
    "predict": predict,
    "schedule": schedule,
    "trainer_alone": trainer_alone,
    "simulate": simulate,
    "launch": launch,
    "sim_check": sim_check,
}


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory, _mlflow_store: str) -> dict[str, Any]:
    """Every stage run once, in order, in one temporary directory (the module's tests share it)."""
    tmp_path = tmp_path_factory.mktemp("stages_demo")
    params = validate_params(tiny_params(LEARNING_POLICY))
    paths, run_ids = run_stages(params, tmp_path, "e2e")
    return {"root": tmp_path, "params": params, "paths": paths, "run_ids": run_ids}


def run_stages(params: Any, root: Path, experiment: str) -> tuple[dict[str, object], dict[str, str]]:
    """Every stage's `run`, in order, with its paths under `root`, each in its own MLflow run of `experiment`:
    (paths by stage, MLflow run id by stage)."""
    paths = _paths(root)
    (root / "metrics").mkdir(parents=True, exist_ok=True)  # simulate.sharing: measured reads this machine's probe
    shutil.copy(ROOT / "metrics/sharing_probe.json", root / "metrics/sharing_probe.json")
    run_ids = {}
    for name, module in STAGES.items():
        with open_tracker(name, experiment=experiment) as tracker:
            module.run(params, paths[name], tracker)
            run_ids[name] = tracker.run_id
    return paths, run_ids


@pytest.mark.slow
def test_demo_pipeline_end_to_end(demo: dict[str, Any]) -> None:
    tmp_path, params, paths, run_ids = demo["root"], demo["params"], demo["paths"], demo["run_ids"]

    prep = TINY["prepare"]
    profiled = prep["profile_prompts"] + prep["heldout_prompts"]
    samples = pd.read_parquet(tmp_path / "outputs/profile/samples.parquet")
    assert len(samples) == profiled * TINY["profile"]["n_samples"] and set(samples.finish_reason) <= {"stop", "length"}
    timings = pd.read_csv(tmp_path / "metrics/profile_timings.csv")
    cap = TINY["profile"]["max_new_tokens"]
    capped = timings[timings.max_new_tokens < cap]  # profile.timing_caps below the cap, two calls each
    assert len(timings) - len(capped) == -(-profiled // TINY["profile"]["minibatch_prompts"])
    assert sorted(capped.max_new_tokens) == sorted(2 * [c for c in Params.defaults().profile.timing_caps if c < cap])
    assert (timings.wall_s > 0).all()
    preds = pd.read_parquet(tmp_path / "outputs/predictions.parquet")
    assert len(preds) == prep["demo_prompts"] and np.isfinite(preds.predicted_length).all()
    assert np.all(np.diff(preds.sort_values("predicted_length").calibrated_length.to_numpy()) >= -1e-9)
    _check_predictor(tmp_path, preds, run_ids["evaluate"])
    _check_schedule(tmp_path, preds, run_ids["schedule"])
    for f in (
        "plots/profile_lengths.png",
        "plots/predictor_curves.png",
        "plots/predictor_scatter.png",
        "plots/schedule_loads.png",
        "outputs/predictor/predictor.json",
    ):
        assert (tmp_path / f).is_file(), f
    _check_launch(tmp_path, run_ids["launch"])
    # the simulated trainer computes nothing on the cores: the step is not timed, and simulate runs without it
    assert json.loads((tmp_path / "metrics/trainer_alone.json").read_text()) == {"trainer_alone/timed": 0}
    sim = json.loads((tmp_path / "metrics/simulate.json").read_text())  # the simulated launch of the same settings
    assert sim["simulate/C4/mean_iteration_time_s"] > 0 and sim["simulate/gen_fit/minibatches"] == len(timings)
    assert "simulate/gen_fit/trainer_alone_s" not in sim
    # sim_check: the simulated C4 against this launch, from the two metrics files
    check = json.loads((tmp_path / "metrics/sim_check.json").read_text())
    measured = json.loads((tmp_path / "metrics/launch.json").read_text())["runtime/summary/mean_iteration_time_s"]
    assert check["sim_check/checked"] == 1 and check["sim_check/mean_iteration_time_s_measured"] == measured
    assert check["sim_check/mean_iteration_time_s_error"] == pytest.approx(
        sim["simulate/C4/mean_iteration_time_s"] / measured - 1
    )
    assert MlflowClient().get_run(run_ids["sim_check"]).data.metrics["sim_check/max_time_error"] >= 0
    assert MlflowClient().get_run(run_ids["profile"]).data.params["profile.n_samples"] == "2"

    # resume, on the profile run above: a finished chunk is kept, a missing one is regenerated, a corrupt one is named
    key_dir = tmp_path / "outputs/.work/profile"
    assert not any(key_dir.rglob("chunk_*.parquet"))  # cleaned after success
    _resume_keeps_chunks(params, paths["profile"], samples)


@pytest.mark.slow
@pytest.mark.extended  # a GRPO launch killed and resumed in its MLflow run: tests/pipeline/test_kill_points.py
def test_grpo_launch_interrupted_by_ctrl_c_resumes_in_the_same_mlflow_run(demo: dict[str, Any]) -> None:
    _grpo_launch_resumes_in_the_same_mlflow_run(demo["root"], demo["paths"]["launch"])


def _logged(run_id: str, metrics: dict) -> dict:
    """`metrics`' numeric entries as the stage's MLflow run holds them (for comparison with the file)."""
    logged = MlflowClient().get_run(run_id).data.metrics
    return {k: logged.get(k) for k, v in metrics.items() if isinstance(v, int | float)}


def _numeric(metrics: dict) -> dict:
    return {k: pytest.approx(float(v)) for k, v in metrics.items() if isinstance(v, int | float)}


def _check_predictor(t: Path, preds: pd.DataFrame, run_id: str) -> None:
    """τ well above chance on held-out prompts, equal to τ of the predict stage's outputs on the same prompts."""
    metrics = json.loads((t / "metrics/predictor.json").read_text())
    assert metrics["predictor/heldout_prompts"] == TINY["prepare"]["heldout_prompts"]
    assert metrics["predictor/kendall_tau"] > MIN_TAU and metrics["predictor/spearman"] > MIN_TAU
    heldout = pd.read_parquet(t / "outputs/prompts/heldout.parquet", columns=["prompt_id"])
    true = pd.read_parquet(t / "outputs/profile/prompts.parquet", columns=["prompt_id", "mean_length"])
    joined = heldout.merge(preds, on="prompt_id").merge(true, on="prompt_id")
    assert len(joined) == TINY["prepare"]["heldout_prompts"]
    tau = stats.kendalltau(joined.predicted_length, joined.mean_length).statistic
    assert tau == pytest.approx(metrics["predictor/kendall_tau"], abs=0.01)  # same model, batches cut differently
    edges = metrics["buckets"][0]["lo"], metrics["buckets"][-1]["hi"]
    assert sum(b["count"] for b in metrics["buckets"]) == joined.mean_length.between(*edges).sum()
    assert _logged(run_id, metrics) == _numeric(metrics)


def _check_schedule(t: Path, preds: pd.DataFrame, run_id: str) -> None:
    """The schedule file has the counts metrics/schedule.json reports; C4 balances better than plain DP."""
    s = TINY["schedule"]
    sched = pd.read_parquet(t / "outputs/schedule/schedule.parquet")
    assert sorted(sched.prompt_id) == sorted(preds.prompt_id)
    sizes = sched.groupby("minibatch_id").size()
    assert sizes.between(s["b"], s["b"] + s["kappa"]).all()
    groups = sched.groupby("group_id").minibatch_id.nunique()
    sm = json.loads((t / "metrics/schedule.json").read_text())
    assert sm["schedule/prompts"] == len(sched) == TINY["prepare"]["demo_prompts"]
    assert sm["schedule/minibatches"] == len(sizes) and sm["schedule/groups"] == len(groups)
    assert (groups <= s["k"]).all() and (groups < s["k"]).sum() <= 1  # k per group, one partial group at most
    assert sm["schedule/ablation/prompts"] == TINY["prepare"]["heldout_prompts"]  # out of sample: held-out only
    table = pd.read_csv(t / "plots/schedule_ablation.csv").set_index("condition")
    assert list(table.index) == ["C0", "C1", "C2", "C3", "C4"]
    for cond, row in table.iterrows():
        for col, value in row.items():
            assert sm[f"schedule/ablation/{cond}/{col}"] == pytest.approx(value, rel=1e-5), (cond, col)
    assert table.loc["C4", "CV"] < table.loc["C2", "CV"]  # balanced groups vs DP groups in length order
    assert _logged(run_id, sm) == _numeric(sm)


def _check_launch(t: Path, run_id: str) -> None:
    """3 simulated steps of 8 prompts; metrics/launch.json, the output files and the MLflow run agree."""
    rt = TINY["runtime"]
    lm = json.loads((t / "metrics/launch.json").read_text())
    assert lm["runtime/summary/finished"] == 1 and lm["runtime/summary/iterations"] == rt["iterations"]
    assert lm["runtime/summary/prompts_trained"] == rt["iterations"] * rt["global_batch_prompts"]
    iterations = pd.read_parquet(t / "outputs/launch/iterations.parquet")
    assert iterations.step.tolist() == [1, 2, 3]
    assert (iterations["train/prompts"] == rt["global_batch_prompts"]).all()
    minibatches = pd.read_parquet(t / "outputs/launch/minibatches.parquet")
    assert lm["runtime/summary/minibatches"] == len(minibatches)
    assert minibatches.prompts.sum() >= lm["runtime/summary/prompts_trained"]
    summary = json.loads((t / "outputs/launch/summary.json").read_text())
    assert summary["metrics"] == lm and summary["trainer_step"] == rt["iterations"]
    assert summary["mlflow_run_id"] == run_id
    runtime = {
        k: v for k, v in lm.items() if k not in ("runtime/summary/finished", "runtime/summary/resumed_from_step")
    }
    assert _logged(run_id, runtime) == _numeric(runtime)
    history = MlflowClient().get_metric_history(run_id, "runtime/iteration_time_s")
    assert [m.step for m in history] == [1, 2, 3]
    assert [m.value for m in history] == pytest.approx(iterations["runtime/iteration_time_s"].tolist())


def _resume_keeps_chunks(params, p, full: pd.DataFrame) -> None:
    prompts = profile.load_profile_prompts(p.prompts)
    ref = json.loads((p.policy / "policy.json").read_text())
    work = p.work_dir / profile.run_key(prompts, params.profile, ref, params.common.seed)
    work.mkdir(parents=True)
    engine = profile_engine(params.profile, policy_model_path(p.policy), params.common.seed)
    chunks = profile.profile_chunks(engine, prompts, params.profile, params.common.seed, work)
    assert len(chunks) == 5  # 9 minibatches of 16 prompts, 2 per chunk
    first = chunks[0].stat().st_mtime_ns
    chunks[1].unlink()  # as if killed before chunk 1 finished
    profile.profile_chunks(engine, prompts, params.profile, params.common.seed, work)
    assert chunks[0].stat().st_mtime_ns == first and chunks[1].is_file()
    again = pd.concat([profile.read_chunk(c)[0] for c in chunks], ignore_index=True)
    pd.testing.assert_frame_equal(again, full)  # same seeds per minibatch: identical samples
    chunks[2].write_bytes(b"not parquet")
    with pytest.raises(UserError, match="corrupt profiling chunk"):
        profile.read_chunk(chunks[2])


def _grpo_launch_resumes_in_the_same_mlflow_run(tmp_path: Path, paths: launch.Paths) -> None:
    """`trainer.kind: grpo` through `run_stage` (as `asp stage launch`): interrupted after step 2 (KeyboardInterrupt in
    the driver, as Ctrl-C), rerun: it resumes in the same MLflow run and the summary covers all 5 steps."""
    import yaml

    grpo_runtime = {
        "iterations": 5,
        "checkpoint_interval": 1,
        "grpo": {"lr": 1e-3, "num_threads": 1, "micro_batch_tokens": 2048},
        "queue": {"max_policy_lag": 2},
        "trainer": {"kind": "grpo"},
    }
    raw = tiny_params(LEARNING_POLICY, {"runtime": grpo_runtime, "common": {"experiment": "e2e-grpo"}})
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw))
    history = paths.state_dir / "C4" / HISTORY_FILE
    history.unlink(missing_ok=True)

    def stage() -> dict:
        return run_stage("launch", launch.run, paths, tmp_path / "params.yaml", resume_run=launch.resume_run_id)

    record = Recorder.__call__

    def ctrl_c_after_step_2(self: Recorder, cu: object, metrics: dict) -> None:
        record(self, cu, metrics)
        if cu.step == 2:  # the driver's main thread, between steps: where a Ctrl-C lands
            raise KeyboardInterrupt

    Recorder.__call__ = ctrl_c_after_step_2
    try:
        with pytest.raises(KeyboardInterrupt):
            stage()
    finally:
        Recorder.__call__ = record
    run_id = json.loads((paths.state_dir / "C4" / RUN_FILE).read_text())["run_id"]
    client = MlflowClient()
    assert client.get_run(run_id).info.status == "KILLED"
    state = json.loads((paths.state_dir / "C4/runtime_state.json").read_text())
    assert state["trainer_step"] == 2 and not state["finished"]
    assert len(history.read_text().splitlines()) == 2

    metrics = stage()
    summary = json.loads((paths.out_dir / "summary.json").read_text())
    assert summary["mlflow_run_id"] == run_id and summary["resume_reason"] == "resumed"
    assert metrics["runtime/summary/resumed_from_step"] == state["trainer_step"]
    assert metrics["grpo/iterations"] == 5 and metrics["grpo/lag_max"] <= 2  # the whole run, lag bounded
    for key in ("grpo/reward_first_20pct", "grpo/T_train_s", "grpo/T_gen_s", "grpo/d_off_estimate_mean"):
        assert np.isfinite(metrics[key]), key
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.params["runtime.trainer.kind"] == "grpo"
    steps = [m.step for m in client.get_metric_history(run_id, "train/reward_mean")]
    assert set(steps) == {1, 2, 3, 4, 5}  # one curve across both sessions, steps continuing
    assert len(pd.read_parquet(paths.out_dir / "iterations.parquet")) == 5
    trained = sorted((paths.state_dir / "C4/trainer").iterdir())
    assert trained[-1].name == "step-00000005" and (trained[-1] / "model.safetensors").is_file()
