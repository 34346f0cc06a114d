"""A stage stopped half-way leaves the workspace as it was before it started (issue 26 §1): Ctrl-C of `asp repro`
and a stage past its `orchestration.timeout_s`, on a real git + DVC project whose one stage writes a directory
output, a metrics file and a plot, then holds (`$ASP_HOLD_FILE`) after DVC deleted its old outputs and it wrote a
partial new one. After the stop, `dvc status`, `git status`, every output byte and dvc.lock are as before, the
MLflow parent run is KILLED and the last lines say the workspace was put back. The Prefect cancellation (the UI's
Cancel button) is tested on the real `schedule` stage in tests/e2e/test_three_doors.py.

Like `launch`, the stage keeps a persistent, uncached folder (`state`: DVC never deletes it and cannot restore it)
that it rewrites as a fresh run does (drops the old run's checkpoint, appends to its log), and it opens its own
MLflow run under the pipeline's parent and dies on SIGTERM without ending it, as a launch stage SIGKILLed past its
grace time does (issue 39): the folder must be put back byte for byte and the stage's run end KILLED.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from mlflow import MlflowClient

from asp.orchestration.pipeline import StageFailed, run_pipeline
from asp.orchestration.request import RunRequest
from asp.tracking import PARENT_ENV

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow

STAGE = """\
import json, os, pathlib, shutil, signal, sys, time

run = os.environ.get("SLOW_RUN", "first")
if os.environ.get("SLOW_SEED"):  # as `asp stage` does: bring in what a stopped run of this experiment kept, and
    from asp.stage import keep_progress_on_stop, seed_progress  # keep the state when stopped

    seed_progress("slow")
    resume = pathlib.Path("state/C4/runtime_state.json")
    if resume.is_file() and not json.loads(resume.read_text())["finished"]:
        print("RESUMED from", json.loads(resume.read_text())["trainer_step"], flush=True)
if os.environ.get("SLOW_MLFLOW"):  # its own MLflow run under the pipeline's, as `asp stage` opens
    from mlflow import MlflowClient

    client = MlflowClient()
    parent = client.get_run(os.environ["ASP_PARENT_RUN_ID"])
    client.create_run(parent.info.experiment_id, tags={"mlflow.parentRunId": parent.info.run_id})

    def stop(*_):  # dies without ending its run (SIGKILLed launch)
        if os.environ.get("SLOW_SEED"):
            keep_progress_on_stop("slow")
        os._exit(143)

    signal.signal(signal.SIGTERM, stop)


def hold_here(where):
    hold = os.environ.get("ASP_HOLD_FILE", "")
    try:
        if hold and os.path.exists(hold) and pathlib.Path(hold).read_text() == where:
            pathlib.Path(hold + ".held").write_text(str(os.getpid()))
            while os.path.exists(hold):
                time.sleep(0.1)
    except KeyboardInterrupt:
        sys.exit(130)


pathlib.Path("out/slow").mkdir(parents=True, exist_ok=True)
pathlib.Path("out/slow/part.txt").write_text(run)  # a partial output of this run
hold_here("start")
state = pathlib.Path("state")  # persistent: a fresh run drops the old checkpoint and appends to the log
shutil.rmtree(state / "ckpt", ignore_errors=True)
(state / "ckpt/step-1").mkdir(parents=True)
(state / "ckpt/step-1/model.bin").write_text(run * 100)
(state / "ckpt/step-1/manifest.json").write_text("{}")
with (state / "log.jsonl").open("a") as fh:
    fh.write(json.dumps({"run": run}) + "\\n")
if os.environ.get("SLOW_PROGRESS"):  # a resume position of this run, as launch's runtime checkpoint records it
    (state / "C4").mkdir(exist_ok=True)
    (state / "C4/runtime_state.json").write_text(json.dumps({"finished": False, "trainer_step": 1}))
hold_here("fresh")
for name, text in (("metrics/slow.json", json.dumps({"run": run})), ("plots/slow.csv", f"run\\n{run}\\n")):
    pathlib.Path(name).parent.mkdir(exist_ok=True)
    pathlib.Path(name).write_text(text)
