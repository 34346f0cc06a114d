"""A damaged input file (another stage's output, truncated or corrupt) refused with one message naming it, before
anything runs: `asp.stage.check_stage_inputs` on the repo's dvc.yaml for the schedule, profile and predictions files
(unit level), and `asp repro STAGE` on a tiny DVC project, where the check runs before DVC starts the stage, so the
stage's outputs are not deleted (slow: a DVC project in a subprocess)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from asp.errors import UserError
from asp.io.inputs import damaged
from asp.stage import check_stage_inputs, stage_inputs
from tests.orchestration.tiny import repro, two_stage_project, user_env

ROOT = Path(__file__).resolve().parents[1]


def _parquet(path: Path, rows: int = 2000) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame({"prompt_id": [f"p{i:07d}" for i in range(rows)], "x": range(rows)}).to_parquet(path)
    return path


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])  # what `truncate -s` does: the footer is gone


@pytest.fixture
def project(tmp_path: Path) -> Path:
    shutil.copy(ROOT / "dvc.yaml", tmp_path / "dvc.yaml")
    for rel in (
        "outputs/schedule/schedule.parquet",
        "outputs/predictions.parquet",
        "outputs/profile/prompts.parquet",
        "outputs/prompts/heldout.parquet",
        "outputs/prompts/train.parquet",
    ):
        _parquet(tmp_path / rel)
    (tmp_path / "outputs/calibration.json").write_text(json.dumps({"kind": "identity"}))
    return tmp_path


@pytest.mark.parametrize(
    ("rel", "stage", "owner"),
    [
        ("outputs/schedule/schedule.parquet", "launch", "schedule"),
        ("outputs/profile/prompts.parquet", "schedule", "profile"),
        ("outputs/predictions.parquet", "launch", "predict"),
        ("outputs/predictions.parquet", "schedule", "predict"),
        ("outputs/calibration.json", "schedule", "evaluate"),
    ],
)
def test_a_damaged_input_is_named_with_the_stage_that_wrote_it(
    project: Path, rel: str, stage: str, owner: str
) -> None:
    check_stage_inputs(stage, project)  # intact: nothing to say
    _truncate(project / rel)
    with pytest.raises(UserError) as err:
        check_stage_inputs(stage, project)
    text = str(err.value)
    kind = "Parquet" if rel.endswith(".parquet") else "JSON"
    assert text.startswith(f"{rel}: not a readable {kind} file (")
    assert f"an output of stage '{owner}' that stage '{stage}' reads" in text and "no output was deleted" in text
    assert f"dvc checkout --force {owner}" in text and f"asp repro {owner}" in text


def test_the_inputs_are_the_outputs_of_other_stages_only() -> None:
    inputs = {str(p): owner for p, owner in stage_inputs("launch", ROOT)}
    assert inputs[str(ROOT / "outputs/schedule")] == "schedule"
    assert inputs[str(ROOT / "outputs/predictions.parquet")] == "predict"
    assert not any("src/" in p or "stages/" in p for p in inputs)  # code is not an input file
    assert stage_inputs("policy", ROOT) == []


def test_a_damaged_page_is_found_too(tmp_path: Path) -> None:
    path = _parquet(tmp_path / "x.parquet", rows=50_000)
    assert damaged(path) is None
    data = bytearray(path.read_bytes())
    data[len(data) // 3 : len(data) // 3 + 64] = b"\xff" * 64  # footer intact, a data page damaged
    path.write_bytes(bytes(data))
    assert (damaged(path) or "").startswith("not a readable Parquet file")


@pytest.mark.slow
def test_asp_repro_refuses_a_damaged_input_before_dvc_deletes_any_output(tmp_path: Path) -> None:
    repo = two_stage_project(tmp_path / "repo", tmp_path / "store.db")
    assert repro(repo).returncode == 0
    lock = (repo / "dvc.lock").read_text()
    _truncate(repo / "outputs/made/data.parquet")
    out = repro(repo, "use")
    assert out.returncode == 2, out.stderr[-3000:]
    assert out.stderr.count("error:") == 1 and "Traceback" not in out.stderr
    assert "error: outputs/made/data.parquet: not a readable Parquet file" in out.stderr
    assert "Running stage 'use'" not in out.stderr + out.stdout  # DVC never started it
    assert (repo / "outputs/used.txt").read_text() == "used" and (repo / "metrics/use.json").is_file()
    assert (repo / "dvc.lock").read_text() == lock
    checkout = [sys.executable, "-m", "dvc", "checkout", "--force", "make"]
    subprocess.run(checkout, cwd=repo, env=user_env(), check=True, capture_output=True, timeout=120)
    status = subprocess.run(
        [sys.executable, "-m", "dvc", "status", "--json"], cwd=repo, env=user_env(), capture_output=True, text=True
    )
    assert json.loads(status.stdout) == {}  # repaired from the cache: nothing to run again
