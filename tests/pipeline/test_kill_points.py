"""The kill matrix: `launch` and `profile` killed with SIGKILL at each phase boundary, then run again; the rerun
continues what was done (DESIGN.md: nothing trained twice, nothing lost, the same MLflow run).

A stage process (`asp stage <stage>` in a project directory) is killed by the test hook ``ASP_KILL_AT=<point>``
(`asp.runtime.testhooks.kill_point`: it SIGKILLs itself exactly there, no race) and the rerun runs in this process
through the same `run_stage`. Checked after the rerun:

* launch (simulated trainer, one pass of 24 prompts in 6 steps of 4, checkpoints every 2 steps): the trainer's ledger
  (``ASP_TRAINER_LEDGER``) holds steps 1..6 once each and every prompt once; iterations.parquet and
  minibatches.parquet cover the whole run as an unkilled run's do (same steps, same minibatches and prompts); the
  summary counts equal the unkilled run's; there is one MLflow run, the killed attempt's, FINISHED, and every metric
  is logged once per step;
* launch with GRPO, killed mid-run / after training / in the learning curve / after the held-out evaluation: the
  held-out reward and every point of the learning curve are measured once over both attempts (the rerun evaluates
  only the steps the killed attempt did not), the curve holds steps 0, 2, 4, 6, its wall-clock is the run's summed
  iteration time (evaluation counted apart) and its MLflow series are logged once;
* profile (6 prompts in 3 one-minibatch chunks): the rerun generates only the minibatches no saved chunk holds, and
  writes the same samples as an unkilled run, in the killed attempt's MLflow run, FINISHED, metrics logged once.

The stage processes join this session's Ray cluster (`runtime.ray.address`), so no test starts Ray of its own.
`make test` (CI) kills at 6 of the 11 points, one of each kind of rerun; `make test-all` at every point.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml
from mlflow import MlflowClient

from asp.config import Params, deep_merge
from asp.demo.task import generate_problems, intended_length
from asp.pipeline import launch, profile
from asp.runtime.testhooks import KILL_ENV, LEDGER_ENV
from asp.schedule import schedule_to_frame
from asp.stage import run_stage
from asp.steps.launch_state import RUN_FILE
from asp.steps.loaders import load_policy_tokenizer
from asp.tracking import PARENT_ENV
from tests.schedules import tiny_schedule

from .conftest import Built, chat_template, make_params, write_prompts

pytestmark = pytest.mark.slow  # each test runs a stage process to its kill point, then the rerun: 7-30 s

ROOT = Path(__file__).resolve().parents[2]
N_TRAIN, BATCH, STEPS = 24, 4, 6  # one pass: 12 minibatches of 2 prompts, 6 steps of 4 prompts
RUNTIME = {
    "iterations": None,
    "global_batch_prompts": BATCH,
    "checkpoint_interval": 2,
    "heldout_problems": 0,
    "memory": {"check": False},
    "sampling": {"n_samples": 2, "max_new_tokens": 8},
    "queue": {"q_max": 8},
    "control": {"poll_timeout_s": 0.2},
    "ray": {"generation_units": 1, "actors_per_unit": 1, "placement": "none", "actor_num_cpus": 0.25},
    "trainer": {"kind": "simulated", "step_s": 0.0, "refresh_delay_s": 0.0},
}
PROFILE = {"n_samples": 2, "max_new_tokens": 8, "minibatch_prompts": 2, "chunk_minibatches": 1}
GRPO = {
    "heldout_problems": 4,
    "grpo": {
        "lr": 1e-3,
        "num_threads": 1,
        "micro_batch_tokens": 2048,
        "eval_interval": 2,
        "eval_problems": 4,
        "eval_samples": 2,
    },
    "trainer": {"kind": "grpo"},
}
CURVE = [0, 2, 4, 6]  # the learning curve's steps (eval_interval 2 = checkpoint_interval)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory, demo_policy: Built) -> Path:
    """outputs/ of a project: the tiny demo policy, chat-formatted prompts (train; profile + held-out) and a C4
    schedule of the train prompts (b = 2, groups of 2)."""
    root = tmp_path_factory.mktemp("kill_inputs")
    (root / "outputs").mkdir()
    (root / "outputs/policy").symlink_to(demo_policy.paths.out_dir.resolve())
    template = chat_template(load_policy_tokenizer(root / "outputs/policy"))
    records = generate_problems(N_TRAIN, seed=11)
    roles = {"train": list(range(N_TRAIN)), "profile": [0, 1, 2, 3], "heldout": [4, 5]}
    frames = write_prompts(root / "outputs/prompts", records, roles, template)
    ids = frames["train"]["prompt_id"].to_numpy()
    sched = tiny_schedule(ids, [float(intended_length(r)) for r in records])
    (root / "outputs/schedule").mkdir()
    schedule_to_frame(sched).to_parquet(root / "outputs/schedule/schedule.parquet", index=False)
    return root


@pytest.fixture(scope="module")
def ray_address(ray_cluster: Any) -> str:
    """This session's Ray cluster, for the stage processes to join."""
    return ray_cluster.get_runtime_context().gcs_address