"""


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in (PARENT_ENV, "PREFECT_API_URL")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    return dict(env, DVC_NO_ANALYTICS="1", **extra)


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The project after a first `dvc repro` of `slow`, committed; `first_s`: how long that took (DVC's start)."""
    root = tmp_path_factory.mktemp("cancel") / "repo"
    root.mkdir()
    experiment = f"cancel-{uuid.uuid4().hex[:8]}"
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["common"]["experiment"] = experiment
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    (root / "slow.py").write_text(STAGE)
    (root / "knob.txt").write_text("1\n")
    spec = {
        "cmd": f"{sys.executable} slow.py",
        "deps": ["slow.py", "knob.txt"],
        "outs": ["out/slow", {"state": {"persist": True, "cache": False}}],
        "metrics": [{"metrics/slow.json": {"cache": False}}],
        "plots": [{"plots/slow.csv": {"cache": False}}],
    }
    (root / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"slow": spec}}))
    (root / ".gitignore").write_text("__pycache__/\n/mlartifacts/\n")
    for cmd in (
        ["git", "init", "-q"],
        ["git", "config", "user.email", "t@e.com"],
        ["git", "config", "user.name", "t"],
    ):
        subprocess.run(cmd, cwd=root, check=True, timeout=60)
    subprocess.run([sys.executable, "-m", "dvc", "init", "-q"], cwd=root, env=_env(), check=True, timeout=120)
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-m", "dvc", "repro", "-q"], cwd=root, env=_env(), check=True, timeout=300)
    first_s = time.monotonic() - t0
    for cmd in (["git", "add", "-A"], ["git", "commit", "-qm", "project"]):
        subprocess.run(cmd, cwd=root, check=True, timeout=60)
    return {"root": root, "experiment": experiment, "first_s": first_s, "params": params}


def _state(root: Path) -> dict[str, Any]:
    """What a user looks at: `dvc status` (DVC's Python API), `git status`, and every byte of the outputs + lock."""
    from dvc.repo import Repo

    with contextlib.chdir(root), Repo(".") as repo:
        dvc = repo.status()
    git = subprocess.run(["git", "status", "--porcelain"], cwd=root, capture_output=True, text=True, check=True)
    files = {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for top in ("out", "state", "metrics", "plots", "dvc.lock")
        for p in ([root / top] if (root / top).is_file() else sorted((root / top).rglob("*")))
        if p.is_file()
    }
    return {"dvc": dvc, "git": git.stdout, "files": files}


def _parent_status(experiment: str) -> str:
    return _statuses(experiment)[0]


def _statuses(experiment: str) -> tuple[str, list[str]]:
    """The newest pipeline parent run's status and its stage runs' statuses."""
    client = MlflowClient()
    exp = client.get_experiment_by_name(experiment)
    runs = client.search_runs(
        [exp.experiment_id], "tags.`asp.kind` = 'pipeline'", order_by=["attributes.start_time DESC"]
    )
    nested = client.search_runs([exp.experiment_id], f"tags.mlflow.parentRunId = '{runs[0].info.run_id}'")
    return runs[0].info.status, [r.info.status for r in nested]


