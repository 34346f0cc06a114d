"""The DVC driver: whether DVC will skip a stage (its Python API, checked against what a real `dvc repro` then
says it did), what DVC's messages say where it has no structured output (a run-cache restore, the stages of an
experiment), the command lines, streaming with a timeout and a clean stop of the running child."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from asp.orchestration.dvc import (
    RWLOCK,
    classify,
    dvc_exp_cmd,
    dvc_repro_cmd,
    format_value,
    release_locks_of,
    run_streaming,
    stage_env,
    stage_exit_code,
    up_to_date,
)
from asp.orchestration.pipeline import numeric_leaves, stage_files, stage_seconds, uncached_outputs


def test_classify_reads_dvcs_messages() -> None:
    lines = [
        "Stage 'policy' didn't change, skipping",
        "Stage 'train_predictor' is cached - skipping run, checking out outputs",
        "Running stage 'schedule':",
        "> asp stage schedule",
        "ERROR: failed to reproduce 'launch': boom",
    ]
    assert classify(lines) == {
        "policy": "skipped",
        "train_predictor": "restored",
        "schedule": "ran",
        "launch": "failed",
    }


def test_the_failed_stage_s_own_exit_code_is_read_from_dvc() -> None:
    lines = [
        "Running stage 'prepare':",
        "ERROR: failed to reproduce 'prepare': failed to run: asp stage prepare, exited with 2",
    ]
    assert stage_exit_code(lines) == 2  # a stage that refused bad input: `asp repro` exits 2, not DVC's 255
    assert stage_exit_code(["ERROR: failed to reproduce 'x': failed to run: sleep 9, exited with -15"]) == 143
    assert stage_exit_code(["ERROR: failed to reproduce 'x': something else"]) is None


def test_command_lines() -> None:
    assert dvc_repro_cmd("schedule")[-3:] == ["repro", "--single-item", "schedule"]
    assert "--force" in dvc_repro_cmd("schedule", force=True)
    cmd = dvc_exp_cmd(
        "exp-1", ["schedule"], {"schedule.k": 3, "a.b": [1, 2], "c.d": None, "e.f": True}, copy_paths=["plots"]
    )
    assert cmd[cmd.index("exp") :] == [
        "exp", "run", "--temp", "-n", "exp-1", "-C", "plots",
        "-S", "schedule.k=3", "-S", "a.b=[1, 2]", "-S", "c.d=null", "-S", "e.f=true", "schedule",
    ]  # fmt: skip
    assert format_value(0.5) == "0.5" and format_value("grpo") == "grpo"


def test_streaming_passes_lines_and_stops_at_the_timeout() -> None:
    seen: list[str] = []
    code = "import sys, time\nprint('one', flush=True)\nsys.stderr.write('a\\rb\\n'); sys.stderr.flush()\nprint('two')"
    done = run_streaming([sys.executable, "-c", code], env=stage_env({}), on_line=seen.append)
    assert done.returncode == 0 and not done.timed_out and set(seen) == {"one", "a", "b", "two"}
    t0 = time.monotonic()
    slow = run_streaming(
        [sys.executable, "-c", "import time; print('x', flush=True); time.sleep(60)"],
        env=stage_env({}),
        on_line=seen.append,
        timeout_s=1.0,
        grace_s=10,
    )
    assert slow.timed_out and slow.returncode != 0 and time.monotonic() - t0 < 15


def test_a_stop_leaves_the_shell_wrapper_to_end_with_the_stage_command(tmp_path: Path) -> None:
    """DVC runs a stage as `$SHELL -c CMD`; dash keeps itself between DVC and the command (bash execs it). A stop
    that ended that shell first let DVC see the stage end (-15) and remove the experiment copy while the stage still
    moved its progress out of it. DVC here is a stand-in parent running the real `/bin/sh -c` the same way."""
    kept, child, parent = tmp_path / "kept", tmp_path / "stage.py", tmp_path / "dvc_like.py"
    child.write_text(
        "import signal, sys, time\n"
        "stop = []\n"
        "signal.signal(signal.SIGTERM, lambda *a: stop.append(1))\n"
        "print('ready', flush=True)\n"
        "while not stop: time.sleep(0.05)\n"
        f"time.sleep(1.0); open({str(kept)!r}, 'w').write('x'); sys.exit(130)\n"
    )
    command = f"{sys.executable} {child}"
    parent.write_text(
        "import os, subprocess\n"
        f"rc = subprocess.call(['/bin/sh', '-c', {command!r}])\n"
        f"print('stage exited', rc, 'kept' if os.path.exists({str(kept)!r}) else 'lost', flush=True)\n"
    )
    seen: list[str] = []
    done = run_streaming(
        [sys.executable, str(parent)], env=stage_env({}), on_line=seen.append, timeout_s=1.5, grace_s=20
    )
    assert done.timed_out and "ready" in seen
    assert "stage exited 130 kept" in seen, seen


def test_metrics_and_plots_come_from_dvc_yaml() -> None:
    metrics, plots = stage_files("evaluate")
    assert metrics == ["metrics/predictor.json"] and plots == ["plots/predictor_scatter.png"]
    assert numeric_leaves({"a/b": 1, "c": {"d": 2.5, "e": "x", "f": [1]}, "g": True, "h": float("nan")}) == {
        "a/b": 1.0,
        "c/d": 2.5,
    }


def test_uncached_outputs_are_copied_into_experiments_but_not_checkpoints() -> None:
    copies = uncached_outputs()
    assert {"metrics/profile_timings.csv", "plots/profile_lengths.png", "metrics/schedule.json"} <= set(copies)
    assert "outputs/launch_state" not in copies and "outputs/profile" not in copies


def test_stage_seconds_run_from_one_stage_message_to_the_next() -> None:
    marks = [
        (0.0, "Reproducing experiment 'x'"),
        (1.0, "Stage 'policy' didn't change, skipping"),
        (1.5, "Running stage 'schedule':"),
        (4.0, "[schedule] done in 2.4s"),
    ]
    assert stage_seconds(marks, 5.0) == {"policy": 0.5, "schedule": 3.5}


@pytest.mark.slow  # six DVC commands: 27 s on a loaded 2-core machine
def test_dvcs_status_says_when_dvc_repro_skips_a_stage(tmp_path: Path) -> None:
    """A real DVC project (no git) with one cached stage: `up_to_date` (DVC's Python API) is true exactly when the
    `dvc repro --single-item` that follows says it skipped the stage: not for a new stage, a deleted output
    (restored from the cache), a changed dependency or one changed back (restored from the run cache)."""
    env = dict(os.environ, DVC_NO_ANALYTICS="1")
    (tmp_path / "make.py").write_text("import pathlib\npathlib.Path('out.txt').write_text(open('in.txt').read() * 2)")
    (tmp_path / "in.txt").write_text("a")
    stage = {"cmd": f"{sys.executable} make.py", "deps": ["make.py", "in.txt"], "outs": ["out.txt"]}
    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"hello": stage}}))
    subprocess.run([sys.executable, "-m", "dvc", "init", "-q", "--no-scm"], cwd=tmp_path, env=env, check=True)

    def repro() -> tuple[bool, str]:
        skips = up_to_date(tmp_path, "hello")
        out = subprocess.run(dvc_repro_cmd("hello"), cwd=tmp_path, env=env, capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        return skips, classify((out.stdout + out.stderr).splitlines())["hello"]

    assert repro() == (False, "ran") and (tmp_path / "out.txt").read_text() == "aa"
    assert repro() == (True, "skipped")
    (tmp_path / "out.txt").unlink()
    assert repro() == (False, "restored") and (tmp_path / "out.txt").read_text() == "aa"
    (tmp_path / "in.txt").write_text("b")
    assert repro() == (False, "ran")
    (tmp_path / "in.txt").write_text("a")
    assert repro() == (False, "restored") and (tmp_path / "out.txt").read_text() == "aa"  # from the run cache
    (tmp_path / "make.py").unlink()
    assert not up_to_date(tmp_path, "hello")  # a missing dependency: DVC would run the stage (and fail)


def _dead_pid() -> int:
    """A PID that has just ended (a finished child, reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_release_locks_of_removes_only_the_ended_processes_entries(tmp_path: Path) -> None:
    from dvc.rwlock import SCHEMA

    dead, alive = _dead_pid(), os.getpid()
    lock_file = tmp_path / RWLOCK
    lock_file.parent.mkdir(parents=True)
    mine, theirs = {"pid": dead, "cmd": "dvc repro launch"}, {"pid": alive, "cmd": "dvc status"}
    lock = {
        "write": {"/p/outputs/launch": mine, "/p/outputs/schedule": theirs},
        "read": {"/p/params.yaml": [mine, theirs], "/p/src/asp": [mine]},
    }
    lock_file.write_text(json.dumps(lock))
    assert release_locks_of(tmp_path, [dead, alive]) == 3
    left = SCHEMA(json.loads(lock_file.read_text()))  # still a lock file DVC reads
    assert left == {"write": {"/p/outputs/schedule": theirs}, "read": {"/p/params.yaml": [theirs]}}
    assert release_locks_of(tmp_path, [dead]) == 0  # nothing of it left; a live PID's entries are never touched
    assert release_locks_of(tmp_path / "nowhere", [dead]) == 0  # no lock file: nothing to do


@pytest.mark.slow
def test_a_stopped_dvc_repro_leaves_no_lock_entry_behind(tmp_path: Path) -> None:
    """A stage that ignores SIGTERM makes the stop terminate and then kill DVC itself, which never releases its
    rwlock entries: after the stop none of its process's entries is left, and `dvc status` warns of none."""
    stubborn = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(120)"
    )
    (tmp_path / "stage.py").write_text(stubborn)
    (tmp_path / "params.yaml").write_text("a: 1\n")
    stage = {"cmd": f"{sys.executable} stage.py", "deps": ["stage.py"], "params": ["a"], "outs": ["out.txt"]}
    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"hold": stage}}))
    env = stage_env({"DVC_NO_ANALYTICS": "1"})
    subprocess.run([sys.executable, "-m", "dvc", "init", "--no-scm", "-q"], cwd=tmp_path, env=env, check=True)
    seen: list[str] = []
    done = run_streaming(
        [sys.executable, "-m", "dvc", "repro", "hold"],
        env=env,
        on_line=seen.append,
        cwd=tmp_path,
        timeout_s=8.0,
        grace_s=4.0,
    )
    assert done.timed_out and "up" in seen, seen
    lock_file = tmp_path / RWLOCK
    assert lock_file.is_file()  # DVC had written its entries
    assert json.loads(lock_file.read_text() or "{}") in ({}, {"read": {}, "write": {}}), lock_file.read_text()
    status = subprocess.run(
        [sys.executable, "-m", "dvc", "status"], cwd=tmp_path, env=env, capture_output=True, text=True, check=False
    )
    assert "had been killed" not in status.stdout + status.stderr
