"""End to end on the tiny demo policy (slow): a GRPO `launch` with the drift watch on finds that the predictor's
lengths are not this policy's, stops, is re-profiled and resumes with the new schedule.

The drift is real, not injected: the predictor (and its calibration) were fitted to demo reference lengths
(5 * steps + 9 tokens, up to ~60), while the tiny policy's responses are capped at 24 tokens, so the calibration
bias (realized / calibrated prediction) is far below the band and the detector fires on the first window.

1. Hand-off (``ASP_DRIFT_HANDOFF=1``, what the Prefect loop sets): the stage ends after the drift event with a
   resumable checkpoint and ``drift_pending.json``.
2. ``asp reprofile`` from the shell (standalone) profiles the current policy snapshot on remaining prompts,
   fine-tunes the predictor from the current adapter, passes the (open) gate and registers version 2.
3. ``launch`` again resumes from the checkpoint, applies v2 (minibatch records carry predictor_version 2) and
   finishes: every prompt trained exactly once (lost 0, duplicated 0).
4. In-process: a fresh run with the same settings re-profiles inside the stage and resumes in the same MLflow
   run; the registry gains another version.
5. A closed gate (``evaluate.min_tau`` 1.0): the in-process re-profile is rejected, the stage says it keeps the
   current schedule, and the run continues to the end on it (predictor version 1, nothing lost).
"""

from __future__ import annotations

import json
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml

from asp.demo.task import generate_problems, intended_length
from asp.io import read_json
from asp.pipeline import evaluate, launch, predict
from asp.schedule import schedule_to_frame
from asp.steps.loaders import load_policy_tokenizer
from asp.steps.paths import rebase
from asp.tracking import MlflowTracker, end_run, predictor_versions
from tests.schedules import tiny_schedule

from .conftest import TINY_PREDICTOR, Built, chat_template, make_params, write_prompts

pytestmark = pytest.mark.slow

N_TRAIN = 48
OVERLAY: dict[str, Any] = {
    "predictor": TINY_PREDICTOR,
    "profile": {"n_samples": 2, "max_new_tokens": 24, "minibatch_prompts": 12},
    "schedule": {"b": 2, "kappa": 0, "k": 2, "iterations": 200},
    "evaluate": {"min_tau": -1.0},  # the one-epoch tiny predictor: the gate is exercised, not the predictor
    "runtime": {
        "iterations": 12,  # 12 steps x 4 prompts = the 48 prompts once
        "global_batch_prompts": 4,
        "checkpoint_interval": 2,
        "heldout_problems": 0,
        "memory": {"check": False},
        "sampling": {"n_samples": 2, "max_new_tokens": 24},
        "queue": {"q_max": 8},
        "ray": {"actors_per_unit": 1, "placement": "none"},
        "trainer": {"kind": "grpo"},
    },
    "drift": {
        "enabled": True,
        "action": "reprofile",
        "window": 2,
        "min_prompts": 4,
        "patience": 1,
        "max_actions": 1,
        "reprofile_prompts": 24,
        "reprofile_epochs": 1,
    },
}


@pytest.fixture(scope="module")
def project(
    tmp_path_factory: pytest.TempPathFactory,
    demo_policy: Built,
    trained_predictor: Built,
    new_tracker: Callable[[str], MlflowTracker],
) -> dict[str, Any]:
    """A project directory in the repository layout: policy, prompts, predictor, calibration, predictions,
    schedule and metrics/predictor.json (evaluate registers predictor version 1), plus params.yaml."""
    root = tmp_path_factory.mktemp("drift_e2e")
    name = f"drift-e2e-{uuid.uuid4().hex[:8]}"
    params = make_params({**OVERLAY, "drift": {**OVERLAY["drift"], "registry_model": name}})
    (root / "outputs").mkdir()
    (root / "outputs/policy").symlink_to(demo_policy.paths.out_dir.resolve())
    (root / "outputs/predictor").symlink_to(trained_predictor.paths.out_dir.resolve())
    tok = load_policy_tokenizer(root / "outputs/policy")
    records = generate_problems(N_TRAIN, seed=21)
    write_prompts(root / "outputs/prompts", records, {"train": list(range(N_TRAIN))}, chat_template(tok))

    inputs = trained_predictor.extra["root"]
    tracker = new_tracker("evaluate")
    evaluate.run(
        params,
        rebase(
            evaluate.Paths(
                prompts=inputs / "prompts", profile=inputs / "profile", predictor=Path("outputs/predictor")
            ),
            root,
        ),
        tracker,
    )
    end_run(tracker)
    tracker = new_tracker("predict")
    predict.run(params, rebase(predict.Paths(), root), tracker)
    end_run(tracker)
    preds = pd.read_parquet(root / "outputs/predictions.parquet")
    sched = tiny_schedule(preds["prompt_id"].to_numpy(), preds["calibrated_length"].to_numpy())
    (root / "outputs/schedule").mkdir()
    schedule_to_frame(sched).to_parquet(root / "outputs/schedule/schedule.parquet", index=False)
    (root / "params.yaml").write_text(yaml.safe_dump(params.model_dump(mode="json")))
    assert max(intended_length(r) for r in records) > 24  # the predictor's world is longer than the policy's cap
    return {"root": root, "params": params, "name": name}


