"""The `asp` command: user errors print one message naming the key and exit 2 without a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _asp(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "asp", *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_bad_params_exit_2_naming_the_key(tmp_path: Path) -> None:
    bad = tmp_path / "params.yaml"
    bad.write_text("schedule:\n  b: 0\n")
    out = _asp("params", "check", "--params", str(bad))
    assert out.returncode == 2
    assert "'schedule.b' = 0" in out.stderr and "Traceback" not in out.stderr


def test_unknown_stage_and_preset_exit_2() -> None:
    out = _asp("stage", "nope")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "dvc.yaml defines policy, prepare, profile, train_predictor, evaluate, predict, schedule, launch" in out.stderr
    out = _asp("stage", "../tests/conftest")  # only registered stages run, never an arbitrary .py file
    assert out.returncode == 2 and "no stage '../tests/conftest'" in out.stderr
    out = _asp("params", "check", "--preset", "nope")
    assert out.returncode == 2 and "gpu-cluster" in out.stderr


def test_shipped_params_check_ok() -> None:
    out = _asp("params", "check", "--preset", "gpu-cluster")
    assert out.returncode == 0 and "OK" in out.stdout
