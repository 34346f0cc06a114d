"""A stopped stage's workspace put back (`asp.orchestration.workspace`), and `run_streaming` returning only once
every process under DVC has ended. Unit level, no DVC: what `dvc repro` does to a stage's outputs (deletes them
before the command, writes dvc.lock after) is done by hand; the end-to-end tests signal a real `asp repro`
(tests/orchestration/test_cancel.py) and cancel a real Prefect flow run (tests/e2e/test_three_doors.py)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from asp.env import Terminated
from asp.orchestration import workspace
from asp.orchestration.dvc import run_streaming, stage_env

LOCK = b'schema: "2.0"\nstages:\n  s:\n    cmd: old\n  t:\n    cmd: y\n'


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A stage `s` with a directory out, a persistent out, a metrics file and two plots (one not made yet)."""
    spec = {
        "cmd": "x",
        "outs": ["out/dir", {"state": {"persist": True}}],
        "metrics": [{"m.json": {"cache": False}}],
        "plots": [{"p.png": {"cache": False}}, {"new.csv": {"cache": False}}],
    }
    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"s": spec}}))
    for rel, text in {
        "out/dir/a": "a",
        "out/dir/sub/b": "b",
        "m.json": '{"x": 1}',
        "p.png": "png",
        "state/s": "s",
    }.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    (tmp_path / "dvc.lock").write_bytes(LOCK)
    return tmp_path


def _files(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): p.read_text()
        for p in sorted(root.rglob("*"))
        if p.is_file() and ".dvc" not in p.parts
    }


def _as_dvc_repro_leaves_it(root: Path) -> None:
    """What a stopped `dvc repro` of `s` leaves: outputs deleted, a new partial one, a changed persistent out and
    this stage's dvc.lock entry rewritten."""
    shutil.rmtree(root / "out/dir")
    (root / "m.json").unlink()
    (root / "p.png").unlink()
    (root / "out/dir").mkdir()
    (root / "out/dir/partial").write_text("half")
    (root / "new.csv").write_text("new")
    (root / "state/s").write_text("resumable")
    (root / "dvc.lock").write_bytes(LOCK.replace(b"old", b"new"))


def test_restore_puts_outputs_metrics_plots_and_the_lock_back(project: Path) -> None:
    before = _files(project)
    snap = workspace.take(project, "s")
    assert snap.paths == ("m.json", "new.csv", "out/dir", "p.png")  # not the persistent out
    assert snap.existed == {"m.json", "out/dir", "p.png"}
    _as_dvc_repro_leaves_it(project)
    done = workspace.restore(snap)
    assert done.ok and done.lock == "restored" and done.removed == ["new.csv"]
    assert _files(project) == {**before, "state/s": "resumable"}  # the persistent out keeps its resume state
    assert (project / "dvc.lock").read_bytes() == LOCK  # byte for byte: git sees no change
    assert "as it was before stage 's' started: m.json, out/dir, p.png put back" in done.message
    assert not snap.where.exists()


def test_take_links_files_instead_of_copying_them(project: Path) -> None:
    snap = workspace.take(project, "s")
    assert (snap.where / "files/out/dir/sub/b").stat().st_ino == (project / "out/dir/sub/b").stat().st_ino
    workspace.discard(snap)
    assert not snap.where.exists() and (project / "out/dir/sub/b").read_text() == "b"  # the workspace keeps it


def test_a_lock_changed_for_other_stages_is_kept_and_the_message_says_what_to_run(project: Path) -> None:
    snap = workspace.take(project, "s")
    _as_dvc_repro_leaves_it(project)
    (project / "dvc.lock").write_bytes(LOCK.replace(b"old", b"new").replace(b"cmd: y", b"cmd: z"))
    done = workspace.restore(snap)
    assert not done.ok and done.lock == "kept" and done.put_back == ["m.json", "out/dir", "p.png"]
    assert "dvc.lock changed for other stages too" in done.message
    assert "Run `asp repro s` (or `dvc repro --single-item s`)" in done.message


def test_snapshots_of_killed_runs_are_cleared_with_a_note(project: Path) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = project / workspace.SNAPSHOTS / f"s.{int(dead.stdout)}.abcd1234"
    (stale / "files").mkdir(parents=True)
    live = workspace.take(project, "s")  # this process: alive, kept
    (line,) = workspace.clear_stale(project)
    assert not stale.exists() and live.where.exists()
    assert "killed (SIGKILL) while it ran" in line and "`asp repro s` rebuilds them" in line


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="signals: main thread only")
def test_signals_during_the_restore_are_deferred() -> None:
    previous = signal.getsignal(signal.SIGINT)
    with workspace.deferred_signals() as received:
        os.kill(os.getpid(), signal.SIGINT)  # a second Ctrl-C while the workspace is put back
        time.sleep(0.05)
    assert received == [signal.SIGINT] and signal.getsignal(signal.SIGINT) is previous


