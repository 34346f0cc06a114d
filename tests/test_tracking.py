"""Tracker: nested stage runs under a parent run, logged to a temporary SQLite store and read back."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
from mlflow import MlflowClient  # noqa: E402
from mlflow.artifacts import download_artifacts  # noqa: E402

from asp.tracking import PARENT_ENV, Tracker, end_run, flatten, log_text, open_tracker, start_run  # noqa: E402


def _log_everything(tracker: Tracker, tmp_path: Path) -> None:
    """Every `Tracker` method once, with the values `test_nested_runs_round_trip` reads back."""
    tracker.log_params({"prepare": {"b": 32, "name": "x"}})
    tracker.log_metrics({"prepare/prompts": 7})
    for step in range(3):
        tracker.log_metrics({"prepare/loss": 1.0 / (step + 1)}, step=step)
    fig, ax = plt.subplots()
    ax.plot([0, 1])
    tracker.log_figure(fig, "plots/line.png")
    plt.close(fig)
    tracker.log_dict({"a": 1}, "summary.json")
    (tmp_path / "f.txt").write_text("hello")
    tracker.log_artifact(tmp_path / "f.txt", "files")
    tracker.set_tags({"asp.kind": "stage", "asp.git_dirty": False})
    log_text(tracker, "note", "notes/readme.txt")


def _artifact_text(uri: str, run_id: str, path: str) -> str:
    return Path(download_artifacts(run_id=run_id, artifact_path=path, tracking_uri=uri)).read_text()


def test_nested_runs_round_trip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.chdir(tmp_path)  # artifacts go to ./mlartifacts of the working directory
    parent = start_run(uri, "exp-test", "pipeline", tags={"asp.kind": "pipeline"})
    monkeypatch.setenv(PARENT_ENV, parent.run_id)
    with open_tracker("prepare", experiment="exp-test") as tracker:
        assert MlflowClient(uri).get_run(tracker.run_id).info.status == "RUNNING"
        _log_everything(tracker, tmp_path)
        child_id = tracker.run_id
    assert MlflowClient(uri).get_run(parent.run_id).info.status == "RUNNING"  # the child does not end its parent
    end_run(parent)

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("exp-test")
    child, parent_run = client.get_run(child_id), client.get_run(parent.run_id)
    assert child.info.experiment_id == parent_run.info.experiment_id == exp.experiment_id
    assert exp.artifact_location == (tmp_path / "mlartifacts").as_uri()
    assert child.info.run_name == "prepare" and parent_run.info.run_name == "pipeline"
    assert child.data.tags["mlflow.parentRunId"] == parent.run_id
    assert "mlflow.parentRunId" not in parent_run.data.tags and parent_run.data.tags["asp.kind"] == "pipeline"
    assert child.data.tags["asp.kind"] == "stage" and child.data.tags["asp.git_dirty"] == "False"
    assert child.info.status == "FINISHED" and parent_run.info.status == "FINISHED"
    assert child.data.params == {"prepare.b": "32", "prepare.name": "x"}
    assert child.data.metrics == {"prepare/prompts": 7.0, "prepare/loss": pytest.approx(1 / 3)}  # latest values
    history = client.get_metric_history(child_id, "prepare/loss")
    assert [(m.step, m.value) for m in history] == [(0, 1.0), (1, 0.5), (2, pytest.approx(1 / 3))]
    assert json.loads(_artifact_text(uri, child_id, "summary.json")) == {"a": 1}
    assert _artifact_text(uri, child_id, "files/f.txt") == "hello"
    assert _artifact_text(uri, child_id, "notes/readme.txt") == "note"
    png = Path(download_artifacts(run_id=child_id, artifact_path="plots/line.png", tracking_uri=uri))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert client.list_artifacts(parent.run_id) == []  # nothing leaked into the parent
    assert {r.info.run_id for r in client.search_runs([exp.experiment_id])} == {child_id, parent.run_id}


def test_failed_stage_marks_run_failed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.delenv(PARENT_ENV, raising=False)
    with pytest.raises(RuntimeError), open_tracker("boom", experiment="e") as tracker:
        run_id = tracker.run_id
        raise RuntimeError("stage failed")
    assert MlflowClient(uri).get_run(run_id).info.status == "FAILED"


@pytest.mark.parametrize("off", ["enabled=False", "ASP_TRACKING=0"])
def test_disabled_tracking_takes_every_call_and_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, off: str
) -> None:
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ASP_TRACKING", "0" if off == "ASP_TRACKING=0" else "1")
    enabled = off != "enabled=False"
    with pytest.raises(RuntimeError, match="stage failed"), open_tracker("p", experiment="off", enabled=enabled) as t:
        assert t.run_id is None
        _log_everything(t, tmp_path)  # the same calls the MLflow tracker takes
        end_run(t, "FAILED")  # a no-op for it
        raise RuntimeError("stage failed")  # errors pass through untouched
    assert not (tmp_path / "m.db").exists() and not (tmp_path / "mlartifacts").exists()  # no store was even opened


def test_flatten() -> None:
    assert flatten({"a": {"b": {"c": 1}}, "d": 2}) == {"a.b.c": 1, "d": 2}


def test_resumed_run_continues_and_keeps_changed_params_as_tags(tmp_path: Path, monkeypatch) -> None:
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.delenv(PARENT_ENV, raising=False)
    with pytest.raises(KeyboardInterrupt), open_tracker("launch", experiment="e") as tracker:
        run_id = tracker.run_id
        tracker.log_params({"runtime": {"iterations": 4, "q_max": 16}})
        tracker.log_metrics({"train/reward_mean": 0.1}, step=1)
        raise KeyboardInterrupt
    client = MlflowClient(uri)
    assert client.get_run(run_id).info.status == "KILLED"
    with open_tracker("launch", experiment="e", resume_run_id=run_id) as again:
        assert again.run_id == run_id
        again.log_params({"runtime": {"iterations": 6, "q_max": 16}, "extra": 1})  # iterations changed
        again.log_metrics({"train/reward_mean": 0.2}, step=2)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.tags["asp.resumed"] == "true"
    assert run.data.params["runtime.iterations"] == "4" and run.data.params["extra"] == "1"
    assert run.data.tags["asp.param_changed_on_resume.runtime.iterations"] == "6"
    assert [m.step for m in client.get_metric_history(run_id, "train/reward_mean")] == [1, 2]
    with open_tracker("launch", experiment="e", resume_run_id="0" * 32) as fresh:  # unknown run: a new one
        assert fresh.run_id != run_id
