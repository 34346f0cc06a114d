"""What a Prefect run's log shows (issue 39, items 5 and 6), through a real Prefect server: the launch stage's
progress lines (`asp.steps.launch_state.Recorder`, printed by the stage process and forwarded line by line as the
pipeline flow's stage task does, `asp.orchestration.dvc.run_streaming`) reach the flow run's log, and a failed run's
last line, Prefect's "Finished in state Failed(...)", is logged at ERROR (`asp.orchestration.prefect_run`).
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import prefect_api

STAGE = """
import sys, types
from pathlib import Path
from asp.steps.launch_state import Recorder

recorder = Recorder(Path(sys.argv[1]), 20)
for step in range(1, 21):
    recorder(types.SimpleNamespace(step=step), {"runtime/iteration_time_s": 0.5, "train/reward_mean": 0.25})
recorder.close()
"""

FLOW = """
import os, sys
from prefect import flow, get_run_logger
from asp.orchestration.dvc import run_streaming
from asp.orchestration.prefect_run import quiet_user_errors

@flow(name="asp-log-check")
def check(stage: str, history: str) -> None:
    quiet_user_errors()
    env = dict(os.environ, ASP_PROGRESS="1")
    result = run_streaming([sys.executable, "-c", stage, history], env=env, on_line=get_run_logger().info)
    assert result.returncode == 0
    raise RuntimeError("stage launch failed")  # what a failed stage does to the flow

state = check(sys.argv[1], sys.argv[2], return_state=True)
print("STATE", state.type.value, flush=True)
"""


def _logs(env: dict[str, str], flow_run_id: str) -> list[dict[str, Any]]:
    body = {"logs": {"flow_run_id": {"any_": [flow_run_id]}}, "sort": "TIMESTAMP_ASC", "limit": 200}
    return prefect_api(env, "/logs/filter", body)


def test_launch_progress_reaches_the_flow_log_and_a_failed_run_ends_at_error(
    prefect_server: dict[str, str], tmp_path: Path
) -> None:
    env = dict(prefect_server, ASP_PROGRESS="1")
    args = [sys.executable, "-c", FLOW, STAGE, str(tmp_path / "iterations.jsonl")]
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)
    assert "STATE FAILED" in done.stdout, done.stdout[-2000:] + done.stderr[-3000:]
    runs = prefect_api(env, "/flow_runs/filter", {"flows": {"name": {"any_": ["asp-log-check"]}}})
    assert len(runs) == 1
    deadline, logs = time.monotonic() + 30, []
    while time.monotonic() < deadline:  # the run's logs reach the server in batches
        logs = _logs(env, runs[0]["id"])
        if any(log["message"].startswith("Finished in state") for log in logs):
            break
        time.sleep(0.5)
    progress = [log["message"] for log in logs if log["message"].startswith("[launch]")]
    assert progress[0] == "[launch] 0% (0/20 step) started", progress
    assert [p.split()[1] for p in progress] == [f"{n}%" for n in range(0, 101, 10)], progress
    assert "reward=0.250" in progress[1] and progress[-1].startswith("[launch] 100% (20/20 step) done")
    final = [log for log in logs if log["message"].startswith("Finished in state")]
    assert len(final) == 1 and final[0]["message"].startswith("Finished in state Failed"), final
    assert final[0]["level"] == 40, final  # logging.ERROR


@pytest.fixture(autouse=True)
def _progress_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASP_PROGRESS", "1")
