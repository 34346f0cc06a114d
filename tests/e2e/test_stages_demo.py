"""Every stage's `run` on the demo task with tiny params, chained through files in a temporary directory,
logged to a temporary SQLite MLflow store; then a killed profile run resumes from its saved chunks."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from mlflow import MlflowClient

from asp.config import deep_merge, validate_params
from asp.errors import UserError
from asp.pipeline import evaluate, launch, policy, predict, prepare, profile, schedule, train_predictor
from asp.pipeline.loaders import policy_model_path
from asp.stage import run_stage
from asp.tracking import NullTracker, open_tracker

from .conftest import TINY


def _paths(t: Path) -> dict[str, object]:
    return {
        "policy": policy.Paths(out_dir=t / "policy", metrics=t / "m/policy.json"),
        "prepare": prepare.Paths(policy=t / "policy", out_dir=t / "prompts", metrics=t / "m/prepare.json"),
        "profile": profile.Paths(
            policy=t / "policy",
            prompts=t / "prompts",
            out_dir=t / "profile",
            work_dir=t / "work",
            metrics=t / "m/profile.json",
            plot=t / "p/profile.png",
        ),
        "train_predictor": train_predictor.Paths(
            prompts=t / "prompts",
            profile=t / "profile",
            out_dir=t / "pred",
            metrics=t / "m/train.json",
            plot=t / "p/curves.png",
        ),
        "evaluate": evaluate.Paths(
            prompts=t / "prompts",
            profile=t / "profile",
            predictor=t / "pred",
            calibration=t / "cal.json",
            metrics=t / "m/predictor.json",
            plot=t / "p/sc.png",
        ),
        "predict": predict.Paths(
            prompts=t / "prompts/train.parquet",
            predictor=t / "pred",
            calibration=t / "cal.json",
            out=t / "predictions.parquet",
            metrics=t / "m/pr.json",
        ),
        "schedule": schedule.Paths(
            predictions=t / "predictions.parquet",
            calibration=t / "cal.json",
            profile=t / "profile/prompts.parquet",
            out_dir=t / "schedule",
            metrics=t / "m/schedule.json",
            plot=t / "p/sched.png",
            ablation_csv=t / "p/ablation.csv",
        ),
        "launch": launch.Paths(
            policy=t / "policy",
            prompts=t / "prompts/train.parquet",
            schedule=t / "schedule/schedule.parquet",
            predictions=t / "predictions.parquet",
            calibration=t / "cal.json",
            out_dir=t / "launch",
            state_dir=t / "launch_state",
            metrics=t / "m/launch.json",
            plot=t / "p/launch.png",
        ),
    }


STAGES = {
    "policy": policy,
    "prepare": prepare,
    "profile": profile,
    "train_predictor": train_predictor,
    "evaluate": evaluate,
    "predict": predict,
    "schedule": schedule,
    "launch": launch,
}


@pytest.mark.slow
def test_demo_pipeline_end_to_end(tmp_path: Path, _mlflow_store: str) -> None:
    params = validate_params(TINY)
    paths = _paths(tmp_path)
    run_ids = {}
    for name, module in STAGES.items():
        with open_tracker(name, experiment="e2e") as tracker:
            module.run(params, paths[name], tracker)
            run_ids[name] = tracker.run_id

    samples = pd.read_parquet(tmp_path / "profile/samples.parquet")
    assert len(samples) == (96 + 48) * 2 and set(samples.finish_reason) <= {"stop", "length"}
    timings = pd.read_parquet(tmp_path / "profile/timings.parquet")
    assert len(timings) == -(-(96 + 48) // 16) and (timings.wall_s > 0).all()
    preds = pd.read_parquet(tmp_path / "predictions.parquet")
    assert len(preds) == 400 and np.isfinite(preds.predicted_length).all()
    assert np.all(np.diff(preds.sort_values("predicted_length").calibrated_length.to_numpy()) >= -1e-9)
    sched = pd.read_parquet(tmp_path / "schedule/schedule.parquet")
    assert sorted(sched.prompt_id) == sorted(preds.prompt_id)
    metrics = json.loads((tmp_path / "m/predictor.json").read_text())
    assert -1 <= metrics["predictor/kendall_tau"] <= 1 and metrics["predictor/heldout_prompts"] == 48
    sm = json.loads((tmp_path / "m/schedule.json").read_text())
    assert "schedule/ablation/C4/CV" in sm
    for f in ("p/profile.png", "p/curves.png", "p/sc.png", "p/sched.png", "pred/predictor.json"):
        assert (tmp_path / f).is_file(), f

    lm = json.loads((tmp_path / "m/launch.json").read_text())
    assert lm["runtime/summary/finished"] == 1 and lm["runtime/summary/iterations"] == 3
    assert len(pd.read_parquet(tmp_path / "launch/iterations.parquet")) == 3

    client = MlflowClient()
    assert "predictor/kendall_tau" in client.get_run(run_ids["evaluate"]).data.metrics
    assert client.get_run(run_ids["profile"]).data.params["profile.n_samples"] == "2"

    # resume: a finished chunk is kept, a missing one is regenerated, a corrupt one is named
    work_params = validate_params({**TINY, "common": {"seed": 5}})
    p = paths["profile"]
    profile.run(work_params, p, NullTracker())
    full = pd.read_parquet(tmp_path / "profile/samples.parquet")
    key_dir = tmp_path / "work"
    assert not any(key_dir.rglob("chunk_*.parquet"))  # cleaned after success
    _resume_keeps_chunks(work_params, p, full)
    _grpo_launch_resumes_in_the_same_mlflow_run(tmp_path, paths["launch"])


def _resume_keeps_chunks(params, p, full: pd.DataFrame) -> None:
    prompts = profile.load_profile_prompts(p.prompts)
    ref = json.loads((p.policy / "policy.json").read_text())
    work = p.work_dir / profile.run_key(prompts, params.profile, ref, params.common.seed)
    work.mkdir(parents=True)
    engine = profile.make_engine_from_params(params.profile, policy_model_path(p.policy), params.common.seed)
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
    """`trainer: grpo` through `run_stage` (as `asp stage launch`): interrupted after step 2 (KeyboardInterrupt in
    the driver, as Ctrl-C), rerun: it resumes in the same MLflow run and the summary covers all 5 steps."""
    import yaml

    grpo_runtime = {"trainer": "grpo", "iterations": 5, "checkpoint_interval": 1, "max_policy_lag": 2,
                    "grpo": {"lr": 1e-3, "num_threads": 1, "micro_batch_tokens": 2048}}  # fmt: skip
    raw = deep_merge(TINY, {"runtime": grpo_runtime, "common": {"experiment": "e2e-grpo"}})
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw))
    history = paths.state_dir / "C4" / launch.HISTORY_FILE
    history.unlink(missing_ok=True)

    def stage() -> dict:
        return run_stage("launch", launch.run, paths, tmp_path / "params.yaml", resume_run=launch.resume_run_id)

    record = launch.Recorder.__call__

    def ctrl_c_after_step_2(self: launch.Recorder, cu: object, metrics: dict) -> None:
        record(self, cu, metrics)
        if cu.step == 2:  # the driver's main thread, between steps: where a Ctrl-C lands
            raise KeyboardInterrupt

    launch.Recorder.__call__ = ctrl_c_after_step_2
    try:
        with pytest.raises(KeyboardInterrupt):
            stage()
    finally:
        launch.Recorder.__call__ = record
    run_id = json.loads((paths.state_dir / "C4" / launch.RUN_FILE).read_text())["run_id"]
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
    assert run.info.status == "FINISHED" and run.data.params["runtime.trainer"] == "grpo"
    steps = [m.step for m in client.get_metric_history(run_id, "train/reward_mean")]
    assert set(steps) == {1, 2, 3, 4, 5}  # one curve across both sessions, steps continuing
    assert len(pd.read_parquet(paths.out_dir / "iterations.parquet")) == 5
    trained = sorted((paths.state_dir / "C4/trainer").iterdir())
    assert trained[-1].name == "step-00000005" and (trained[-1] / "model.safetensors").is_file()