def _launch(project: dict[str, Any], tracker: MlflowTracker) -> dict[str, Any]:
    return launch.run(project["params"], rebase(launch.Paths(), project["root"]), tracker)


def _cli(*args: str) -> int:
    from asp.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(list(args))
    return exit_info.value.code


def _plan_versions(root: Path) -> set[int]:
    """Predictor versions whose schedule made the minibatches of the last session; minibatches.parquet covers the
    whole run, a ``session`` column each. No recalibration happens here, so each predictor switch is a new plan
    version; a history-aware pass boundary (runtime.history) makes another plan with the same predictor, so the
    plan version is at least the predictor version."""
    rows = pd.read_parquet(root / "outputs/launch/minibatches.parquet")
    rows = rows[rows["session"] == rows["session"].max()]
    assert (rows["plan_version"] >= rows["predictor_version"]).all()
    return set(rows["predictor_version"])


def test_drift_stops_reprofiles_standalone_and_resumes_exactly_once(
    project: dict[str, Any],
    ray_cluster: Any,
    new_tracker: Callable[[str], MlflowTracker],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
) -> None:
    root, name = project["root"], project["name"]
    state = root / "outputs/launch_state/C4"
    monkeypatch.chdir(root)

    # 1. hand-off: the stage ends after the drift event with a resumable checkpoint
    monkeypatch.setenv("ASP_DRIFT_HANDOFF", "1")
    tracker = new_tracker("launch")
    first = _launch(project, tracker)
    assert first["drift/summary/handoff"] == 1 and first["runtime/summary/finished"] == 0
    assert first["drift/summary/events"] >= 1 and first["drift/summary/first_event_step"] >= 0
    pending = read_json(state / "drift_pending.json")
    assert "calibration bias" in pending["message"]
    assert not read_json(state / "runtime_state.json")["finished"]
    run_id = tracker.run_id
    end_run(tracker)

    # 2. `asp reprofile` from the shell: v2 accepted and registered
    monkeypatch.delenv("ASP_DRIFT_HANDOFF")
    code = _cli("reprofile", "--params", str(root / "params.yaml"), "--state-dir", str(state), "--reason", "test")
    out = capsys.readouterr().out
    assert code == 0, out
    report = read_json(state / "predictors/v2/report.json")
    stopped_at = read_json(root / "outputs/launch/summary.json")["trainer_step"]
    assert report["accepted"] and report["reason"] == "test" and report["policy_step"] == stopped_at
    assert [v["version"] for v in predictor_versions(name)] == [1, 2]

    # 3. launch resumes from the checkpoint, applies v2 and finishes exactly once
    tracker = new_tracker("launch")
    second = _launch(project, tracker)
    end_run(tracker)
    assert second["runtime/summary/finished"] == 1 and second["runtime/summary/resumed_from_step"] == stopped_at
    assert second["drift/summary/predictor_version_final"] == 2
    assert second["drift/summary/lost_prompts"] == 0 and second["drift/summary/duplicated_prompts"] == 0
    assert _plan_versions(root) == {2}  # the resumed session ran on the re-profiled schedule
    assert (root / "plots/launch_drift.png").stat().st_size > 10_000
    assert run_id

    # 4. in-process: a fresh run re-profiles inside the stage and resumes in the same MLflow run
    shutil.rmtree(state)
    tracker = new_tracker("launch")
    third = _launch(project, tracker)
    end_run(tracker)
    assert third["runtime/summary/finished"] == 1 and third["drift/summary/handoff"] == 0
    assert third["drift/summary/reprofiles"] == 1 and third["drift/summary/reprofile_accepted"] == 1
    assert third["drift/summary/lost_prompts"] == 0 and third["drift/summary/duplicated_prompts"] == 0
    assert third["drift/summary/predictor_version_final"] == 2
    assert _plan_versions(root) == {2}
    assert [v["version"] for v in predictor_versions(name)] == [1, 2, 3]
    metrics = tracker.client.get_run(tracker.run_id).data.metrics
    assert metrics["reprofile/accepted"] == 1 and "drift/bias_window" in metrics
    saved = json.loads((root / "metrics/launch.json").read_text())
    assert saved["drift/summary/reprofiles"] == 1