def _terminal_signals() -> None:
    """In the child: SIGINT at its default, as a terminal's shell starts a command (pytest may leave it ignored)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _held(hold: Path, proc: subprocess.Popen, timeout_s: float = 240) -> None:
    deadline = time.monotonic() + timeout_s
    while not Path(f"{hold}.held").is_file():
        assert proc.poll() is None, f"exited with {proc.returncode} before the stage held"
        assert time.monotonic() < deadline, "the stage did not start"
        time.sleep(0.1)


def test_ctrl_c_of_asp_repro_leaves_the_workspace_as_before(project: dict[str, Any], tmp_path: Path) -> None:
    root = project["root"]
    before = _state(root)
    hold = tmp_path / "hold"
    hold.write_text("fresh")
    log = tmp_path / "repro.log"
    t0 = time.monotonic()
    with log.open("w") as out:  # own session: killpg reaches what a terminal's Ctrl-C reaches
        proc = subprocess.Popen(
            [sys.executable, "-m", "asp", "repro", "--force", "slow"],
            cwd=root,
            env=_env(ASP_HOLD_FILE=str(hold), SLOW_RUN="second", SLOW_MLFLOW="1"),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_terminal_signals,
        )
    try:
        _held(hold, proc)
        t_held = time.monotonic()
        assert not (root / "metrics/slow.json").exists()  # DVC deleted the outputs: the state the issue reported
        assert (root / "out/slow/part.txt").read_text() == "second"
        os.killpg(proc.pid, signal.SIGINT)
        code = proc.wait(120)
        print(f"held after {t_held - t0:.1f} s; stopped {time.monotonic() - t_held:.1f} s after Ctrl-C")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    text = log.read_text()
    assert code == 130 and "Traceback" not in text, text[-3000:]
    *_, restored, last = text.strip().splitlines()
    assert restored.startswith("[asp] stage 'slow' was interrupted (Ctrl-C): the workspace is as it was before"), text
    assert "metrics/slow.json, out/slow, plots/slow.csv, state put back" in restored and last == "interrupted"
    assert _state(root) == before
    assert _statuses(project["experiment"]) == ("KILLED", ["KILLED"])


def test_a_stage_past_its_timeout_leaves_the_workspace_as_before(
    project: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = project["root"]
    before = _state(root)
    # twice what DVC took to start and run the stage once: the stage is holding when the timeout stops it
    timeout_s = round(max(5.0, 2 * project["first_s"]), 1)
    params = copy.deepcopy(project["params"])
    params["orchestration"]["timeout_s"] = {"slow": timeout_s}
    params_file = tmp_path / "params-timeout.yaml"  # outside the project: git status stays as it was
    params_file.write_text(yaml.safe_dump(params, sort_keys=False))
    hold = tmp_path / "hold"
    hold.write_text("fresh")
    for key, value in _env(ASP_HOLD_FILE=str(hold), SLOW_RUN="third").items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(root)
    lines: list[str] = []
    with pytest.raises(StageFailed) as failed:
        run_pipeline(RunRequest(("slow",), force=True), params_path=params_file, on_line=lines.append)
    assert Path(f"{hold}.held").is_file(), f"the stage had not started within {timeout_s} s: {lines}"
    assert failed.value.timed_out and lines[-1].startswith("[asp] stage 'slow' timed out: the workspace is as it")
    assert "the workspace is as it was before stage 'slow' started" in str(failed.value)
    assert _state(root) == before
    assert _parent_status(project["experiment"]) == "KILLED"


def _sigterm_run(root: Path, tmp_path: Path, args: list[str], moment: str, **extra: str) -> str:
    """`asp repro ARGS` held at `moment` ("start": before the stage touched its state; "fresh": after it rewrote it
    as a fresh run), then SIGTERM to `asp` alone (what Prefect's runner sends a cancelled flow run, and a job
    scheduler a job). Returns its output; it must exit non-zero without a traceback."""
    hold = tmp_path / "hold"
    hold.write_text(moment)
    log = tmp_path / "repro.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "asp", "repro", *args],
            cwd=root,
            env=_env(ASP_HOLD_FILE=str(hold), SLOW_RUN=f"sigterm-{moment}", SLOW_MLFLOW="1", **extra),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        _held(hold, proc)
        if moment == "fresh" and "--set" not in args:  # the old run's checkpoint is gone (an experiment: in its copy)
            assert (root / "state/ckpt/step-1/model.bin").read_text().startswith(f"sigterm-{moment}")
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        hold.unlink(missing_ok=True)
    text = log.read_text()
    assert code != 0 and "Traceback" not in text, text[-3000:]
    return text


# "start" (the state not yet touched) is a variant of "fresh" (the guard is the same): extended tier
@pytest.mark.parametrize("moment", [pytest.param("start", marks=pytest.mark.extended), "fresh"])
def test_a_forced_run_stopped_puts_its_persistent_state_back(
    project: dict[str, Any], tmp_path: Path, moment: str
) -> None:
    """Issue 39: a forced run of an up-to-date stage, stopped before and after it rewrote its persistent, uncached
    state as a fresh run does: the state is put back byte for byte (DVC cannot restore it), `dvc status` and every
    other output as before, and the stage's own MLflow run, which its process could not end, is KILLED."""
    root = project["root"]
    before = _state(root)
    text = _sigterm_run(root, tmp_path, ["--force", "slow"], moment)
    assert "metrics/slow.json, out/slow, plots/slow.csv, state put back" in text, text[-3000:]
    assert "progress" not in text  # the state was the last finished run's, not an interrupted one's
    assert _state(root) == before
    assert _statuses(project["experiment"]) == ("KILLED", ["KILLED"])