CHILD = """
import os, signal, sys, time
def ending(signum, frame):
    time.sleep(1.0)  # the stage ending its MLflow run
    open(sys.argv[1], "w").write("ended")
    sys.exit(143)
signal.signal(signal.SIGTERM, ending)
print("started", flush=True)
time.sleep(60)
"""


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="signals: main thread only")
def test_an_interrupted_command_returns_only_after_the_processes_under_it_ended(tmp_path: Path) -> None:
    """SIGTERM to the orchestrator (as `kill` or a job scheduler sends it): the shell under DVC ends at once, the
    stage under it takes a second to end (its MLflow run); `run_streaming` re-raises only after it has, so the
    workspace is never put back while the stage can still write into it."""
    marker = tmp_path / "ended"
    (tmp_path / "child.py").write_text(CHILD)
    # as DVC runs a stage: through a shell, which SIGTERM ends at once; the stage then ends on its own time
    shell = f"{sys.executable} {tmp_path / 'child.py'} {marker}; exit $?"
    parent = f"import subprocess, sys; sys.exit(subprocess.call(['/bin/sh', '-c', {shell!r}]))"
    previous = signal.signal(signal.SIGTERM, signal.SIG_DFL)  # as in a new process
    started = threading.Event()
    try:

        def on_line(line: str) -> None:
            if line == "started":
                started.set()

        threading.Thread(target=lambda: started.wait(60) and os.kill(os.getpid(), signal.SIGTERM), daemon=True).start()
        with pytest.raises(Terminated):
            run_streaming([sys.executable, "-c", parent], env=stage_env({}), on_line=on_line, grace_s=20)
        assert marker.read_text() == "ended"  # the stage had ended before run_streaming gave control back
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_a_persistent_output_the_caller_names_is_put_back_byte_for_byte(project: Path) -> None:
    """Issue 39: a forced `launch` that starts afresh drops the old run's checkpoints and appends to its logs in the
    persistent `outputs/launch_state` (not cached: DVC cannot bring it back). Named in `persisted` (it matches
    dvc.lock), it is kept as a copy and put back; a finished checkpoint directory (with its manifest.json) is kept
    as hard links, every other file as a copy (an append into the workspace's file must not reach the kept one)."""
    ckpt = project / "state/trainer/step-2"
    ckpt.mkdir(parents=True)
    (ckpt / "model.safetensors").write_bytes(b"\0" * 64)
    (ckpt / "manifest.json").write_text('{"files": {}}')
    (project / "state/run_log.jsonl").write_text('{"step": 2}\n')
    before = _files(project)
    snap = workspace.take(project, "s", persisted=["state"])
    assert snap.paths == ("m.json", "new.csv", "out/dir", "p.png", "state") and snap.left == ()
    kept = snap.where / "files/state"
    assert (kept / "trainer/step-2/model.safetensors").stat().st_ino == (ckpt / "model.safetensors").stat().st_ino
    assert (kept / "run_log.jsonl").stat().st_ino != (project / "state/run_log.jsonl").stat().st_ino
    _as_dvc_repro_leaves_it(project)
    with (project / "state/run_log.jsonl").open("a") as fh:  # the fresh run's log, appended in place
        fh.write('{"step": 1}\n')
    shutil.rmtree(project / "state/trainer")  # a fresh run drops the old checkpoints
    (project / "state/trainer/step-1").mkdir(parents=True)
    done = workspace.restore(snap)
    assert done.ok and "state" in done.put_back and "progress" not in done.message
    assert _files(project) == before and (project / "dvc.lock").read_bytes() == LOCK


def test_a_persistent_output_not_named_keeps_the_stopped_runs_progress_and_says_so(project: Path) -> None:
    """A persistent output that differed from dvc.lock (an interrupted attempt's resume state; `PipelineRun` does
    not name it) keeps what the stopped run added, and the message says so instead of claiming it as before."""
    snap = workspace.take(project, "s")
    assert snap.left == ("state",)
    _as_dvc_repro_leaves_it(project)
    done = workspace.restore(snap)
    assert (project / "state/s").read_text() == "resumable"
    assert "state keeps the stopped run's progress" in done.message and "asp repro s" in done.message


def test_a_launch_state_holds_progress_when_its_checkpoint_is_not_finished(tmp_path: Path) -> None:
    """What the guard asks before keeping a stopped changed launch's state (`restore(keep_progress=...)`): the
    runtime checkpoint the launch writes, unfinished (a resume position) or finished (the end of a run)."""
    from asp.runtime.checkpoint import Checkpointer
    from asp.steps.launch_state import holds_progress

    state = tmp_path / "launch_state"
    assert not holds_progress(state)
    checkpointer = Checkpointer(state / "C4", "plan")
    position = {"database": {}, "trainer_step": 3, "policy_version": 3, "trainer_state": {}}
    checkpointer.save(**position, finished=False)
    assert holds_progress(state) and holds_progress(state / "C4")
    checkpointer.save(**position, finished=True)
    assert not holds_progress(state)
