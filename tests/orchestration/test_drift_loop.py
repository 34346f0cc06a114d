"""The drift loop (`asp.orchestration.drift_loop`) against a real Prefect server, real MLflow and real DVC.

    .venv/bin/python -m pytest tests/orchestration/test_drift_loop.py -q     (about 2 minutes; one Prefect server)

Each loop runs in a subprocess (`python -m tests.orchestration.test_drift_loop ROOT MODE MAX_ACTIONS`, the driver at
the bottom) whose environment points Prefect at the module's server, because Prefect reads PREFECT_API_URL once at
import. The loop gets small real stand-ins: `fake_launch` writes `drift_pending.json` like launch does under
ASP_DRIFT_HANDOFF=1 (following ROOT/plan.json), `fake_reprofile` writes `predictors/v<k>/report.json` like
`asp.pipeline.reprofile`. In the DVC tests the launch is the real one (`dvc repro --single-item launch` of a toy
stage in a git + DVC project) and `dvc status` is checked in the middle of the loop and after it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mlflow
import pytest
import yaml

from tests.conftest import Background, prefect_api, start_prefect_server

pytestmark = pytest.mark.slow  # every test runs the loop in a subprocess against a Prefect server: 10-20 s

ROOT = Path(__file__).resolve().parents[2]
CONDITION = "C4"


# -- stand-ins (used by the driver subprocess) --------------------------------------------------------------------
def fake_launch(run: Any, handoff: bool, resume: bool) -> str:
    """One launch segment as launch behaves with the handoff: ROOT/plan.json lists per segment 'drift' (stop
    and write drift_pending.json when the handoff is on, else keep going) or 'finish'; calls go to calls.jsonl."""
    calls = run.root / "calls.jsonl"
    n = len(calls.read_text().splitlines()) if calls.is_file() else 0
    plan = json.loads((run.root / "plan.json").read_text())
    with calls.open("a") as fh:
        fh.write(json.dumps({"handoff": handoff, "resume": resume, "env": run.env().get("ASP_DRIFT_HANDOFF")}) + "\n")
    run.state_dir.mkdir(parents=True, exist_ok=True)
    if n < len(plan) and plan[n] == "drift" and handoff:
        pending = {"event": {"message": f"tau_window 0.41 < 0.62 (segment {n + 1})"}, "step": 10 * (n + 1)}
        (run.state_dir / "drift_pending.json").write_text(json.dumps(pending))
    return "ran"


def fake_reprofile(run: Any, reason: str) -> Any:
    """A re-profile as part C writes it: the next predictors/v<k>/ with report.json (v2 rejected, others
    accepted); with ROOT/check_dvc present, `dvc status --json` at this moment goes to dvc_status_v<k>.json."""
    from asp.orchestration.drift_loop import read_outcome, versions

    k = max(versions(run.state_dir), default=1) + 1
    directory = run.state_dir / "predictors" / f"v{k}"
    directory.mkdir(parents=True)
    accepted = k != 3
    report = {"accepted": accepted, "version": k, "tau": 0.7 if accepted else 0.2, "min_tau": 0.5, "policy_step": 7,
              "prompts": 32, "seconds": 1.5, "message": f"reason: {reason}"}  # fmt: skip
    (directory / "report.json").write_text(json.dumps(report))
    if (run.root / "check_dvc").exists():
        out = subprocess.run([sys.executable, "-m", "dvc", "status", "--json"], cwd=run.root, capture_output=True)
        (run.root / f"dvc_status_v{k}.json").write_bytes(out.stdout)
    return read_outcome(directory)


def _driver(root: Path, mode: str, max_actions: str) -> None:
    from prefect import flow
    from prefect.runtime import flow_run

    from asp.orchestration.drift_loop import drift_loop, run_launch_stage

    @flow(name="drift-loop-test", persist_result=False)
    def loop() -> dict[str, Any]:
        launch = fake_launch if mode == "fake" else run_launch_stage
        result = drift_loop(
            root=root,
            max_actions=None if max_actions == "none" else int(max_actions),
            launch=launch,
            reprofile=fake_reprofile,
            prefect_run=(str(flow_run.id), flow_run.ui_url),
            on_line=print,
        )
        return {**result.as_dict(), "flow_run_id": str(flow_run.id)}

    print("RESULT " + json.dumps(loop()), flush=True)


# -- helpers -------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """One Prefect server for the module (UI off); yields the client environment."""
    bg = Background()
    try:
        env, _, _ = start_prefect_server(tmp_path_factory.mktemp("loop_prefect"), bg, PREFECT_UI_ENABLED="false")
        env = {k: v for k, v in env.items() if k != "ASP_PARENT_RUN_ID"}
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
        yield dict(env, DVC_NO_ANALYTICS="1", PYTHONPATH=str(ROOT))
    finally:
        for proc, _ in reversed(bg.procs):
            bg.stop(proc)


def _project(root: Path, params: dict[str, Any] | None = None) -> Path:
    """dvc.yaml and params.yaml of the repository (validated by the loop) in `root`."""
    root.mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / "dvc.yaml", root / "dvc.yaml")
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    raw["runtime"]["condition"] = CONDITION
    raw["drift"].update({"enabled": True, "action": "reprofile"}, **(params or {}))
    (root / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    return root


def _loop(env: dict[str, str], root: Path, mode: str, max_actions: int | None = None) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "tests.orchestration.test_drift_loop", str(root), mode, str(max_actions).lower()]
    out = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, f"driver failed ({out.returncode}):\n{out.stdout[-4000:]}\n{out.stderr[-4000:]}"
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("RESULT "))
    return {**json.loads(line[len("RESULT ") :]), "log": out.stdout + out.stderr}


def _calls(root: Path) -> list[tuple[bool, bool, str | None]]:
    rows = [json.loads(ln) for ln in (root / "calls.jsonl").read_text().splitlines()]
    return [(r["handoff"], r["resume"], r["env"]) for r in rows]


def _events(env: dict[str, str], flow_run_id: str, timeout_s: float = 60) -> list[dict[str, Any]]:
    """The asp.* events related to the flow run (the server stores events asynchronously: poll)."""
    body = {"filter": {"event": {"prefix": ["asp."]}, "any_resource": {"id": [f"prefect.flow-run.{flow_run_id}"]}},
            "limit": 50}  # fmt: skip
    deadline = time.monotonic() + timeout_s
    while True:
        found = prefect_api(env, "/events/filter", body)["events"]
        if len(found) >= 4 or time.monotonic() > deadline:
            return sorted(found, key=lambda e: e["occurred"])
        time.sleep(1)


# -- the loop's control logic -----------------------------------------------------------------------------------
def test_two_drifts_reprofile_twice_then_the_last_launch_runs_without_handoff(
    server: dict[str, str], tmp_path: Path
) -> None:
    root = _project(tmp_path / "p", {"max_actions": 2})
    (root / "plan.json").write_text(json.dumps(["drift", "drift", "drift", "finish"]))
    t0 = time.monotonic()
    result = _loop(server, root, "fake")  # max_actions from params: drift.max_actions = 2
    print(f"loop with 2 re-profiles and 3 launch segments: {time.monotonic() - t0:.1f} s (driver subprocess)")
    # segment 3 drifts too, but 2 re-profiles are done: it runs without the handoff (so launch finishes)
    assert _calls(root) == [(True, False, "1"), (True, True, "1"), (False, True, None)]
    assert [r["version"] for r in result["reprofiles"]] == [2, 3]
    assert [r["accepted"] for r in result["reprofiles"]] == [True, False]
    assert [e["step"] for e in result["events"]] == [10, 20]
    assert "segment 1" in result["events"][0]["reason"] and "segment 1" in result["reprofiles"][0]["message"]
    assert not (root / "outputs/launch_state" / CONDITION / "drift_pending.json").exists()

    run_id = result["flow_run_id"]
    subflows = prefect_api(server, "/flow_runs/filter", {"flow_runs": {"parent_flow_run_id": {"any_": [run_id]}}})
    assert sorted(r["name"] for r in subflows) == ["reprofile 1 after step 10", "reprofile 2 after step 20"]
    assert all(r["state_type"] == "COMPLETED" for r in subflows)
    tasks = prefect_api(server, "/task_runs/filter", {"flow_runs": {"id": {"any_": [run_id]}}})
    assert len(tasks) == 2  # the sub-flows' task runs in the parent; fake_launch is no task
    notes = prefect_api(server, "/artifacts/filter", {"artifacts": {"key": {"any_": ["asp-reprofile"]}}})
    texts = sorted(a["data"] for a in notes if a["flow_run_id"] in {r["id"] for r in subflows})
    assert len(texts) == 2 and any("v2: accepted" in t for t in texts) and any("v3: rejected" in t for t in texts)
    assert all("Drift at trainer step" in t and "MLflow parent run" in t for t in texts)
    table = prefect_api(server, "/artifacts/filter", {"artifacts": {"key": {"any_": ["asp-drift-loop"]}}})
    rows = [r for a in table if a["flow_run_id"] == run_id for r in json.loads(a["data"])]
    steps = ["launch 1", "reprofile v2", "launch 2", "reprofile v3", "launch 3"]
    assert [r["step"] for r in rows] == steps

    events = _events(server, run_id)
    names = [e["event"] for e in events]
    assert names == ["asp.drift.detected", "asp.reprofile.completed"] * 2, names
    assert {e["resource"]["prefect.resource.id"] for e in events} == {f"asp.launch.{CONDITION}"}
    assert events[0]["payload"]["step"] == 10 and events[1]["payload"]["accepted"] is True
    assert events[3]["payload"]["version"] == 3 and events[3]["payload"]["tau"] == 0.2
    roles = {r["prefect.resource.role"] for r in events[0]["related"]}
    assert {"flow-run", "mlflow"} <= roles


@pytest.mark.extended  # an interrupted loop: test_an_interrupted_loop_leaves_dvc_saying_launch_must_run
def test_a_pending_event_left_by_an_interrupted_loop_is_reprofiled_first(
    server: dict[str, str], tmp_path: Path
) -> None:
    root = _project(tmp_path / "p")
    state = root / "outputs/launch_state" / CONDITION
    state.mkdir(parents=True)
    (state / "drift_pending.json").write_text(json.dumps({"event": {"message": "bias 1.31"}, "step": 40}))
    (root / "plan.json").write_text(json.dumps(["finish"]))
    result = _loop(server, root, "fake", max_actions=1)
    assert [r["version"] for r in result["reprofiles"]] == [2] and result["events"] == [
        {"step": 40, "reason": "bias 1.31"}
    ]
    assert _calls(root) == [(False, True, None)]  # 1 re-profile done: launch resumes without the handoff
    assert not (state / "drift_pending.json").exists()


def test_without_drift_the_loop_is_one_launch_and_max_actions_zero_never_hands_off(
    server: dict[str, str], tmp_path: Path
) -> None:
    root = _project(tmp_path / "p")
    (root / "plan.json").write_text(json.dumps(["finish"]))
    result = _loop(server, root, "fake")
    assert _calls(root) == [(True, False, "1")] and result["reprofiles"] == [] and result["events"] == []
    root2 = _project(tmp_path / "q")
    (root2 / "plan.json").write_text(json.dumps(["drift"]))
    result = _loop(server, root2, "fake", max_actions=0)
    assert _calls(root2) == [(False, False, None)] and result["reprofiles"] == []


# -- DVC truthfulness ------------------------------------------------------------------------------------------
TOY_LAUNCH = """
import json, os
from pathlib import Path
cfg = json.loads(Path("toy.json").read_text())
state = Path("outputs/launch_state") / cfg["condition"]
state.mkdir(parents=True, exist_ok=True)
ck = state / "ckpt.json"
step = json.loads(ck.read_text())["step"] if ck.exists() else 0
handoff = os.environ.get("ASP_DRIFT_HANDOFF") == "1"
applied = sorted(p.name for p in (state / "predictors").glob("v*")) if (state / "predictors").exists() else []
with (state / "sessions.jsonl").open("a") as fh:
    fh.write(json.dumps({"start": step, "handoff": handoff, "predictors": applied}) + "\\n")