@pytest.mark.extended  # the rejected report itself: tests/pipeline/test_reprofile.py (closed gate)
def test_a_rejected_reprofile_keeps_the_schedule_and_the_run_continues(
    project: dict[str, Any],
    ray_cluster: Any,
    new_tracker: Callable[[str], MlflowTracker],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
) -> None:
    root = project["root"]
    monkeypatch.chdir(root)
    monkeypatch.delenv("ASP_DRIFT_HANDOFF", raising=False)
    shutil.rmtree(root / "outputs/launch_state", ignore_errors=True)
    closed = project["params"].model_copy(
        update={"evaluate": project["params"].evaluate.model_copy(update={"min_tau": 1.0})}
    )
    tracker = new_tracker("launch")
    metrics = launch.run(closed, rebase(launch.Paths(), root), tracker)
    end_run(tracker)
    err = capsys.readouterr().err
    assert "rejected" in err and "keeping the current schedule" in err
    assert metrics["runtime/summary/finished"] == 1 and metrics["drift/summary/reprofiles"] == 1
    assert metrics["drift/summary/reprofile_accepted"] == 0 and metrics["drift/summary/predictor_version_final"] == 1
    assert metrics["drift/summary/lost_prompts"] == 0 and metrics["drift/summary/duplicated_prompts"] == 0
    assert _plan_versions(root) == {1}
    report = read_json(root / "outputs/launch_state/C4/predictors/v2/report.json")
    assert report["accepted"] is False and report["min_tau"] == 1.0


@pytest.mark.extended  # the stop and resume above (reprofile); refit_from_run: tests/pipeline/test_reprofile.py
def test_refit_from_run_refits_in_process_without_generating_and_resumes(
    project: dict[str, Any],
    ray_cluster: Any,
    new_tracker: Callable[[str], MlflowTracker],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
) -> None:
    """drift.action refit_from_run: the stage stops at the next checkpoint (step 4: 16 prompts trained, their
    lengths in the checkpoint's history), fine-tunes the predictor on them in-process (no generation), registers
    the version with its held-out tau and resumes on its schedule in the same MLflow run."""
    from asp.adaptation import reprofile as generation

    root, name = project["root"], project["name"]
    monkeypatch.chdir(root)
    monkeypatch.delenv("ASP_DRIFT_HANDOFF", raising=False)
    monkeypatch.setattr(generation, "profile_lengths", None)  # generating would fail
    shutil.rmtree(root / "outputs/launch_state", ignore_errors=True)
    base = project["params"]
    params = base.model_copy(
        update={
            "drift": base.drift.model_copy(update={"action": "refit_from_run", "refit_min_prompts": 8}),
            "runtime": base.runtime.model_copy(update={"checkpoint_interval": 4}),
        }
    )
    tracker = new_tracker("launch")
    metrics = launch.run(params, rebase(launch.Paths(), root), tracker)
    end_run(tracker)
    assert metrics["runtime/summary/finished"] == 1 and metrics["drift/summary/reprofiles"] == 1
    assert metrics["drift/summary/reprofile_accepted"] == 1 and metrics["drift/summary/predictor_version_final"] == 2
    assert metrics["drift/summary/lost_prompts"] == 0 and metrics["drift/summary/duplicated_prompts"] == 0
    assert _plan_versions(root) == {2}  # the resumed session ran on the refitted predictor's schedule
    report = read_json(root / "outputs/launch_state/C4/predictors/v2/report.json")
    assert report["accepted"] and report["source"] == "run" and report["generated_tokens"] == 0
    assert report["policy_step"] == 4 and report["eval_prompts"] + report["fit_prompts"] == 16
    newest = predictor_versions(name)[-1]
    assert newest["version"] == report["registry"]["version"] and newest["tags"]["run_id"] == tracker.run_id
    assert float(newest["tags"]["kendall_tau"]) == pytest.approx(report["kendall_tau"])
    logged = tracker.client.get_run(tracker.run_id).data.metrics
    assert logged["reprofile/accepted"] == 1 and logged["reprofile/generated_tokens"] == 0