def _project(inputs: Path, root: Path, overlay: dict[str, Any]) -> tuple[Path, Params]:
    """A project directory: the inputs (copied: a rerun must not see another test's state), the repository's
    dvc.yaml and stages/, params.yaml with `overlay` and an experiment of its own."""
    shutil.copytree(inputs / "outputs", root / "outputs", symlinks=True)
    shutil.copy(ROOT / "dvc.yaml", root / "dvc.yaml")
    (root / "stages").symlink_to(ROOT / "stages")
    params = make_params({"common": {"experiment": f"kill-{uuid.uuid4().hex[:8]}"}, **overlay})
    (root / "params.yaml").write_text(yaml.safe_dump(params.model_dump(mode="json")))
    return root, params


def _killed(root: Path, stage: str, point: str) -> str:
    """Run `asp stage <stage>` in `root` with ASP_KILL_AT=`point`; it must die by SIGKILL there. Returns its stderr."""
    env = {k: v for k, v in os.environ.items() if k != PARENT_ENV}
    env.update({KILL_ENV: point, LEDGER_ENV: str(root / "ledger.jsonl")})
    out = subprocess.run(
        [sys.executable, "-m", "asp", "stage", stage],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == -signal.SIGKILL, out.stderr[-4000:]
    assert f"[kill point] {point}: SIGKILL" in out.stderr
    return out.stderr


def _rerun(root: Path, stage: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The stage again, in this process, as `asp stage <stage>` runs it."""
    monkeypatch.chdir(root)
    monkeypatch.setenv(LEDGER_ENV, str(root / "ledger.jsonl"))
    monkeypatch.delenv(PARENT_ENV, raising=False)
    module = {"launch": launch, "profile": profile}[stage]
    return run_stage(stage, module.run, module.Paths(), root / "params.yaml", resume_run=module.resume_run_id)


def _runs(params: Params) -> list[Any]:
    client = MlflowClient()
    return client.search_runs([client.get_experiment_by_name(params.common.experiment).experiment_id])


def _logged_once(run_id: str) -> dict[str, list[int]]:
    """Every metric of the run: its steps, checked to hold each step once. Returns key -> steps."""
    client = MlflowClient()
    steps = {}
    for key in client.get_run(run_id).data.metrics:
        steps[key] = sorted(m.step for m in client.get_metric_history(run_id, key))
        assert len(steps[key]) == len(set(steps[key])), (key, steps[key])
    return steps


def _ledger(root: Path) -> list[dict[str, Any]]:
    path = root / "ledger.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


def _outputs(root: Path) -> dict[str, Any]:
    """What an unkilled run and a killed + rerun one must agree on (everything but timings)."""
    iterations = pd.read_parquet(root / "outputs/launch/iterations.parquet")
    minibatches = pd.read_parquet(root / "outputs/launch/minibatches.parquet")
    metrics = json.loads((root / "metrics/launch.json").read_text())
    counts = ("iterations", "prompts_trained", "minibatches", "failed_attempts", "duplicates_dropped", "finished")
    return {
        "steps": iterations["step"].tolist(),
        "prompts_per_step": iterations["train/prompts"].tolist(),
        "minibatches": sorted(map(tuple, minibatches[["task_id", "minibatch_id", "prompts"]].to_numpy().tolist())),
        "counts": {name: metrics[f"runtime/summary/{name}"] for name in counts},
    }


@pytest.fixture(scope="module")
def unkilled(inputs: Path, ray_address: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The launch run nobody killed, through the same `run_stage`."""
    root, _ = _project(
        inputs,
        tmp_path_factory.mktemp("unkilled"),
        {"runtime": deep_merge(RUNTIME, {"ray": {"address": ray_address}})},
    )
    with pytest.MonkeyPatch.context() as mp:
        _rerun(root, "launch", mp)
    return _outputs(root)


LAUNCH_POINTS = {  # point -> what the rerun says it does, and the step it resumes from
    "launch:start": ("fresh run (no checkpoint)", 0),
    "checkpoint@2": ("after step 2", 2),  # mid-run: position 2 saved, its metrics not yet logged
    f"checkpoint@{STEPS}": ("nothing is trained again", 0),  # just after the last step: the finished position
    "launch:trained": ("nothing is trained again", 0),
    "launch:outputs": ("nothing is trained again", 0),
}


# CI (`make test`) kills mid-run (the rerun resumes from the checkpoint); the kill before the first step (a fresh
# rerun: the guard of launch's state is tests/orchestration/test_cancel.py's) and those just after the last step,
# after training and after the outputs (the "nothing is trained again" rerun; a stage killed after its outputs in CI:
# the profile's, below) run in `make test-all`.
EXTENDED = pytest.mark.extended
LAUNCH_CI = ("checkpoint@2",)


@pytest.mark.parametrize("point", [p if p in LAUNCH_CI else pytest.param(p, marks=EXTENDED) for p in LAUNCH_POINTS])
def test_launch_killed_at_a_phase_boundary_continues_exactly_once(
    point: str,
    inputs: Path,
    ray_address: str,
    unkilled: dict[str, Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
) -> None:
    root, params = _project(inputs, tmp_path, {"runtime": deep_merge(RUNTIME, {"ray": {"address": ray_address}})})
    _killed(root, "launch", point)
    run_id = json.loads((root / "outputs/launch_state/C4" / RUN_FILE).read_text())["run_id"]
    metrics = _rerun(root, "launch", monkeypatch)
    says, resumed_from = LAUNCH_POINTS[point]
    assert says in capsys.readouterr().err

    ledger = _ledger(root)
    assert [line["step"] for line in ledger] == list(range(1, STEPS + 1))  # no step trained twice or lost
    assert Counter(p for line in ledger for p in line["prompt_ids"]) == Counter(f"q{i:03d}" for i in range(N_TRAIN))
    assert _outputs(root) == unkilled  # the whole run, as an unkilled run writes it
    assert metrics["runtime/summary/resumed_from_step"] == resumed_from
    summary = json.loads((root / "outputs/launch/summary.json").read_text())
    assert summary["mlflow_run_id"] == run_id and summary["metrics"] == json.loads(
        (root / "metrics/launch.json").read_text()
    )

    (run,) = _runs(params)  # the killed attempt's run, continued and finished
    assert (run.info.run_id, run.info.status) == (run_id, "FINISHED")
    steps = _logged_once(run_id)
    assert steps["runtime/iteration_time_s"] == steps["train/prompts"] == list(range(1, STEPS + 1))
    assert steps["runtime/summary/iterations"] == [STEPS]


GRPO_POINTS = {  # point -> held-out measured by (killed, rerun); the curve steps the rerun evaluates
    "checkpoint@4": ((0, 1), CURVE),  # mid-run: step 2's weights kept by the killed attempt, step 4's by the rerun
    "launch:trained": ((0, 1), CURVE),
    "launch:curve@2": ((0, 1), [4, 6]),  # steps 0 and 2 measured before the kill
    "launch:evaluated": ((1, 0), []),
}
GRPO_CI = ("checkpoint@4",)  # CI: a kill mid-run, the curve resumed; make test-all: every point (a kill mid-curve too)


@pytest.mark.parametrize("point", [p if p in GRPO_CI else pytest.param(p, marks=EXTENDED) for p in GRPO_POINTS])
def test_grpo_launch_killed_measures_heldout_and_learning_curve_once(
    point: str,
    inputs: Path,
    ray_address: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
) -> None:
    root, params = _project(
        inputs, tmp_path, {"runtime": deep_merge(deep_merge(RUNTIME, GRPO), {"ray": {"address": ray_address}})}
    )
    err = _killed(root, "launch", point)
    metrics = _rerun(root, "launch", monkeypatch)
    again = capsys.readouterr().err
    heldout, curve_steps = GRPO_POINTS[point]
    measured = (err.count("held-out reward:"), again.count("held-out reward:"))
    assert measured == heldout, metrics.get("grpo/heldout_note")
    assert (
        metrics["grpo/iterations"] == STEPS
        and ("after step 4" if point == "checkpoint@4" else "nothing is trained again") in again
    )
    assert metrics["grpo/heldout_measured"] == 1 and metrics["grpo/heldout_weights_step"] == STEPS
    trained = sorted(p.name for p in (root / "outputs/launch_state/C4/trainer").iterdir())
    assert trained[-1] == f"step-{STEPS:08d}"

    # the learning curve: every step once, the rerun measuring only what the killed attempt did not
    assert (f"learning curve: steps {curve_steps}" in again) == bool(curve_steps), again[-3000:]
    assert metrics["learning/measured"] == 1 and metrics["learning/evaluations"] == len(CURVE)
    curve = {
        s: {k: metrics[f"learning/curve/step_{s:05d}/{k}"] for k in ("reward", "elapsed_s", "eval_s")} for s in CURVE
    }
    elapsed = [curve[s]["elapsed_s"] for s in CURVE]
    assert elapsed[0] == 0 and elapsed == sorted(set(elapsed))  # increasing: continuous across the resume
    iterations = pd.read_parquet(root / "outputs/launch/iterations.parquet")
    assert elapsed[-1] == pytest.approx(iterations["runtime/iteration_time_s"].sum())  # iteration time only
    assert metrics["learning/eval_seconds"] == pytest.approx(sum(c["eval_s"] for c in curve.values()))
    assert all(c["eval_s"] > 0 and 0 <= c["reward"] <= 1 for c in curve.values())
    assert metrics["learning/final"] == curve[STEPS]["reward"]
    assert (root / "plots/learning_curve.png").stat().st_size > 10_000

    (run,) = _runs(params)
    assert run.info.status == "FINISHED"
    steps = _logged_once(run.info.run_id)
    assert steps["train/reward_mean"] == list(range(1, STEPS + 1)) and steps["grpo/heldout_reward_after"] == [STEPS]
    assert run.data.metrics["grpo/heldout_reward_after"] == metrics["grpo/heldout_reward_after"]
    assert steps["learning/heldout_reward"] == steps["learning/elapsed_s"] == CURVE
    assert steps["learning/heldout_reward_by_ms"] == [round(1000 * e) for e in elapsed]
    client = MlflowClient()
    series = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "learning/heldout_reward")}
    assert series == {s: curve[s]["reward"] for s in CURVE}


@pytest.fixture(scope="module")
def unkilled_profile(inputs: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root, _ = _project(inputs, tmp_path_factory.mktemp("unkilled_profile"), {"profile": PROFILE})
    with pytest.MonkeyPatch.context() as mp:
        _rerun(root, "profile", mp)
    return root


def _count_generate(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the profile stage's engine calls (one per minibatch); each still runs the real engine."""
    calls: list[int] = []
    real: Callable[..., Any] = profile.timed_generate

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(profile, "timed_generate", counted)
    return calls


PROFILE_POINTS = {
    "profile:start": 3,
    "profile:chunk@1": 1,
    "profile:chunks": 0,
    "profile:outputs": 0,
}  # generated again


@pytest.mark.parametrize(
    "point",
    [pytest.param(p, marks=EXTENDED) if p in ("profile:start", "profile:chunks") else p for p in PROFILE_POINTS],
)
def test_profile_killed_at_a_phase_boundary_generates_only_what_is_missing(
    point: str, inputs: Path, unkilled_profile: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root, params = _project(inputs, tmp_path, {"profile": PROFILE})
    _killed(root, "profile", point)
    (work,) = (root / "outputs/.work/profile").iterdir()
    run_id = json.loads((work / profile.RUN_FILE).read_text())["run_id"]
    calls = _count_generate(monkeypatch)
    metrics = _rerun(root, "profile", monkeypatch)
    assert len(calls) == PROFILE_POINTS[point] and metrics["profile/minibatches"] == 3
    for name in ("samples.parquet", "prompts.parquet"):
        same = (root / "outputs/profile" / name).read_bytes() == (
            unkilled_profile / "outputs/profile" / name
        ).read_bytes()
        assert same, name
    assert len(pd.read_csv(root / "metrics/profile_timings.csv")) == 3
    assert not work.exists()  # removed after success
    (run,) = _runs(params)
    assert (run.info.run_id, run.info.status) == (run_id, "FINISHED")
    assert _logged_once(run_id)["profile/samples"] == [0]