while step < cfg["steps"]:
    step += 1
    ck.write_text(json.dumps({"step": step}))
    if step in cfg["drift_at"] and handoff:
        (state / "drift_pending.json").write_text(json.dumps({"event": {"message": f"drift at {step}"}, "step": step}))
        break
Path("outputs/launch").mkdir(parents=True, exist_ok=True)
Path("outputs/launch/summary.json").write_text(json.dumps({"step": step}))
Path("metrics").mkdir(exist_ok=True)
Path("metrics/launch.json").write_text(json.dumps({"runtime": {"summary": {"finished": int(step == cfg["steps"])}}}))
"""


def _git_dvc_project(root: Path, drift_at: list[int]) -> Path:
    """A git + DVC project whose only stage is a toy `launch` with launch's outputs (launch_state persisted,
    uncached), which checkpoints per step and hands a drift over at the steps in `drift_at`."""
    _project(root)
    spec = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]["launch"]
    stage = {"cmd": "python toy_launch.py", "deps": ["toy_launch.py", "toy.json"], "outs": spec["outs"],
             "metrics": spec["metrics"]}  # fmt: skip
    (root / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"launch": stage}}, sort_keys=False))
    (root / "toy_launch.py").write_text(TOY_LAUNCH)
    (root / "toy.json").write_text(json.dumps({"condition": CONDITION, "steps": 10, "drift_at": drift_at}))
    (root / ".gitignore").write_text("/outputs/\n/metrics/\n/mlflow.db\n/mlartifacts/\n*.jsonl\n/check_dvc\n")
    env = dict(os.environ, DVC_NO_ANALYTICS="1")
    for cmd in (["git", "init", "-q"], ["git", "config", "user.email", "t@example.com"],
                ["git", "config", "user.name", "t"], [sys.executable, "-m", "dvc", "init", "-q"],
                ["git", "add", "-A"], ["git", "commit", "-qm", "toy"]):  # fmt: skip
        subprocess.run(cmd, cwd=root, env=env, check=True, capture_output=True)
    return root


def _dvc_status(root: Path) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "dvc", "status", "--json"], cwd=root, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout)


def test_launch_through_dvc_resumes_after_each_reprofile_and_dvc_status_tells_the_truth(
    server: dict[str, str], tmp_path: Path
) -> None:
    root = _git_dvc_project(tmp_path / "toy", drift_at=[3, 6])
    (root / "check_dvc").write_text("")
    t0 = time.monotonic()
    result = _loop(server, root, "dvc", max_actions=2)
    print(f"loop through DVC, 3 launch segments and 2 re-profiles: {time.monotonic() - t0:.1f} s")
    assert [s["status"] for s in result["segments"]] == ["ran", "ran", "ran"]  # DVC ran every segment
    state = root / "outputs/launch_state" / CONDITION
    sessions = [json.loads(ln) for ln in (state / "sessions.jsonl").read_text().splitlines()]
    assert sessions == [
        {"start": 0, "handoff": True, "predictors": []},
        {"start": 3, "handoff": True, "predictors": ["v2"]},  # resumed from its checkpoint, re-profile in place
        {"start": 6, "handoff": False, "predictors": ["v2", "v3"]},  # max_actions reached: runs to the end
    ]
    assert json.loads((root / "metrics/launch.json").read_text())["runtime"]["summary"]["finished"] == 1
    # in the middle of the loop (while re-profiling) DVC says launch must run: the handoff segment is not final
    for k in (2, 3):
        mid = json.loads((root / f"dvc_status_v{k}.json").read_text())
        assert "outputs/launch_state" in json.dumps(mid["launch"]), mid
    assert _dvc_status(root) == {}  # after the loop: up to date, and launch did finish
    assert (
        "Running stage 'launch'" in result["log"]
        and "dvc repro --force --single-item launch, ASP_DRIFT_HANDOFF=0" in result["log"]
    )


def test_an_interrupted_loop_leaves_dvc_saying_launch_must_run(server: dict[str, str], tmp_path: Path) -> None:
    """A loop that died after claiming the event (here: the re-profile failed) leaves launch stale in `dvc status`,
    and a plain `dvc repro` (no handoff) resumes it to the end."""
    root = _git_dvc_project(tmp_path / "toy", drift_at=[4])
    cmd = [sys.executable, "-c", FAILING_LOOP, str(root)]
    out = subprocess.run(cmd, cwd=root, env=server, capture_output=True, text=True, timeout=600)
    assert out.returncode == 1 and "re-profile exploded" in out.stdout + out.stderr, out.stderr[-3000:]
    assert "launch" in _dvc_status(root)
    subprocess.run(
        [sys.executable, "-m", "dvc", "repro", "launch"], cwd=root, env=server, check=True, capture_output=True
    )
    sessions = (root / "outputs/launch_state" / CONDITION / "sessions.jsonl").read_text().splitlines()
    assert [json.loads(s)["start"] for s in sessions] == [0, 4] and _dvc_status(root) == {}


FAILING_LOOP = """
import sys
from pathlib import Path
from prefect import flow
from asp.orchestration.drift_loop import drift_loop

