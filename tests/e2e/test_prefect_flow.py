"""The Prefect flow runs the same stage functions: policy + prepare under one MLflow parent run."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from mlflow import MlflowClient

from asp.config import deep_merge

from .conftest import TINY

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
from flows.pipeline import asp_pipeline
out = asp_pipeline(["prepare", "policy"])
print("STAGES", sorted(out))
"""


@pytest.mark.slow
def test_flow_runs_stages_under_parent_run(tmp_path: Path, _mlflow_store: str) -> None:
    params = deep_merge(yaml.safe_load((ROOT / "params.yaml").read_text()), TINY)
    params["common"]["experiment"] = "prefect-flow-test"
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    shutil.copy(ROOT / "dvc.yaml", tmp_path / "dvc.yaml")  # the stage registry
    env = dict(
        os.environ,
        PYTHONPATH=str(ROOT),
        PREFECT_HOME=str(tmp_path / "prefect"),
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="300",  # a throw-away server on 2 busy cores is slow
        PREFECT_API_URL="",
    )
    env.pop("PREFECT_API_URL")
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "STAGES ['policy', 'prepare']" in out.stdout
    assert (tmp_path / "outputs/prompts/train.parquet").is_file()
    client = MlflowClient()
    exp = client.get_experiment_by_name("prefect-flow-test")
    runs = client.search_runs([exp.experiment_id])
    parent = next(r for r in runs if r.info.run_name == "pipeline")
    children = {r.info.run_name for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id}
    assert children == {"policy", "prepare"}
