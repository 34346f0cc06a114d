"""A tiny git + DVC project of two stages for end-to-end tests of `asp repro`: `make` writes
outputs/made/data.parquet, `use` reads it and writes outputs/used.txt and metrics/use.json; params.yaml is the repo's,
tracking to a store in the test's folder. `repro(repo, *args)` runs `asp repro ARGS` there as a user's shell would."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
USE = """
import pandas as pd, pathlib, json, sys, yaml
if yaml.safe_load(open("params.yaml"))["common"]["seed"] == 13:  # a value this stage refuses, as asp's stages do
    sys.exit("error: params.yaml: common.seed 13 is refused")
pd.read_parquet("outputs/made/data.parquet")
pathlib.Path("outputs").mkdir(exist_ok=True)
pathlib.Path("outputs/used.txt").write_text("used")
pathlib.Path("metrics").mkdir(exist_ok=True)
pathlib.Path("metrics/use.json").write_text(json.dumps({"use/rows": 1}))
"""
MAKE = """
import pandas as pd, pathlib
pathlib.Path("outputs/made").mkdir(parents=True, exist_ok=True)
pd.DataFrame({"a": range(5000)}).to_parquet("outputs/made/data.parquet")
"""


def user_env() -> dict[str, str]:
    """A user's shell: no test-wide MLflow store or parent run, DVC analytics off."""
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "ASP_PARENT_RUN_ID")}
    return dict(env, DVC_NO_ANALYTICS="1")


def two_stage_project(repo: Path, store: Path, commit: bool = False) -> Path:
    """The project in `repo` (created), not yet run; `commit`: git holds it (a DVC experiment needs a commit)."""
    repo.mkdir(parents=True)
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["common"].update(tracking_uri=f"sqlite:///{store}", experiment="tiny")
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    (repo / "make.py").write_text(MAKE)
    (repo / "use.py").write_text(USE)
    stages = {
        "make": {"cmd": f"{sys.executable} make.py", "deps": ["make.py"], "outs": ["outputs/made"]},
        "use": {
            "cmd": f"{sys.executable} use.py",
            "deps": ["use.py", "outputs/made/data.parquet"],
            "params": ["common.seed"],
            "outs": ["outputs/used.txt"],
            "metrics": [{"metrics/use.json": {"cache": False}}],
        },
    }
    (repo / "dvc.yaml").write_text(yaml.safe_dump({"stages": stages}, sort_keys=False))
    cmds = [["git", "init", "-q"], [sys.executable, "-m", "dvc", "init", "-q"]]
    if commit:
        cmds += [["git", "config", "user.email", "t@e.com"], ["git", "config", "user.name", "t"]]
    for cmd in cmds:
        subprocess.run(cmd, cwd=repo, env=user_env(), check=True, capture_output=True, timeout=120)
    return repo


def commit_all(repo: Path) -> None:
    for cmd in (["git", "add", "-A"], ["git", "commit", "-qm", "run"]):
        subprocess.run(cmd, cwd=repo, env=user_env(), check=True, capture_output=True, timeout=120)


def repro(repo: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "asp", "repro", *args]
    return subprocess.run(cmd, cwd=repo, env=user_env(), capture_output=True, text=True, timeout=300)
