"""DVC wiring on a copy of the repo: `dvc repro` runs policy + prepare, a second repro is a no-op, and a
changed `prepare` param reruns prepare only (not policy)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from asp.config import deep_merge

from .conftest import TINY

ROOT = Path(__file__).resolve().parents[2]


def _sh(cmd: list[str], cwd: Path) -> str:
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    out = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    assert out.returncode == 0, f"{' '.join(cmd)} failed:\n{out.stdout}\n{out.stderr}"
    return out.stdout + out.stderr


@pytest.mark.slow
def test_repro_noop_and_param_change_reruns_only_dependents(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    for item in ("dvc.yaml", "stages", "src", "data", "configs", ".dvcignore"):
        src = ROOT / item
        (shutil.copytree if src.is_dir() else shutil.copy)(src, repo / item)
    params = deep_merge(yaml.safe_load((ROOT / "params.yaml").read_text()), TINY)
    (repo / "params.yaml").write_text(yaml.safe_dump(params))
    _sh(["git", "init", "-q"], repo)
    _sh([sys.executable, "-m", "dvc", "init", "-q"], repo)
    _sh([sys.executable, "-m", "dvc", "config", "core.analytics", "false"], repo)

    first = _sh([sys.executable, "-m", "dvc", "repro", "prepare"], repo)
    assert "Running stage 'policy'" in first and "Running stage 'prepare'" in first
    assert (repo / "outputs/prompts/train.parquet").is_file()
    assert (repo / "outputs/policy/model/config.json").is_file()

    second = _sh([sys.executable, "-m", "dvc", "repro", "prepare"], repo)
    assert "Running stage" not in second

    params["prepare"]["heldout_prompts"] = 40
    (repo / "params.yaml").write_text(yaml.safe_dump(params))
    third = _sh([sys.executable, "-m", "dvc", "repro", "prepare"], repo)
    assert "Running stage 'prepare'" in third and "Running stage 'policy'" not in third
