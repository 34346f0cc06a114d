"""Tracker: nested stage runs under a parent run, logged to a temporary SQLite store and read back; how a run
ends (FINISHED / FAILED / KILLED, a status set inside the block kept); owner tags and the sweep that marks runs
of dead processes KILLED without touching live, unknown or resumed ones; predictor versions in the Model Registry
(logged, registered with their tags, listed) and a run attached to without changing its status."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import uuid
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import psutil  # noqa: E402
import pytest  # noqa: E402
import typer  # noqa: E402
from mlflow import MlflowClient  # noqa: E402
from mlflow.artifacts import download_artifacts  # noqa: E402

from asp.env import Terminated  # noqa: E402
from asp.errors import UserError  # noqa: E402
from asp.tracking import (  # noqa: E402
    BOOKKEEPING_TAGS,
    HOST_TAG,
    PARENT_ENV,
    PID_TAG,
    START_TAG,
    NullTracker,
    Tracker,
    attach_run,
    end_run,
    flatten,
    log_text,
    nested_statuses,
    open_tracker,
    predictor_versions,
    register_predictor,
    start_run,
    status_of,
)


@pytest.fixture
def exp(_mlflow_store: str, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> str:
    """A new experiment's name in the session's SQLite store (`_mlflow_store`); no parent run in the environment."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", _mlflow_store)
    monkeypatch.delenv(PARENT_ENV, raising=False)
    return f"{request.node.name}-{uuid.uuid4().hex[:8]}"


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


def test_nested_runs_round_trip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exp: str, _mlflow_store: str) -> None:
    uri = _mlflow_store
    monkeypatch.chdir(tmp_path)  # artifacts go to ./mlartifacts of the working directory
    parent = start_run(uri, exp, "pipeline", tags={"asp.kind": "pipeline"})
    monkeypatch.setenv(PARENT_ENV, parent.run_id)
    with open_tracker("prepare", experiment=exp) as tracker:
        assert MlflowClient(uri).get_run(tracker.run_id).info.status == "RUNNING"
        _log_everything(tracker, tmp_path)
        child_id = tracker.run_id
    assert MlflowClient(uri).get_run(parent.run_id).info.status == "RUNNING"  # the child does not end its parent
    end_run(parent)

    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name(exp)
    child, parent_run = client.get_run(child_id), client.get_run(parent.run_id)
    assert child.info.experiment_id == parent_run.info.experiment_id == experiment.experiment_id
    assert experiment.artifact_location == (tmp_path / "mlartifacts").as_uri()
    assert child.info.run_name == "prepare · pipeline" and parent_run.info.run_name == "pipeline"  # told apart
    assert not set(BOOKKEEPING_TAGS) & set(child.data.tags)  # the owner's pid / host / start and key: gone once ended
    assert child.data.tags["mlflow.source.type"] == "LOCAL" and child.data.tags["mlflow.source.name"]
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
    assert {r.info.run_id for r in client.search_runs([experiment.experiment_id])} == {child_id, parent.run_id}


def test_failed_stage_marks_run_failed(exp: str, _mlflow_store: str) -> None:
    with pytest.raises(RuntimeError), open_tracker("boom", experiment=exp) as tracker:
        run_id = tracker.run_id
        raise RuntimeError("stage failed")
    assert MlflowClient(_mlflow_store).get_run(run_id).info.status == "FAILED"


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


