"""Re-profiling a stopped launch run (`asp.adaptation.reprofile`, `asp reprofile`) on the tiny demo policy and the
one-epoch MiniLM predictor: 48 training prompts in a 24-minibatch schedule (b 2, k 2), a runtime checkpoint that
trained the first 5 minibatches and half of the 6th (37 prompts remain) and a trainer checkpoint at step 3.

An accepted re-profile (gate open) writes v2 whose rest plan covers exactly the remaining prompts and whose full
plan covers every training prompt, reads back with `latest_accepted`, and registers the predictor as version 2 next
to the evaluate stage's version 1 (with their tags). A closed gate (`asp reprofile --set evaluate.min_tau=1.0
--strict`) exits 1 and writes an accepted=false report and no plans; a finished run has nothing left to
re-schedule; no checkpoint exits 2 naming the directory. After v2 is applied (`Database.replan`) and the run trains
on, a second re-profile warm-starts from v2 and makes v3 whose rest plan covers the prompts then remaining.
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import yaml
from safetensors.torch import load_file, save_file

from asp.adaptation import reprofile
from asp.adaptation.versions import Accepted, latest_accepted
from asp.control.database import Database
from asp.demo.task import generate_problems, intended_length
from asp.errors import UserError
from asp.io import read_json
from asp.pipeline import evaluate, launch
from asp.runtime import RuntimeConfig, WorkPlan, make_checkpointer
from asp.schedule import schedule_to_frame
from asp.steps.launch_state import fingerprint_extra
from asp.steps.loaders import load_policy_tokenizer, policy_model_path
from asp.steps.paths import rebase
from asp.tracking import MlflowTracker, NullTracker, end_run, predictor_versions
from tests.schedules import tiny_schedule

from .conftest import TINY_PREDICTOR, Built, chat_template, make_params, write_prompts

N_TRAIN, DONE_MINIBATCHES = 48, 5
OVERLAY = {
    "predictor": TINY_PREDICTOR,
    "profile": {"n_samples": 2, "max_new_tokens": 24, "minibatch_prompts": 12},
    "schedule": {"b": 2, "kappa": 0, "k": 2, "iterations": 200},
    "drift": {"reprofile_prompts": 24, "reprofile_epochs": 1},
    "evaluate": {"min_tau": -1.0},
}


@pytest.fixture(scope="module")
def pipeline(
    tmp_path_factory: pytest.TempPathFactory,
    demo_policy: Built,
    trained_predictor: Built,
    new_tracker: Callable[[str], MlflowTracker],
) -> dict[str, Any]:
    """Pipeline outputs under `root` (repository layout), the evaluate stage's registry version 1 and a pristine
    state directory with the runtime and trainer checkpoints."""
    root = tmp_path_factory.mktemp("reprofile")
    name = f"reprofile-test-{uuid.uuid4().hex[:8]}"
    params = make_params({**OVERLAY, "drift": {**OVERLAY["drift"], "registry_model": name}})
    paths = rebase(launch.Paths(), root)
    (root / "outputs").mkdir()
    (root / "outputs/policy").symlink_to(demo_policy.paths.out_dir.resolve())
    (root / "outputs/predictor").symlink_to(trained_predictor.paths.out_dir.resolve())
    tok = load_policy_tokenizer(paths.policy)
    records = generate_problems(N_TRAIN, seed=11)
    roles = {"train": list(range(N_TRAIN))}
    prompts = write_prompts(paths.prompts.parent, records, roles, chat_template(tok))["train"]
    sched = tiny_schedule(prompts["prompt_id"].to_numpy(), [intended_length(r) for r in records])
    paths.schedule.parent.mkdir(parents=True)
    schedule_to_frame(sched).to_parquet(paths.schedule, index=False)

    inputs = trained_predictor.extra["root"]
    eval_paths = rebase(
        evaluate.Paths(prompts=inputs / "prompts", profile=inputs / "profile", predictor=paths.predictor), root
    )
    tracker = new_tracker("evaluate")
    evaluate.run(params, eval_paths, tracker)
    end_run(tracker)

    plan = WorkPlan.from_frame(pd.read_parquet(paths.schedule))
    template = root / "state_template"
    consumed = {str(t): len(plan.minibatches[t]) for t in range(DONE_MINIBATCHES)} | {str(DONE_MINIBATCHES): 1}
    ckpt = make_checkpointer(plan, RuntimeConfig.from_params(params), template, fingerprint_extra(params.runtime))
    ckpt.save(
        database={"epochs_created": 1, "consumed": consumed},
        trainer_step=3,
        policy_version=3,
        trainer_state={},
        finished=False,
    )
    weights = load_file(str(policy_model_path(paths.policy) / "model.safetensors"))
    (template / "trainer/step-00000003").mkdir(parents=True)
    save_file(weights, str(template / "trainer/step-00000003/model.safetensors"))
    trained = {pid for t in range(DONE_MINIBATCHES) for pid in plan.minibatches[t]}
    trained.add(plan.minibatches[DONE_MINIBATCHES][0])
    remaining = [pid for pid in plan.prompt_ids() if pid not in trained]
    return {"root": root, "params": params, "paths": paths, "template": template, "remaining": remaining, "name": name}


def _state_dir(pipeline: dict[str, Any], tmp_path: Path) -> Path:
    state = tmp_path / "launch_state" / "C4"
    shutil.copytree(pipeline["template"], state)
    return state


@pytest.mark.slow
def test_accepted_reprofile_schedules_exactly_the_remaining_prompts_and_registers_v2(
    pipeline: dict[str, Any], tmp_path: Path, new_tracker: Callable[[str], MlflowTracker]
) -> None:
    state = _state_dir(pipeline, tmp_path)
    tracker = new_tracker("launch")
    result = reprofile.reprofile(pipeline["params"], state, tracker, reason="drift", paths=pipeline["paths"])
    end_run(tracker)

    assert result.accepted and result.version == 2 and result.policy_step == 3 and result.prompts == 24
    assert result.directory == state / "predictors" / "v2" and np.isfinite(result.tau)
    files = {p.name for p in result.directory.iterdir()}
    assert {
        "profile.parquet",
        "predictor",
        "calibration.json",
        "predictions.parquet",
        "rest.parquet",
        "full.parquet",
        "report.json",
    } == files
    rest = WorkPlan.from_frame(pd.read_parquet(result.directory / "rest.parquet"))
    full = WorkPlan.from_frame(pd.read_parquet(result.directory / "full.parquet"))
    remaining = pipeline["remaining"]
    assert len(remaining) == 37 and sorted(rest.prompt_ids()) == sorted(remaining)
    assert sorted(full.prompt_ids()) == [f"q{i:03d}" for i in range(N_TRAIN)]
    profiled = pd.read_parquet(result.directory / "profile.parquet")
    assert set(profiled["prompt_id"]) <= set(remaining) and profiled["prompt_id"].is_unique
    assert profiled["role"].value_counts().to_dict() == {"eval": 8, "train": 14, "val": 2}
    report = read_json(result.directory / "report.json")
    assert report["accepted"] and report["reason"] == "drift" and report["base_version"] == 1
    assert report["remaining_prompts"] == 37 and report["registry"] == {"name": pipeline["name"], "version": 2}
    assert report["tau"] == report["kendall_tau"] == pytest.approx(result.tau) and report["seconds"] > 0
    assert 0.5 < report["bias_reference"] < 2 and report["bias_reference_se"] > 0  # the drift watch's new reference

    accepted = latest_accepted(state)
    assert accepted is not None and accepted.version == 2 and accepted.rest == rest and accepted.full == full
    assert len(accepted.predictions) == N_TRAIN

    found = predictor_versions(pipeline["name"])
    assert [v["version"] for v in found] == [1, 2]
    v1, v2 = (v["tags"] for v in found)
    assert v1["predictor_version"] == "1" and v1["policy_step"] == "0" and float(v1["kendall_tau"]) > -1
    assert v2["predictor_version"] == "2" and v2["policy_step"] == "3" and v2["run_id"] == tracker.run_id
    assert float(v2["kendall_tau"]) == pytest.approx(result.tau)
    assert found[1]["source"].endswith("predictors/v2/predictor")
    metrics = tracker.client.get_run(tracker.run_id).data.metrics
    assert metrics["reprofile/accepted"] == 1 and metrics["reprofile/version"] == 2

    pending = _apply_and_train(pipeline, state, accepted)  # the run goes on with v2's plan, then stops again
    again = reprofile.reprofile(pipeline["params"], state, tracker, paths=pipeline["paths"])  # warm start from v2
    assert again.accepted and again.version == 3 and read_json(again.directory / "report.json")["base_version"] == 2
    rest3 = WorkPlan.from_frame(pd.read_parquet(again.directory / "rest.parquet"))
    assert len(pending) < 37 and sorted(rest3.prompt_ids()) == sorted(pending)
    assert [v["version"] for v in predictor_versions(pipeline["name"])] == [1, 2, 3]
    assert latest_accepted(state).version == 3


def _apply_and_train(pipeline: dict[str, Any], state: Path, accepted: Accepted) -> list[Any]:
    """Restore the run's Database, replan it with `accepted` (as launch's on_start does), train the next dispatch
    unit and checkpoint at step 5; returns the prompts then remaining."""
    params = pipeline["params"]
    plan = WorkPlan.from_frame(pd.read_parquet(pipeline["paths"].schedule))
    prompts = pd.read_parquet(pipeline["paths"].prompts)
    db = Database(
        plan, dict(zip(prompts["prompt_id"], prompts["prompt"], strict=True)), epochs=1, max_attempts=3, seed=0
    )
    db.restore(read_json(state / "runtime_state.json")["database"])
    assert db.replan(accepted.rest, accepted.full) == 2
    for item in db.next_unit(0):
        db.complete(item.task_id)
        db.mark_consumed(item.task_id, len(item.prompt_ids))
    ckpt = make_checkpointer(plan, RuntimeConfig.from_params(params), state, fingerprint_extra(params.runtime))
    ckpt.save(database=db.state(), trainer_step=5, policy_version=5, trainer_state={}, finished=False)
    return db.pending_prompts()


def _cli(*args: str) -> int:
    from asp.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(list(args))
    return exit_info.value.code


def test_closed_gate_writes_a_rejected_report_and_no_plans(
    pipeline: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    state = _state_dir(pipeline, tmp_path)
    params = pipeline["root"] / "params.yaml"
    params.write_text(yaml.safe_dump(pipeline["params"].model_dump(mode="json")))
    monkeypatch.chdir(pipeline["root"])
    experiment = f"reprofile-cli-{uuid.uuid4().hex[:8]}"
    code = _cli(
        "reprofile",
        "--params",
        str(params),
        "--state-dir",
        str(state),
        "--strict",
        "--set",
        "evaluate.min_tau=1.0",
        "--set",
        f"common.experiment={experiment}",
    )
    out = capsys.readouterr().out
    assert code == 1, out
    version = state / "predictors" / "v2"
    assert {p.name for p in version.iterdir()} == {"profile.parquet", "report.json"}
    report = read_json(version / "report.json")
    assert report["accepted"] is False and report["min_tau"] == 1.0 and "below evaluate.min_tau" in report["message"]
    assert "| accepted | false |" in out and "rejected" in out
    assert latest_accepted(state) is None
    from mlflow import MlflowClient

    client = MlflowClient()
    (run,) = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    assert run.info.status == "FAILED"  # --strict's exit 1 is a failure in MLflow too (it said FINISHED)


def test_a_finished_run_has_nothing_left_to_reschedule(pipeline: dict[str, Any], tmp_path: Path) -> None:
    state = _state_dir(pipeline, tmp_path)
    plan = WorkPlan.from_frame(pd.read_parquet(pipeline["paths"].schedule))
    params = pipeline["params"]
    ckpt = make_checkpointer(plan, RuntimeConfig.from_params(params), state, fingerprint_extra(params.runtime))
    everything = {str(t): len(mb) for t, mb in enumerate(plan.minibatches)}
    ckpt.save(
        database={"epochs_created": 1, "consumed": everything},
        trainer_step=12,
        policy_version=12,
        trainer_state={},
        finished=True,
    )
    with pytest.raises(UserError, match="the run finished: nothing left to re-schedule"):
        reprofile.reprofile(params, state, NullTracker(), paths=pipeline["paths"])
    assert not (state / "predictors").exists()


def test_no_checkpoint_exits_2_naming_the_directory(
    pipeline: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(pipeline["params"].model_dump(mode="json")))
    monkeypatch.chdir(pipeline["root"])
    empty = tmp_path / "nothing"
    assert _cli("reprofile", "--params", str(params), "--state-dir", str(empty)) == 2
    err = capsys.readouterr().err
    assert f"error: {empty}: no runtime checkpoint" in err and "Traceback" not in err


# ---- refit_from_run: the same new version without generation, from the run's own realized lengths ---------------
REFIT_DONE = 16  # minibatches of 2 trained before the stop: 32 prompts with realized lengths, 16 remaining


def _refit_state(pipeline: dict[str, Any], tmp_path: Path, done: int = REFIT_DONE) -> tuple[Path, list[Any]]:
    """A stopped run that trained the first `done` minibatches (steps of 4 prompts) with runtime.history on: its
    checkpoint holds each trained prompt's realized lengths (2 samples at the policy version of its step, around
    its demo reference length). No trainer weights: the refit loads none. Returns the state directory and the
    trained prompts."""
    params = pipeline["params"]
    plan = WorkPlan.from_frame(pd.read_parquet(pipeline["paths"].schedule))
    prompts = pd.read_parquet(pipeline["paths"].prompts).set_index("prompt_id")
    lengths = {pid: 5.0 * str(prompts.loc[pid, "problem"]).count("+") + 9 for pid in plan.prompt_ids()}
    rng = np.random.default_rng(3)
    trained = [pid for t in range(done) for pid in plan.minibatches[t]]
    history = [[pid, i // 4, 2, lengths[pid] * float(rng.uniform(0.8, 1.25))] for i, pid in enumerate(trained)]
    state = tmp_path / "launch_state" / "C4"
    ckpt = make_checkpointer(plan, RuntimeConfig.from_params(params), state, fingerprint_extra(params.runtime))
    ckpt.save(
        database={
            "epochs_created": 1,
            "consumed": {str(t): len(plan.minibatches[t]) for t in range(done)},
            "history": history,
        },
        trainer_step=len(trained) // 4,
        policy_version=len(trained) // 4,
        trainer_state={},
        finished=False,
    )
    return state, trained


def _reprofile_cli(pipeline: dict[str, Any], state: Path, experiment: str, *args: str) -> int:
    params = pipeline["root"] / "params.yaml"
    params.write_text(yaml.safe_dump(pipeline["params"].model_dump(mode="json")))
    common = ("--params", str(params), "--state-dir", str(state), "--set", f"common.experiment={experiment}")
    return _cli("reprofile", *common, *args)


@pytest.mark.slow
def test_refit_from_run_registers_a_version_with_its_held_out_tau_and_replans_without_generating(
    pipeline: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    from mlflow import MlflowClient

    from asp.adaptation import refit

    state, trained = _refit_state(pipeline, tmp_path)
    monkeypatch.chdir(pipeline["root"])
    monkeypatch.setattr(reprofile, "profile_lengths", None)  # the refit must not generate: calling it fails
    experiment = f"refit-cli-{uuid.uuid4().hex[:8]}"
    code = _reprofile_cli(pipeline, state, experiment, "--from-run", "--set", "drift.refit_min_prompts=16")
    out = capsys.readouterr().out
    assert code == 0, out
    assert "| source | the run's own lengths |" in out and "| accepted | true |" in out

    version = state / "predictors" / "v2"
    files = {p.name for p in version.iterdir()}
    assert files == {"history.parquet", "predictor", "calibration.json", "predictions.parquet", "rest.parquet"} | {
        "full.parquet",
        "report.json",
    }
    used = pd.read_parquet(version / "history.parquet")
    assert sorted(used["prompt_id"]) == sorted(trained)  # 32 < drift.refit_prompts: the whole history
    held = set(used.loc[used["role"] == "eval", "prompt_id"])
    fit = set(used.loc[used["role"] != "eval", "prompt_id"])
    assert len(held) == 11 and not held & fit  # out of sample: the held-out prompts are not fine-tuned on
    report = read_json(version / "report.json")
    assert report["accepted"] and report["source"] == "run" and report["generated_tokens"] == 0
    assert report["eval_prompts"] == 11 and report["fit_prompts"] == 21 and report["truncation_rate"] is None
    assert report["base_version"] == 1 and report["history"] and np.isfinite(report["kendall_tau"])
    assert report["timings_s"]["profile"] == 0.0 and report["timings_s"]["train"] > 0
    rest = WorkPlan.from_frame(pd.read_parquet(version / "rest.parquet"))
    remaining = [pid for pid in WorkPlan.from_frame(pd.read_parquet(pipeline["paths"].schedule)).prompt_ids()]
    remaining = [pid for pid in remaining if pid not in set(trained)]
    assert len(remaining) == 16 and sorted(rest.prompt_ids()) == sorted(remaining)
    assert latest_accepted(state).version == 2  # what the resumed launch applies

    found = predictor_versions(pipeline["name"])
    mine = [v for v in found if v["tags"].get("run_id") not in (None, found[0]["tags"].get("run_id"))]
    assert mine and float(mine[-1]["tags"]["kendall_tau"]) == pytest.approx(report["kendall_tau"])
    assert mine[-1]["tags"]["predictor_version"] == "2" and report["registry"]["version"] == mine[-1]["version"]
    client = MlflowClient()
    (run,) = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    assert run.info.status == "FINISHED" and run.data.metrics["reprofile/accepted"] == 1
    assert run.data.metrics["reprofile/generated_tokens"] == 0 and run.info.run_id == mine[-1]["tags"]["run_id"]
    assert refit.ACTION == "refit_from_run"


@pytest.mark.parametrize(("done", "recorded"), [(0, 0), (REFIT_DONE // 2, 16)])
def test_refit_from_run_with_too_little_history_says_so_and_keeps_the_schedule(
    done: int,
    recorded: int,
    pipeline: dict[str, Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
) -> None:
    if done:
        state, _ = _refit_state(pipeline, tmp_path, done)
    else:
        state = _state_dir(pipeline, tmp_path)  # a checkpoint of a run without runtime.history: no lengths kept
    monkeypatch.chdir(pipeline["root"])
    experiment = f"refit-few-{uuid.uuid4().hex[:8]}"
    sets = ["--set", "drift.refit_min_prompts=20"]
    if not done:
        sets += ["--set", "runtime.history.enabled=false"]
    code = _reprofile_cli(pipeline, state, experiment, "--from-run", "--strict", *sets)
    captured = capsys.readouterr()
    assert code == 1, captured.out
    message = f"the checkpoint holds realized lengths of {recorded} prompts, drift.refit_min_prompts is 20"
    assert message in captured.out and "too little history" in captured.out and "Traceback" not in captured.err
    assert ("runtime.history.enabled is false" in captured.out) == (not done)
    version = state / "predictors" / "v2"
    assert {p.name for p in version.iterdir()} == {"report.json"}  # no predictor, no plans
    assert read_json(version / "report.json")["accepted"] is False and latest_accepted(state) is None


def test_history_targets_weigh_newer_visits_and_choose_the_most_recent_prompts() -> None:
    from asp.adaptation.refit import choose_recent, history_targets
    from asp.schedule.history import LengthHistory

    history = LengthHistory()
    history.add(["a", "b"], np.array([[10.0, 10.0], [40.0, 40.0]]), [0, 0])
    history.add(["a"], np.array([[30.0, 30.0]]), [10])
    history.add(["c"], np.array([[20.0, 20.0]]), [9])
    targets = history_targets(history, 10, drift_per_version=0.1).set_index("prompt_id")
    # a: visits (v0, n 2, 10) weight 1/(1/2 + 0.1 * 10) = 2/3 and (v10, n 2, 30) weight 2 -> (20/3 + 60) / (8/3) = 25
    assert targets.loc["a", "mean_length"] == pytest.approx(25.0) and targets.loc["a", "samples"] == 4
    assert targets.loc["b", "mean_length"] == pytest.approx(40.0) and targets.loc["a", "visits"] == 2
    assert targets["newest_version"].to_dict() == {"a": 10, "b": 0, "c": 9}
    assert list(choose_recent(targets.reset_index(), 2, seed=0)["prompt_id"]) == ["a", "c"]
    assert len(choose_recent(targets.reset_index(), 10, seed=0)) == 3
    assert history_targets(LengthHistory(), 3, 0.01).empty


def test_refit_from_run_needs_the_history_the_launch_keeps() -> None:
    """Refused when the params are validated, before any stage (tests/test_values_before_the_run.py)."""
    with pytest.raises(UserError, match=r"runtime.history.enabled is false.*drift.action: reprofile"):
        make_params({"drift": {"action": "refit_from_run"}, "runtime": {"history": {"enabled": False}}})
