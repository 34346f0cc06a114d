"""Failures and interruptions end the command and its MLflow runs the way DESIGN.md's reliability and tracking
conventions say: a stage stopped by Ctrl-C exits 130 and by SIGTERM 143, its run KILLED; a stage with bad input
exits 2, its run FAILED; a run left RUNNING by a SIGKILLed process is marked KILLED when that stage starts again,
except the one a resumed stage continues; `asp repro` stopped by Ctrl-C / SIGTERM (or losing its stage to
SIGTERM) ends the parent run KILLED; a Prefect flow whose stage fails ends its parent run FAILED.

Fast tests run `asp stage` in-process (`asp.cli.main`) and signal the test process itself; the slow ones signal
real `asp stage`, `asp repro` (+ dvc) and Prefect flow processes. All log to the session's SQLite store.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml
from mlflow import MlflowClient

from asp.tracking import PARENT_ENV

ROOT = Path(__file__).resolve().parents[1]

STAGE = '''"""A tracked test stage; $SLEEPY picks what it does: sleep, sigint, sigterm, error (default: finish)."""
import os, pathlib, signal, time

from asp.errors import UserError
from asp.stage import run_stage


def work(params, paths, tracker):
    pathlib.Path(f"started-{os.getpid()}").write_text(tracker.run_id or "")
    mode = os.environ.get("SLEEPY", "")
    if mode in ("sigint", "sigterm"):
        os.kill(os.getpid(), getattr(signal, mode.upper()))  # a real signal, to this very process
        time.sleep(30)  # which interrupts this
    if mode == "sleep":
        time.sleep(300)
    if mode == "error":
        raise UserError("sleepy: bad input")
    return {"sleepy/done": 1}


def resume(params, paths):  # like launch: continue the MLflow run of an interrupted attempt
    path = pathlib.Path("resume.txt")
    return path.read_text() if path.is_file() else None


def main():
    run_stage("sleepy", work, None, resume_run=resume)
'''


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, str]:
    """A directory with the repo's params.yaml (a new experiment), a dvc.yaml registering the stage `sleepy` and
    stages/sleepy.py; the working directory of the test. Returns (directory, experiment name)."""
    experiment = f"signals-{uuid.uuid4().hex[:8]}"
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["common"]["experiment"] = experiment
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    (tmp_path / "stages").mkdir()
    (tmp_path / "stages/sleepy.py").write_text(STAGE)
    stage = {"cmd": f"{sys.executable} -m asp stage sleepy", "deps": ["stages/sleepy.py"]}
    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"sleepy": stage}}))
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(PARENT_ENV, raising=False)
    return tmp_path, experiment


def _runs(experiment: str) -> dict[str, list]:
    """The experiment's runs by stage (a stage run under a parent is named `<stage> · <parent's name>`), others by
    name."""
    client = MlflowClient()
    found: dict[str, list] = {}
    for run in client.search_runs([client.get_experiment_by_name(experiment).experiment_id]):
        found.setdefault(run.data.tags.get("asp.stage") or run.info.run_name, []).append(run)
    return found


def _main(*args: str) -> int:
    from asp.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(list(args))
    return exit_info.value.code


@pytest.mark.parametrize(
    ("mode", "code", "message", "status"),
    [
        ("sigint", 130, "interrupted", "KILLED"),  # Ctrl-C
        ("sigterm", 143, "terminated", "KILLED"),
        ("error", 2, "error: sleepy: bad input", "FAILED"),
        ("", 0, "[sleepy] done", "FINISHED"),
    ],
)
def test_stage_exit_code_and_run_status(
    project: tuple[Path, str], mode: str, code: int, message: str, status: str, monkeypatch, capsys
) -> None:
    monkeypatch.setenv("SLEEPY", mode)
    # as in a new process: earlier tests in this pytest process (Ray, Prefect) may have set their own handlers
    previous_term = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        assert _main("stage", "sleepy") == code
    finally:
        signal.signal(signal.SIGTERM, previous_term)
        signal.signal(signal.SIGINT, previous_int)
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err, err
    (run,) = _runs(project[1])["sleepy"]
    assert run.info.status == status


def _started(root: Path, proc: subprocess.Popen, timeout_s: float = 180) -> str:
    """Wait until `proc`'s stage wrote started-<pid> (its run is open); returns the run id."""
    marker = root / f"started-{proc.pid}"
    deadline = time.monotonic() + timeout_s
    while not marker.is_file():
        if proc.poll() is not None or time.monotonic() > deadline:
            pytest.fail(
                f"stage {proc.pid} exited with {proc.poll()} before its run opened:\n{proc.stderr.read()[-3000:]}"
            )
        time.sleep(0.2)
    return marker.read_text()


@pytest.mark.slow
def test_killed_stage_processes_end_their_runs(project: tuple[Path, str], monkeypatch) -> None:
    root, experiment = project
    env = dict(os.environ, SLEEPY="sleep")
    cmd = [sys.executable, "-m", "asp", "stage", "sleepy"]
    MlflowClient().search_experiments()  # the store exists (three new processes must not all create its tables)
    procs = [subprocess.Popen(cmd, cwd=root, env=env, stderr=subprocess.PIPE, text=True) for _ in range(3)]
    try:
        resumed, stale, terminated = procs
        run_ids = {proc.pid: _started(root, proc) for proc in procs}
        resumed.kill()  # SIGKILL: no chance to end their runs
        stale.kill()
        terminated.send_signal(signal.SIGTERM)
        assert terminated.wait(120) == 143
        assert "terminated" in terminated.stderr.read() and resumed.wait(30) == stale.wait(30) == -signal.SIGKILL
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    status = {run.info.run_id: run.info.status for run in _runs(experiment)["sleepy"]}
    assert [status[run_ids[p.pid]] for p in procs] == ["RUNNING", "RUNNING", "KILLED"]

    (root / "resume.txt").write_text(run_ids[resumed.pid])  # the next attempt continues the first run
    monkeypatch.setenv("SLEEPY", "")
    assert _main("stage", "sleepy") == 0
    runs = {run.info.run_id: run for run in _runs(experiment)["sleepy"]}
    assert len(runs) == 3  # no new run: the first one was continued
    continued, swept = runs[run_ids[resumed.pid]], runs[run_ids[stale.pid]]
    assert (continued.info.status, continued.data.tags["asp.resumed"]) == ("FINISHED", "true")
    assert "asp.pid" not in continued.data.tags  # its owner (this process, while it ran) is bookkeeping: gone
    assert swept.info.status == "KILLED" and f"owner process {stale.pid} " in swept.data.tags["asp.killed_reason"]


def _terminal_signals() -> None:
    """In the child: SIGINT / SIGTERM at their defaults, as a terminal's shell starts a command (an ignored SIGINT
    is inherited across exec, and then neither asp nor DVC nor the stage would see the Ctrl-C)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _stage_pid(root: Path, proc: subprocess.Popen, log: Path, timeout_s: float = 240) -> int:
    deadline = time.monotonic() + timeout_s
    while not (found := list(root.glob("started-*"))):
        if proc.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"asp repro exited with {proc.poll()} before the stage started:\n{log.read_text()[-3000:]}")
        time.sleep(0.2)
    return int(found[0].name.split("-")[1])


@pytest.mark.slow
@pytest.mark.parametrize(
    "how", ["ctrl-c", pytest.param("sigterm to asp", marks=pytest.mark.extended), "sigterm to the stage"]
)
def test_interrupted_repro_ends_parent_and_stage_killed(project: tuple[Path, str], how: str) -> None:
    root, experiment = project
    env = dict(os.environ, SLEEPY="sleep", DVC_NO_ANALYTICS="1")
    for cmd in (["git", "init", "-q"], [sys.executable, "-m", "dvc", "init", "-q"]):
        subprocess.run(cmd, cwd=root, env=env, check=True, capture_output=True, timeout=120)
    log = root / "repro.log"
    with log.open("w") as out:  # own session: killpg below reaches what a terminal's Ctrl-C reaches
        proc = subprocess.Popen(
            [sys.executable, "-m", "asp", "repro"],
            cwd=root,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_terminal_signals,  # an earlier test in this process may have left SIGINT ignored
        )
    try:
        stage_pid = _stage_pid(root, proc, log)
        if how == "ctrl-c":
            os.killpg(proc.pid, signal.SIGINT)
        elif how == "sigterm to asp":
            proc.send_signal(signal.SIGTERM)  # passed on to the stage
        else:
            os.kill(stage_pid, signal.SIGTERM)
        code = proc.wait(180)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    text = log.read_text()
    if how == "sigterm to the stage":  # dvc fails; asp repro passes the stage's own code on (DVC names it)
        assert code == 143 and "the stage exited with 143, dvc with 255" in text, text[-3000:]
    else:
        assert code == {"ctrl-c": 130, "sigterm to asp": 143}[how], text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    runs = _runs(experiment)
    (parent,), (stage,) = _parents(runs), runs["sleepy"]
    assert stage.data.tags["mlflow.parentRunId"] == parent.info.run_id
    assert (stage.info.status, parent.info.status) == ("KILLED", "KILLED")


def _parents(runs: dict[str, list]) -> list:
    return [r for group in runs.values() for r in group if r.data.tags.get("asp.kind") == "pipeline"]


@pytest.mark.slow
def test_prefect_flow_parent_run_fails_when_a_stage_fails(project: tuple[Path, str]) -> None:
    root, experiment = project
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", PARENT_ENV)}
    env.update(
        SLEEPY="error",
        DVC_NO_ANALYTICS="1",
        PYTHONPATH=str(ROOT),
        PREFECT_HOME=str(root / "prefect"),
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="300",
    )
    for cmd in (["git", "init", "-q"], [sys.executable, "-m", "dvc", "init", "-q"]):
        subprocess.run(cmd, cwd=root, env=env, check=True, capture_output=True, timeout=120)
    out = subprocess.run(
        [sys.executable, "-m", "flows.pipeline", "sleepy"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 1, out.stderr[-3000:]
    assert re.search(r"^error: the pipeline failed: StageFailed: stage 'sleepy' failed", out.stderr, re.M), out.stderr
    assert "sleepy: bad input" in out.stdout + out.stderr  # the stage's own message, streamed through DVC
    runs = _runs(experiment)
    (parent,), (stage,) = _parents(runs), runs["sleepy"]
    assert stage.data.tags["mlflow.parentRunId"] == parent.info.run_id
    assert (stage.info.status, parent.info.status) == ("FAILED", "FAILED")
    assert parent.data.tags["asp.runner"] == "prefect"