@pytest.mark.extended  # the same put-back as the forced run stopped after it rewrote its state ("fresh")
def test_a_changed_stage_stopped_puts_its_persistent_state_back(project: dict[str, Any], tmp_path: Path) -> None:
    """The same without --force: a changed dependency makes DVC run the stage; its persistent state still matches
    dvc.lock (the last finished run's), so it is put back too."""
    root = project["root"]
    knob = root / "knob.txt"
    knob.write_text("2\n")  # DVC: changed deps
    try:
        before = _state(root)
        assert before["dvc"] == {"slow": [{"changed deps": {"knob.txt": "modified"}}]}, before["dvc"]
        text = _sigterm_run(root, tmp_path, ["slow"], "fresh")
        assert "state put back" in text, text[-3000:]
        assert _state(root) == before
        assert _statuses(project["experiment"]) == ("KILLED", ["KILLED"])
    finally:
        knob.write_text("1\n")


def test_a_changed_stage_stopped_keeps_the_progress_it_saved(project: dict[str, Any], tmp_path: Path) -> None:
    """A changed stage (launch after a params change: the last run finished, so it starts afresh) stopped once it
    saved a resume position (launch's `runtime_state.json`, not finished) keeps that progress instead of the last
    finished run's state, so a rerun resumes rather than training again; every other output and dvc.lock are put
    back, and `dvc status` says what changed (the deps, and the state). Without saved progress the state is put
    back (`test_a_changed_stage_stopped_puts_its_persistent_state_back`)."""
    root = project["root"]
    knob, backup = root / "knob.txt", tmp_path / "state-backup"
    shutil.copytree(root / "state", backup)
    knob.write_text("3\n")
    try:
        before = _state(root)
        text = _sigterm_run(root, tmp_path, ["slow"], "fresh", SLOW_PROGRESS="1")
        assert "state keeps the stopped run's progress" in text and "`asp repro slow` resumes it" in text, text[-3000:]
        after = _state(root)
        assert json.loads((root / "state/C4/runtime_state.json").read_text())["finished"] is False
        assert (root / "state/ckpt/step-1/model.bin").read_text().startswith("sigterm-fresh")  # the stopped run's
        kept = {k: v for k, v in after["files"].items() if not k.startswith("state")}
        assert kept == {k: v for k, v in before["files"].items() if not k.startswith("state")}  # outputs, dvc.lock
        changed = after["dvc"]["slow"]
        assert {"changed deps": {"knob.txt": "modified"}} in changed and any("changed outs" in c for c in changed)
        assert _statuses(project["experiment"]) == ("KILLED", ["KILLED"])
    finally:
        knob.write_text("1\n")
        shutil.rmtree(root / "state")
        shutil.copytree(backup, root / "state")


def test_a_stopped_experiment_keeps_its_progress_and_the_same_run_resumes_it(
    project: dict[str, Any], tmp_path: Path
) -> None:
    """`asp repro --set ...` runs in a temporary copy that a stop removes, and the copy starts without the persistent
    state: a stopped experiment trained again from the start. Now the stop keeps the copy's state when it holds a
    resume position (in .dvc/tmp/asp-exp-progress/<this run's stages and params>), the same command brings it into
    the new copy (`asp.stage.seed_progress`, as `asp stage` does) and resumes, and a finished run drops it."""
    root = project["root"]
    before = _state(root)
    args = ["--force", "--set", "common.seed=11", "slow"]  # forced: the stage reads no param
    text = _sigterm_run(root, tmp_path, args, "fresh", SLOW_PROGRESS="1", SLOW_SEED="1")
    assert "Its progress (state) is kept in .dvc/tmp/asp-exp-progress/" in text, text[-3000:]
    assert "the same command resumes it" in text
    (kept,) = (root / ".dvc/tmp/asp-exp-progress").glob("*/state/C4/runtime_state.json")
    assert json.loads(kept.read_text()) == {"finished": False, "trainer_step": 1}
    assert _state(root) == before  # the workspace is untouched
    out = subprocess.run(
        [sys.executable, "-m", "asp", "repro", *args],
        cwd=root,
        env=_env(SLOW_RUN="resumed", SLOW_SEED="1"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "RESUMED from 1" in out.stdout + out.stderr, (out.stdout + out.stderr)[-3000:]
    assert "the progress a stopped run of this experiment kept" in out.stdout + out.stderr
    assert not list((root / ".dvc/tmp/asp-exp-progress").glob("*/state"))  # finished: nothing left to resume
