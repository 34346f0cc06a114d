"""A project moved or copied with its tracking store (mlflow.db beside mlartifacts/) shows and writes its own
artifacts: the experiment's artifact location, its runs' artifact URIs and the registered model's source point
into the project where it is now, read back through MLflow's own API; the original is left as it was; a store
outside the project is never rewritten.

    .venv/bin/python -m pytest tests/test_tracking_store_moved.py -q
"""

from __future__ import annotations

import logging
import shutil
import sqlite3
from pathlib import Path

import pytest
from mlflow import MlflowClient
from mlflow.artifacts import download_artifacts

from asp.tracking import PARENT_ENV, mlflow_client, open_tracker, register_predictor
from asp.tracking.store import relocate_artifacts

EXPERIMENT = "moved"
MODEL = "moved-predictor"


def _uri(root: Path) -> str:
    return f"sqlite:///{root / 'mlflow.db'}"


def _artifacts(root: Path) -> str:
    return (root / "mlartifacts").as_uri()


@pytest.fixture(scope="module")
def original(tmp_path_factory: pytest.TempPathFactory, _mlflow_store: str) -> tuple[Path, str]:
    """A project with its own store: one run with a registered predictor (artifacts under its mlartifacts/).
    Built once, its store a copy of the session's (creating an MLflow store takes seconds); tests copy the
    project, and leave it as it is."""
    root = tmp_path_factory.mktemp("store_moved") / "original"
    (root / "predictor").mkdir(parents=True)
    (root / "predictor" / "predictor.json").write_text('{"where": "original"}')
    MlflowClient(_mlflow_store).search_experiments()  # the session's store exists, with MLflow's tables
    with sqlite3.connect(_mlflow_store.removeprefix("sqlite:///")) as src, sqlite3.connect(root / "mlflow.db") as dst:
        src.backup(dst)
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv(PARENT_ENV, raising=False)
        mp.setenv("MLFLOW_TRACKING_URI", _uri(root))  # the project's own store, as without the variable
        mp.chdir(root)
        with open_tracker("evaluate", experiment=EXPERIMENT, tracking_uri=_uri(root)) as tracker:
            assert register_predictor(tracker, MODEL, root / "predictor", {"tau": 0.5}) == 1
    return root, tracker.run_id  # type: ignore[attr-defined]


def _open(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Work in the project at `root` (its own store) as an asp command there does."""
    monkeypatch.delenv(PARENT_ENV, raising=False)
    monkeypatch.chdir(root)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", _uri(root))


def _check_points_into(root: Path, run_id: str) -> MlflowClient:
    client = mlflow_client(_uri(root))  # what every asp command opens the store with
    here = _artifacts(root)
    assert client.get_experiment_by_name(EXPERIMENT).artifact_location == here
    assert client.get_run(run_id).info.artifact_uri == f"{here}/{run_id}/artifacts"
    version = client.get_model_version(MODEL, "1")
    assert version.source.startswith(f"{here}/") and version.source.endswith("/predictor")
    assert [a.path for a in client.list_artifacts(run_id, "predictor")] == ["predictor/predictor.json"]
    return client


def test_a_copied_project_uses_its_own_artifacts(
    original: tuple[Path, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    root, run_id = original
    copy = tmp_path / "copy"
    shutil.copytree(root, copy)
    copied = copy / "mlartifacts" / run_id / "artifacts" / "predictor" / "predictor.json"
    copied.write_text('{"where": "copy"}')
    _open(copy, monkeypatch)
    with caplog.at_level(logging.WARNING, logger="asp.tracking"):
        client = _check_points_into(copy, run_id)
    assert f"(moved or copied) kept artifacts in {_artifacts(root)}: now in {_artifacts(copy)}" in caplog.text
    # the registry's model and a new run's artifacts are the copy's; the original store still points at its own
    got = download_artifacts(f"models:/{MODEL}/1", dst_path=str(tmp_path / "got"))
    assert (Path(got) / "predictor.json").read_text() == '{"where": "copy"}'
    with open_tracker("schedule", experiment=EXPERIMENT, tracking_uri=_uri(copy)) as tracker:
        tracker.log_dict({"k": 3}, "schedule.json")
    new_run = tracker.run_id  # type: ignore[attr-defined]
    assert (copy / "mlartifacts" / new_run / "artifacts" / "schedule.json").is_file()
    assert not (root / "mlartifacts" / new_run).exists()
    assert client.get_run(new_run).info.artifact_uri.startswith(_artifacts(copy))
    assert MlflowClient(_uri(root)).get_experiment_by_name(EXPERIMENT).artifact_location == _artifacts(root)


def test_a_moved_project_uses_its_artifacts_where_they_are_now(
    original: tuple[Path, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root, run_id = original
    first = tmp_path / "first"
    shutil.copytree(root, first)
    _open(first, monkeypatch)
    _check_points_into(first, run_id)  # a copy, relocated ...
    moved = tmp_path / "moved"
    monkeypatch.chdir(tmp_path)
    shutil.move(first, moved)
    _open(moved, monkeypatch)
    _check_points_into(moved, run_id)  # ... then moved: its old folder is gone
    assert relocate_artifacts(_uri(moved), moved) == {}  # once: nothing left to rewrite


def test_a_store_outside_the_project_is_left_alone(original: tuple[Path, str], tmp_path: Path) -> None:
    root, run_id = original
    elsewhere = tmp_path / "other-project"
    (elsewhere / "mlartifacts" / run_id).mkdir(parents=True)
    assert relocate_artifacts(_uri(root), elsewhere) == {}  # another project using this store: not its store
    assert MlflowClient(_uri(root)).get_experiment_by_name(EXPERIMENT).artifact_location == _artifacts(root)