def explode(run, reason):
    raise RuntimeError("re-profile exploded")

@flow(name="drift-loop-test-failing", persist_result=False)
def loop():
    drift_loop(root=Path(sys.argv[1]), max_actions=1, reprofile=explode)

try:
    loop()
except RuntimeError as exc:
    print(exc)
    sys.exit(1)
"""


# -- asp serve --------------------------------------------------------------------------------------------------
def test_asp_serve_serves_the_drift_loop_and_a_triggered_run_completes(server: dict[str, str], tmp_path: Path) -> None:
    root = _git_dvc_project(tmp_path / "toy", drift_at=[5])
    bg = Background()
    try:
        env = dict(server, PREFECT_RUNNER_POLL_FREQUENCY="2")
        serve = bg.start([sys.executable, "-m", "asp", "serve"], log=tmp_path / "serve.log", env=env, cwd=root)
        api = server["PREFECT_API_URL"]
        url = f"{api}/deployments/name/asp-drift-loop/asp-drift-loop"
        deployment = json.loads(bg.wait_http(url, serve, 180))
        bg.wait_http(f"{api}/deployments/name/asp-pipeline/asp-pipeline", serve, 30)
        assert "max_actions" in deployment["parameter_openapi_schema"]["properties"]
        assert (deployment.get("global_concurrency_limit") or {}).get("limit") == 1
        deadline = time.monotonic() + 60
        while f"/deployments/deployment/{deployment['id']}" not in bg.log(serve) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert f"/deployments/deployment/{deployment['id']}" in bg.log(serve)  # printed its URL
        run = prefect_api(
            server, f"/deployments/{deployment['id']}/create_flow_run", {"parameters": {"max_actions": 0}}
        )
        deadline = time.monotonic() + 300
        while run["state_type"] not in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED"):
            assert time.monotonic() < deadline, f"flow run still {run['state_type']}:\n{bg.log(serve)}"
            time.sleep(1)
            run = prefect_api(server, f"/flow_runs/{run['id']}")
        assert run["state_type"] == "COMPLETED", (run["state"], bg.log(serve))
        assert run["name"].startswith("drift-loop ")
        (parent,) = mlflow.search_runs(
            search_all_experiments=True,
            filter_string=f"tags.`asp.prefect_flow_run_id` = '{run['id']}'",
            output_format="list",
        )
        assert parent.info.run_name == run["name"]  # MLflow names the loop's parent run as Prefect does
        sessions = (root / "outputs/launch_state" / CONDITION / "sessions.jsonl").read_text().splitlines()
        assert [json.loads(s)["handoff"] for s in sessions] == [False]  # max_actions 0: no handoff
        assert _dvc_status(root) == {}
        assert bg.stop(serve, signal.SIGINT, timeout_s=120) in (0, 130, -signal.SIGINT), bg.log(serve)
    finally:
        for proc, _ in reversed(bg.procs):
            bg.stop(proc)


if __name__ == "__main__":
    _driver(Path(sys.argv[1]), sys.argv[2], sys.argv[3])
