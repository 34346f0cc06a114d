"""A real `launch` stopped as users stop it, then run again: nothing trained twice (the trainer ledger), nothing lost.

Two stops that used to cost the whole run (docs/reliability.md, "Stops, resumes and values caught before the run"):

* a launch whose params changed since its last finished run (so it starts afresh), stopped by Ctrl-C after it
  saved a checkpoint: the stop keeps that progress in `outputs/launch_state` instead of putting the finished run's
  state back, and `asp repro launch` resumes it;
* a launch run as a DVC experiment (`asp repro --set ...`, which runs in a temporary copy DVC removes), stopped by
  SIGTERM (what Prefect's Cancel and a job scheduler send `asp`): its progress is kept under `.dvc/tmp` and the same
  command resumes it, with the workspace and params.yaml untouched.

The project is a git + DVC repository whose one stage is the real `launch` (`asp stage launch`, the simulated
trainer over the tiny demo policy's rollouts, 6 steps, a checkpoint every 2 steps) on the inputs of
tests/pipeline/test_kill_points.py. The stop comes at a known point: the test hook ``ASP_HOLD_AT=checkpoint@2``
(`asp.runtime.testhooks`) holds the stage just after the position of step 2 was saved, and the test then sends the
signal. The stage processes join this session's Ray cluster. Both are marked `extended` (`make test-all`); CI runs
the same kept-progress mechanisms with a quicker stage (tests/orchestration/test_cancel.py).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest
import yaml

from asp.config import deep_merge
from asp.runtime.testhooks import HOLD_AT_ENV, HOLD_MARK_ENV, LEDGER_ENV
from asp.tracking import PARENT_ENV

from .conftest import make_params
from .test_kill_points import N_TRAIN, RUNTIME, STEPS, inputs, ray_address  # noqa: F401 (fixtures)

ROOT = Path(__file__).resolve().parents[2]
# three launches per test, each through `asp repro` and DVC: about a minute each. `make test-all` runs them; CI runs
# the same mechanisms with a quicker stage (tests/orchestration/test_cancel.py: a changed stage stopped keeps the
# progress it saved; a stopped experiment keeps its progress) and kills real launches in test_kill_points.py
pytestmark = [pytest.mark.slow, pytest.mark.extended]

STAGE = {
    "cmd": "asp stage launch",
    "deps": ["outputs/prompts/train.parquet", "outputs/schedule"],
    "params": ["runtime"],
    "outs": ["outputs/launch", {"outputs/launch_state": {"persist": True, "cache": False}}],
    "metrics": [{"metrics/launch.json": {"cache": False}}],
    "plots": [{"plots/launch_timeline.png": {"cache": False}}, {"plots/learning_curve.png": {"cache": False}}],
}


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in (PARENT_ENV, "PREFECT_API_URL", HOLD_AT_ENV)}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    # DVC runs stages through $SHELL: /bin/sh (dash on Debian, as where $SHELL is unset) keeps itself between DVC
    # and the stage, unlike bash, which is the case a stop has to get right
    return dict(env, DVC_NO_ANALYTICS="1", SHELL="/bin/sh", **extra)


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=root, check=True, capture_output=True, text=True, timeout=60).stdout


def _asp(root: Path, *args: str, **env: str) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "asp", "repro", *args],
        cwd=root,
        env=_env(**env),
        capture_output=True,
        text=True,
        timeout=600,
    )
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-4000:]
    return text


@pytest.fixture(scope="module")
def finished(inputs: Path, ray_address: str, tmp_path_factory: pytest.TempPathFactory) -> Path:  # noqa: F811
    """The repository after a first, finished `asp repro launch`, committed."""
    root = tmp_path_factory.mktemp("stop_resume") / "repo"
    shutil.copytree(inputs / "outputs", root / "outputs", symlinks=True)
    (root / "stages").symlink_to(ROOT / "stages")
    params = make_params(
        {
            "common": {"experiment": f"stop-{uuid.uuid4().hex[:8]}"},
            "runtime": deep_merge(RUNTIME, {"ray": {"address": ray_address}}),
        }
    )
    (root / "params.yaml").write_text(yaml.safe_dump(params.model_dump(mode="json"), sort_keys=False))
    (root / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"launch": STAGE}}, sort_keys=False))
    (root / ".gitignore").write_text("__pycache__/\n/mlartifacts/\n")
    _git(root, "init", "-q")
    _git(root, "config", "user.email", "t@e.com")
    _git(root, "config", "user.name", "t")
    subprocess.run([sys.executable, "-m", "dvc", "init", "-q"], cwd=root, env=_env(), check=True, timeout=120)
    _asp(root, "launch")
    _git(root, "add", "-A")
    _git(root, "commit", "-qm", "project")
    return root


@pytest.fixture
def project(finished: Path, tmp_path: Path) -> Path:
    """A copy of the finished repository of its own (git, DVC, outputs, the launch's state)."""
    root = tmp_path / "repo"
    shutil.copytree(finished, root, symlinks=True)
    return root


def _stopped(root: Path, tmp_path: Path, args: list[str], how: str) -> tuple[int, str]:
    """`asp repro ARGS` held just after the checkpoint of step 2, then stopped: "ctrl-c" is SIGINT to its whole
    process group (a terminal's Ctrl-C), "sigterm" SIGTERM to `asp` alone (Prefect's Cancel). Returns the exit code
    and the output."""
    mark, log = tmp_path / "held", tmp_path / "stopped.log"
    env = _env(**{HOLD_AT_ENV: "checkpoint@2", HOLD_MARK_ENV: str(mark), LEDGER_ENV: str(tmp_path / "ledger.jsonl")})
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "asp", "repro", *args],
            cwd=root,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
    try:
        deadline = time.monotonic() + 400
        while not mark.is_file():
            assert proc.poll() is None, f"exited {proc.returncode} before step 2: {log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, "the launch did not reach step 2"
            time.sleep(0.2)
        if how == "ctrl-c":
            os.killpg(proc.pid, signal.SIGINT)
        else:
            proc.send_signal(signal.SIGTERM)
        code = proc.wait(180)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    text = log.read_text()
    assert "Traceback" not in text, text[-4000:]
    return code, text


