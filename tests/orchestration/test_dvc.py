"""The DVC driver: what DVC did per stage (from its own messages), the command lines, streaming with a timeout
and a clean stop of the running child."""

from __future__ import annotations

import sys
import time

from asp.orchestration.dvc import classify, dvc_exp_cmd, dvc_repro_cmd, format_value, run_streaming, stage_env
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