def test_resumed_run_continues_and_keeps_changed_params_as_tags(exp: str, _mlflow_store: str) -> None:
    uri = _mlflow_store
    with pytest.raises(KeyboardInterrupt), open_tracker("launch", experiment=exp) as tracker:
        run_id = tracker.run_id
        tracker.log_params({"runtime": {"iterations": 4, "queue": {"q_max": 16}}})
        tracker.log_metrics({"train/reward_mean": 0.1}, step=1)
        raise KeyboardInterrupt
    client = MlflowClient(uri)
    assert client.get_run(run_id).info.status == "KILLED"
    with open_tracker("launch", experiment=exp, resume_run_id=run_id) as again:
        assert again.run_id == run_id
        again.log_params({"runtime": {"iterations": 6, "queue": {"q_max": 16}}, "extra": 1})  # iterations changed
        again.log_metrics({"train/reward_mean": 0.2}, step=2)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.tags["asp.resumed"] == "true"
    assert run.data.params["runtime.iterations"] == "4" and run.data.params["extra"] == "1"
    assert run.data.tags["asp.param_changed_on_resume.runtime.iterations"] == "6"
    assert [m.step for m in client.get_metric_history(run_id, "train/reward_mean")] == [1, 2]
    with open_tracker("launch", experiment=exp, resume_run_id="0" * 32) as fresh:  # unknown run: a new one
        assert fresh.run_id != run_id