def _trained_once(ledger: Path) -> None:
    """Across the stopped attempt and the rerun: steps 1..STEPS once each, every train prompt once."""
    lines = [json.loads(line) for line in ledger.read_text().splitlines()]
    assert [line["step"] for line in lines] == list(range(1, STEPS + 1)), lines
    assert Counter(p for line in lines for p in line["prompt_ids"]) == Counter(f"q{i:03d}" for i in range(N_TRAIN))


def _dvc_status(root: Path) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "dvc", "status"], cwd=root, env=_env(), capture_output=True, text=True, timeout=120
    )
    return out.stdout + out.stderr


def test_a_changed_launch_stopped_by_ctrl_c_resumes_with_nothing_trained_twice(project: Path, tmp_path: Path) -> None:
    root = project
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["runtime"]["trainer"]["step_s"] = 0.001  # a params change: DVC reruns launch, and the finished run restarts
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))

    code, text = _stopped(root, tmp_path, ["launch"], "ctrl-c")
    assert code == 130, text[-4000:]
    assert "keeps the stopped run's progress" in text, text[-4000:]
    state = json.loads((root / "outputs/launch_state/C4/runtime_state.json").read_text())
    assert (state["finished"], state["trainer_step"]) == (False, 2)
    assert "modified" in _dvc_status(root)  # truthful: the params changed and the stage has not finished

    text = _asp(root, "launch", **{LEDGER_ENV: str(tmp_path / "ledger.jsonl")})
    assert "after step 2" in text, text[-4000:]
    _trained_once(tmp_path / "ledger.jsonl")
    assert json.loads((root / "metrics/launch.json").read_text())["runtime/summary/resumed_from_step"] == 2
    assert "up to date" in _dvc_status(root)


def test_a_stopped_set_experiment_of_launch_resumes_with_nothing_trained_twice(project: Path, tmp_path: Path) -> None:
    root = project
    args = ["launch", "--set", "runtime.trainer.step_s=0.002"]
    params_before = (root / "params.yaml").read_bytes()

    code, text = _stopped(root, tmp_path, args, "sigterm")
    assert code != 0, text[-4000:]
    assert "Its progress (outputs/launch_state) is kept in .dvc/tmp/asp-exp-progress/" in text, text[-4000:]
    assert _git(root, "status", "--porcelain") == "" and (root / "params.yaml").read_bytes() == params_before

    text = _asp(root, *args, **{LEDGER_ENV: str(tmp_path / "ledger.jsonl")})
    assert "the progress a stopped run of this experiment kept" in text and "after step 2" in text, text[-4000:]
    _trained_once(tmp_path / "ledger.jsonl")
    assert not list((root / ".dvc/tmp/asp-exp-progress").glob("*/outputs"))  # finished: nothing left to resume
    assert _git(root, "status", "--porcelain") == "" and (root / "params.yaml").read_bytes() == params_before
