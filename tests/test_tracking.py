"""Tracker: nested stage runs under a parent run, logged to a temporary SQLite store and read back."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
from mlflow import MlflowClient  # noqa: E402

from asp.tracking import PARENT_ENV, NullTracker, Tracker, end_run, flatten, open_tracker, start_run  # noqa: E402


def test_nested_runs_round_trip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    parent = start_run(uri, "exp-test", "pipeline")
    monkeypatch.setenv(PARENT_ENV, parent.run_id)
    with open_tracker("prepare", experiment="exp-test") as tracker:
        tracker.log_params({"prepare": {"b": 32, "name": "x"}})
        tracker.log_metrics({"prepare/prompts": 7})
        for step in range(3):
            tracker.log_metrics({"prepare/loss": 1.0 / (step + 1)}, step=step)
        fig, ax = plt.subplots()
        ax.plot([0, 1])
        tracker.log_figure(fig, "plots/line.png")
        tracker.log_dict({"a": 1}, "summary.json")
        (tmp_path / "f.txt").write_text("hello")
        tracker.log_artifact(tmp_path / "f.txt", "files")
        child_id = tracker.run_id
    end_run(parent)

    client = MlflowClient(uri)
    child = client.get_run(child_id)
    assert child.data.tags["mlflow.parentRunId"] == parent.run_id
    assert child.info.status == "FINISHED"
    assert child.data.params == {"prepare.b": "32", "prepare.name": "x"}
    assert child.data.metrics["prepare/prompts"] == 7
    history = client.get_metric_history(child_id, "prepare/loss")
    assert [m.step for m in history] == [0, 1, 2] and history[-1].value == pytest.approx(1 / 3)
    names = {a.path for a in client.list_artifacts(child_id)}
    assert {"plots", "summary.json", "files"} <= names
    assert client.get_run(parent.run_id).info.status == "FINISHED"


def test_failed_stage_marks_run_failed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.delenv(PARENT_ENV, raising=False)
    with pytest.raises(RuntimeError), open_tracker("boom", experiment="e") as tracker:
        run_id = tracker.run_id
        raise RuntimeError("stage failed")
    assert MlflowClient(uri).get_run(run_id).info.status == "FAILED"


def test_null_tracker_has_the_protocol() -> None:
    tracker = NullTracker()
    assert isinstance(tracker, Tracker)
    tracker.log_metrics({"a": 1.0}, step=1)
    tracker.log_params({"a": {"b": 1}})


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