def test_a_resumed_run_moves_under_the_parent_that_resumed_it(
    exp: str, _mlflow_store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A launch stopped under one pipeline run and resumed under the next: the continued stage run is the new
    parent's child (it stayed, FINISHED, under the KILLED parent, and the new parent had no child)."""
    client = MlflowClient(_mlflow_store)
    first, second = (start_run(_mlflow_store, exp, "pipeline").run_id for _ in range(2))
    monkeypatch.setenv(PARENT_ENV, first)
    with pytest.raises(KeyboardInterrupt), open_tracker("launch", experiment=exp) as tracker:
        run_id = tracker.run_id
        raise KeyboardInterrupt
    monkeypatch.setenv(PARENT_ENV, second)
    with open_tracker("launch", experiment=exp, resume_run_id=run_id) as again:
        assert again.run_id == run_id
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.tags["mlflow.parentRunId"] == second
    assert run.data.tags["asp.earlier_parent_runs"] == first
    children = client.search_runs([run.info.experiment_id], f"tags.mlflow.parentRunId = '{first}'")
    assert children == []


def test_status_set_inside_the_block_is_kept(exp: str, _mlflow_store: str) -> None:
    client = MlflowClient(_mlflow_store)
    with open_tracker("pipeline", experiment=exp) as tracker:  # what `asp repro` does when dvc fails
        end_run(tracker, "FAILED")
    assert client.get_run(tracker.run_id).info.status == "FAILED"


@pytest.mark.parametrize(
    ("exc", "status"),
    [
        (None, "FINISHED"),
        (RuntimeError("stage failed"), "FAILED"),
        (UserError("bad row"), "FAILED"),
        (SystemExit(0), "FINISHED"),
        (SystemExit(3), "FAILED"),
        (SystemExit(15), "KILLED"),  # Ray's SIGTERM handler in a driver process
        (SystemExit(143), "KILLED"),
        (typer.Exit(0), "FINISHED"),
        (typer.Exit(2), "FAILED"),
        (KeyboardInterrupt(), "KILLED"),  # Ctrl-C
        (Terminated(), "KILLED"),  # SIGTERM, as asp.env.sigterm_as_interrupt raises it
        (asyncio.CancelledError(), "KILLED"),  # like Prefect's TerminationSignal: a BaseException, no error
    ],
)
def test_status_of_how_the_block_ended(exc: BaseException | None, status: str) -> None:
    assert status_of(exc) == status


def test_interrupted_block_ends_killed_and_reraises(exp: str, _mlflow_store: str) -> None:
    client = MlflowClient(_mlflow_store)
    with pytest.raises(Terminated), open_tracker("stage", experiment=exp) as tracker:
        raise Terminated()
    assert client.get_run(tracker.run_id).info.status == "KILLED"


def test_nested_statuses(exp: str, _mlflow_store: str, monkeypatch: pytest.MonkeyPatch) -> None:
    client = MlflowClient(_mlflow_store)
    with open_tracker("pipeline", experiment=exp) as parent:
        monkeypatch.setenv(PARENT_ENV, parent.run_id)
        with open_tracker("a", experiment=exp):
            pass
        with pytest.raises(KeyboardInterrupt), open_tracker("b", experiment=exp):
            raise KeyboardInterrupt
        assert sorted(nested_statuses(parent)) == ["FINISHED", "KILLED"]
    assert client.get_run(parent.run_id).info.status == "FINISHED"


def _dead_pid() -> int:
    """The pid of a process that has exited and been reaped."""
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def _running(client: MlflowClient, exp: str, name: str, **owner: str) -> str:
    """A RUNNING run named `name` in `exp` whose owner tags are replaced by `owner` ('' deletes one)."""
    run_id = start_run(client.tracking_uri, exp, name).run_id
    for key, value in owner.items():
        tag = {"pid": PID_TAG, "host": HOST_TAG, "start": START_TAG}[key]
        client.set_tag(run_id, tag, value) if value else client.delete_tag(run_id, tag)
    return run_id


def test_runs_record_their_owner_process(exp: str, _mlflow_store: str) -> None:
    client = MlflowClient(_mlflow_store)
    with open_tracker("prepare", experiment=exp) as tracker:
        tags = client.get_run(tracker.run_id).data.tags
    assert (tags[PID_TAG], tags[HOST_TAG]) == (str(os.getpid()), socket.gethostname())
    assert abs(float(tags[START_TAG]) - psutil.Process().create_time()) < 1.0


def test_stale_runs_of_dead_owners_are_killed_when_the_name_opens_again(exp: str, _mlflow_store: str) -> None:
    client = MlflowClient(_mlflow_store)
    live = subprocess.Popen(["sleep", "60"])
    try:
        live_start = f"{psutil.Process(live.pid).create_time():.2f}"
        dead = _running(client, exp, "profile", pid=str(_dead_pid()))  # SIGKILLed earlier attempt
        reused = _running(client, exp, "profile", pid=str(live.pid), start="1.00")  # its pid now belongs to another
        alive = _running(client, exp, "profile", pid=str(live.pid), start=live_start)  # still running elsewhere
        elsewhere = _running(client, exp, "profile", pid=str(_dead_pid()), host="another-host")  # cannot tell
        untagged = _running(client, exp, "profile", pid="", host="", start="")  # from before owner tags: cannot tell
        other_stage = _running(client, exp, "predict", pid=str(_dead_pid()))  # swept when `predict` opens
        with open_tracker("profile", experiment=exp) as tracker:
            pass
    finally:
        live.kill()
        live.wait()
    status = {run_id: client.get_run(run_id).info.status for run_id in (dead, reused, alive, elsewhere, untagged)}
    assert status == {dead: "KILLED", reused: "KILLED", alive: "RUNNING", elsewhere: "RUNNING", untagged: "RUNNING"}
    assert client.get_run(other_stage).info.status == "RUNNING"
    reason = client.get_run(dead).data.tags["asp.killed_reason"]
    assert reason.endswith(f"died; found by run {tracker.run_id}") and socket.gethostname() in reason
    assert client.get_run(tracker.run_id).info.status == "FINISHED"


def test_resumed_run_left_running_by_a_dead_owner_is_continued_not_killed(exp: str, _mlflow_store: str) -> None:
    client = MlflowClient(_mlflow_store)
    interrupted = _running(client, exp, "launch", pid=str(_dead_pid()))  # launch SIGKILLed mid-run: resumed next
    older = _running(client, exp, "launch", pid=str(_dead_pid()))
    with open_tracker("launch", experiment=exp, resume_run_id=interrupted) as tracker:
        assert tracker.run_id == interrupted
        assert client.get_run(older).info.status == "KILLED"
        assert client.get_run(interrupted).data.tags[PID_TAG] == str(os.getpid())  # this process owns it now
    run = client.get_run(interrupted)
    assert run.info.status == "FINISHED" and run.data.tags["asp.resumed"] == "true"
    assert "asp.killed_reason" not in run.data.tags


def test_register_predictor_adds_versions_with_tags_and_attach_keeps_the_status(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exp: str, _mlflow_store: str
) -> None:
    monkeypatch.chdir(tmp_path)  # artifacts go to ./mlartifacts of the working directory
    pred = tmp_path / "predictor"
    (pred / "adapter").mkdir(parents=True)
    (pred / "predictor.json").write_text("{}")
    (pred / "adapter" / "adapter_config.json").write_text("{}")
    name = f"predictor-{exp}"
    assert register_predictor(NullTracker(), name, pred, {"kendall_tau": 0.5}) is None  # tracking off: nothing
    with open_tracker("evaluate", experiment=exp) as first:
        assert register_predictor(first, name, pred, {"kendall_tau": 0.5, "predictor_version": 1}) == 1
    with open_tracker("launch", experiment=exp) as second:
        tags = {"kendall_tau": 0.61, "policy_step": 40, "predictor_version": 2}
        assert register_predictor(second, name, pred, tags, artifact_path="predictors/v2/predictor") == 2

    v1, v2 = predictor_versions(name)
    assert (v1["version"], v2["version"]) == (1, 2) and (v1["run_id"], v2["run_id"]) == (first.run_id, second.run_id)
    assert v1["tags"] == {"kendall_tau": "0.5", "predictor_version": "1", "run_id": first.run_id}
    assert v2["tags"] == {
        "kendall_tau": "0.61",
        "policy_step": "40",
        "predictor_version": "2",
        "run_id": second.run_id,
    }
    assert v2["source"].endswith(f"{second.run_id}/artifacts/predictors/v2/predictor")
    client = MlflowClient(_mlflow_store)
    logged = {f.path for f in client.list_artifacts(second.run_id, "predictors/v2/predictor")}
    assert logged == {"predictors/v2/predictor/adapter", "predictors/v2/predictor/predictor.json"}
    assert predictor_versions(f"absent-{exp}") == []

    attached = attach_run(first.run_id)
    assert attached is not None and attached.run_id == first.run_id
    attached.log_metrics({"reprofile/accepted": 1.0}, step=3)
    run = client.get_run(first.run_id)
    assert run.info.status == "FINISHED" and run.data.metrics["reprofile/accepted"] == 1.0
    assert attach_run("0" * 32) is None


# ---- the store's health: a damaged or read-only SQLite file is refused before a stage computes anything -------------
def _copy_store(store_uri: str, folder: Path, damage_table: str | None = None) -> Path:
    """A copy of the session's real MLflow store in `folder`; with `damage_table`, that table's root page is
    overwritten with garbage (what a crash mid-write or a bad disk sector leaves: "database disk image is
    malformed")."""
    import shutil
    import sqlite3

    folder.mkdir(parents=True, exist_ok=True)
    copy = folder / "mlflow.db"
    shutil.copy(store_uri.removeprefix("sqlite:///"), copy)
    if damage_table:
        con = sqlite3.connect(copy)
        page = con.execute("PRAGMA page_size").fetchone()[0]
        root = con.execute("SELECT rootpage FROM sqlite_master WHERE name = ?", (damage_table,)).fetchone()[0]
        con.close()
        with copy.open("r+b") as f:
            f.seek((root - 1) * page)
            f.write(b"\xde\xad" * (page // 2))
    return copy


@pytest.fixture
def stage_project(tmp_path: Path, exp: str) -> Path:
    """A directory laid out like the repository (dvc.yaml, stages/, params.yaml; no outputs) whose prepare stage
    would build prompts; the session store holds a finished run, so its tables exist."""
    import shutil

    with open_tracker("store-check", experiment=exp):
        pass
    root = Path(__file__).resolve().parents[1]
    project = tmp_path / "project"
    shutil.copytree(root / "stages", project / "stages")
    for name in ("dvc.yaml", "params.yaml"):
        shutil.copy(root / name, project / name)
    return project


def _stage(project: Path, store: Path, *, unprivileged: bool = False) -> subprocess.CompletedProcess:
    import sys

    from tests.readonly import unprivileged as drop

    env = {k: v for k, v in os.environ.items() if k != PARENT_ENV}
    env.update(MLFLOW_TRACKING_URI=f"sqlite:///{store}", ASP_PROGRESS="0")
    cmd = [sys.executable, "-m", "asp", "stage", "prepare"]
    cmd = drop(cmd) if unprivileged else cmd
    return subprocess.run(cmd, cwd=project, env=env, capture_output=True, text=True, timeout=300)


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("damage", ["runs", "experiments", "garbage"])
def test_damaged_store_exits_2_naming_it_before_the_stage_computes(
    stage_project: Path, _mlflow_store: str, tmp_path: Path, damage: str
) -> None:
    if damage == "garbage":
        store = tmp_path / "stores" / "mlflow.db"
        store.parent.mkdir()
        store.write_bytes(os.urandom(8192))
    else:
        store = _copy_store(_mlflow_store, tmp_path / "stores", damage_table=damage)
    before, store_bytes = _files(stage_project), store.read_bytes()
    out = _stage(stage_project, store)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    first = out.stderr.splitlines()[0]
    why = "file is not a database" if damage == "garbage" else "database disk image is malformed"
    assert first.startswith(f"error: the MLflow store sqlite:///{store}: {store} is damaged ({why})"), first
    assert f"mv {store} {store}.damaged" in first and "MLFLOW_TRACKING_URI" in first
    assert _files(stage_project) == before and store.read_bytes() == store_bytes  # nothing written, store untouched


@pytest.mark.parametrize("what", ["file", "folder"])
def test_read_only_store_exits_2_naming_it(stage_project: Path, _mlflow_store: str, tmp_path: Path, what: str) -> None:
    store = _copy_store(_mlflow_store, tmp_path / "stores")
    target = store if what == "file" else store.parent
    mode = target.stat().st_mode
    target.chmod(0o444 if what == "file" else 0o555)
    try:
        before = _files(stage_project)
        out = _stage(stage_project, store, unprivileged=True)
    finally:
        target.chmod(mode)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    first = out.stderr.splitlines()[0]
    if what == "file":
        assert f"{store} is read-only for this user, so no run can be logged" in first and "chmod u+w" in first
    else:
        assert f"the folder {store.parent} is read-only for this user" in first, first
    assert _files(stage_project) == before


def test_store_check_cases(tmp_path: Path, _mlflow_store: str) -> None:
    from asp.tracking import check_store, sqlite_file, store_errors

    assert sqlite_file("sqlite:///mlflow.db") == Path("mlflow.db")
    assert sqlite_file("sqlite:////abs/m.db?mode=rw") == Path("/abs/m.db")
    assert sqlite_file("sqlite://") is None and sqlite_file("http://127.0.0.1:5000") is None
    check_store(f"sqlite:///{tmp_path / 'new' / 'deeper' / 'm.db'}")  # MLflow creates it and the folders
    check_store("http://127.0.0.1:5000")  # a server: not checked here
    (tmp_path / "afile").write_text("x")
    with pytest.raises(UserError, match=r"cannot be created: .*afile is a file, not a folder"):
        check_store(f"sqlite:///{tmp_path / 'afile' / 'm.db'}")
    damaged = _copy_store(_mlflow_store, tmp_path / "d", damage_table="runs")
    with pytest.raises(UserError, match=r"is damaged \(database disk image is malformed\)"):
        check_store(f"sqlite:///{damaged}", writable=False)  # `asp ui mlflow` checks this much
    full = r"store sqlite:///x failed \(database or disk is full\): the disk is full"
    with pytest.raises(UserError, match=full), store_errors("sqlite:///x"):
        raise RuntimeError("(sqlite3.OperationalError) database or disk is full [SQL: INSERT ...]")
    with pytest.raises(KeyError), store_errors("sqlite:///x"):  # anything else passes through
        raise KeyError("runs")
