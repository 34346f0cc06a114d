"""Experiment tracking: a `Tracker` protocol, an MLflow implementation and a no-op one.

This is the only module that imports mlflow. Conventions (see shared/DESIGN.md):

* store: `MLFLOW_TRACKING_URI`, else `common.tracking_uri`, else `sqlite:///mlflow.db` in the repo root,
  with artifacts under `mlartifacts/`;
* one parent run per pipeline execution (`asp repro` creates it and hands its id to the stage processes
  through the `ASP_PARENT_RUN_ID` environment variable) and one nested run per stage;
* metric names are namespaced: `prepare/prompts`, `schedule/group_load_cv`, `runtime/queue_depth`, ...
* length predictors are registered in the MLflow Model Registry (`register_predictor`): the evaluate stage's is
  version 1 of `drift.registry_model`, every accepted re-profile (`asp.pipeline.reprofile`) adds one;
* a run ends FINISHED, FAILED (an exception) or KILLED (Ctrl-C, SIGTERM, a Prefect cancellation); a status set
  with `end_run` inside the `open_tracker` block stays. Every run records its owner process (`asp.pid`,
  `asp.host`, `asp.pid_start`); when a run opens, earlier RUNNING runs of the same name whose owner process on
  this host is gone (killed with SIGKILL, out of memory) are marked KILLED.

Usage::

    with open_tracker("prepare", experiment="asp") as tracker:
        tracker.log_params({"prepare.b": 32})
        tracker.log_metrics({"prepare/prompts": 2000})
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from asp.errors import UserError

PARENT_ENV = "ASP_PARENT_RUN_ID"
PREFECT_RUN_ENV, PREFECT_URL_ENV = "ASP_PREFECT_FLOW_RUN_ID", "ASP_PREFECT_FLOW_RUN_URL"
PID_TAG, HOST_TAG, START_TAG = "asp.pid", "asp.host", "asp.pid_start"
DEFAULT_URI = "sqlite:///mlflow.db"
ARTIFACT_DIR = "mlartifacts"
log = logging.getLogger(__name__)


@runtime_checkable
class Tracker(Protocol):
    """What stages and the runtime may log. Implementations never raise on a closed store."""

    run_id: str | None

    def log_params(self, params: Mapping[str, Any]) -> None: ...

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None: ...

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None: ...

    def log_figure(self, figure: Any, name: str) -> None: ...

    def log_dict(self, data: Mapping[str, Any], name: str) -> None: ...

    def set_tags(self, tags: Mapping[str, str]) -> None: ...


class NullTracker:
    """A tracker that records nothing, with the same signatures (code never branches on tracking)."""

    run_id: str | None = None

    def log_params(self, params: Mapping[str, Any]) -> None:
        return None

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        return None

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        return None

    def log_figure(self, figure: Any, name: str) -> None:
        return None

    def log_dict(self, data: Mapping[str, Any], name: str) -> None:
        return None

    def set_tags(self, tags: Mapping[str, str]) -> None:
        return None


def resolve_tracking_uri(configured: str | None = None, root: str | Path = ".") -> str:
    """The store to use: env var, then params, then the repo's SQLite file."""
    uri = os.environ.get("MLFLOW_TRACKING_URI") or configured
    if uri:
        return uri
    return f"sqlite:///{(Path(root).resolve() / 'mlflow.db').as_posix()}"


def flatten(params: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Flatten nested dicts to dotted keys: {'a': {'b': 1}} -> {'a.b': 1}."""
    out: dict[str, Any] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, f"{name}."))
        else:
            out[name] = value
    return out


class MlflowTracker:
    """Logs to one MLflow run through an explicit `MlflowClient` (no global active-run state)."""

    def __init__(self, client: Any, run_id: str, resumed: bool = False) -> None:
        self.client = client
        self.run_id = run_id
        self.resumed = resumed
        self.status: str | None = None  # set once the run is ended (`end_run`)

    def log_params(self, params: Mapping[str, Any]) -> None:
        """Log params (nested dicts flattened). On a resumed run, params already logged with the same value
        are skipped and a changed value (MLflow params are immutable) is recorded as a
        ``asp.param_changed_on_resume.<key>`` tag with a warning instead."""
        from mlflow.entities import Param

        flat = {k: str(v)[:6000] for k, v in flatten(params).items()}
        if self.resumed:
            old = self.client.get_run(self.run_id).data.params
            changed = {k: v for k, v in flat.items() if k in old and old[k] != v}
            for k, v in changed.items():
                log.warning(
                    "resumed run %s: param %s changed from %r to %r (kept as a tag)", self.run_id, k, old[k], v
                )
            self.set_tags({f"asp.param_changed_on_resume.{k}": v for k, v in changed.items()})
            flat = {k: v for k, v in flat.items() if k not in old}
        items = [Param(k, v) for k, v in flat.items()]
        for i in range(0, len(items), 100):
            self.client.log_batch(self.run_id, params=items[i : i + 100])

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        items = [Metric(k, float(v), now, step or 0) for k, v in metrics.items() if v is not None]
        for i in range(0, len(items), 500):
            self.client.log_batch(self.run_id, metrics=items[i : i + 500])

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        path = Path(path)
        if path.is_dir():
            self.client.log_artifacts(self.run_id, str(path), artifact_path)
        else:
            self.client.log_artifact(self.run_id, str(path), artifact_path)

    def log_figure(self, figure: Any, name: str) -> None:
        self.client.log_figure(self.run_id, figure, name)

    def log_dict(self, data: Mapping[str, Any], name: str) -> None:
        self.client.log_dict(self.run_id, dict(data), name)

    def set_tags(self, tags: Mapping[str, str]) -> None:
        for k, v in tags.items():
            self.client.set_tag(self.run_id, k, str(v))


def _client(uri: str) -> Any:
    check_store(uri)
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=uri)


# ---- the store's health: checked once per process before the first run opens ---------------------------------------
FULL_CHECK_BYTES = 64 * 2**20  # larger stores skip the metric history in the integrity check (about 2 ms per MB)
_CHECKED: set[tuple[str, bool]] = set()
_OTHER_STORE = "or set MLFLOW_TRACKING_URI to another store (ASP_TRACKING=0 runs without tracking)"


def sqlite_file(uri: str) -> Path | None:
    """The database file of a ``sqlite:///PATH`` tracking URI (PATH relative to the working directory, or absolute
    with a fourth slash); None for other stores and in-memory databases."""
    if not uri.startswith("sqlite:///"):
        return None
    path = uri.removeprefix("sqlite:///").split("?", 1)[0]
    return None if path in ("", ":memory:") else Path(path)


def check_store(uri: str, writable: bool = True) -> None:
    """Refuse a local SQLite store that MLflow could not use, before anything is computed or logged.

    Checks that the file (when it exists) is readable, passes SQLite's ``PRAGMA quick_check`` (the whole file up to
    `FULL_CHECK_BYTES`, beyond that every table but the metric history ``metrics``), and with `writable` that the file
    and its folder (SQLite writes a journal beside it) are writable, or, for a new store, the nearest existing folder
    above it (MLflow creates the file and missing folders). Once per process and store; other stores (a server, a
    database service) are not checked here.

    Raises:
        UserError: naming the store and what to do (move a damaged file aside, fix permissions, another store).
    """
    path = sqlite_file(uri)
    if path is None or (uri, writable) in _CHECKED:
        return
    where = f"the MLflow store {uri}"
    folder = path.parent
    if not path.exists():  # MLflow creates it, and missing folders above it
        ancestor = folder
        while not ancestor.exists() and ancestor != ancestor.parent:
            ancestor = ancestor.parent
        if writable and not (ancestor.is_dir() and os.access(ancestor, os.W_OK | os.X_OK)):
            why = "is read-only for this user" if ancestor.is_dir() else "is a file, not a folder"
            raise UserError(f"{where} cannot be created: {ancestor} {why}. Fix that, {_OTHER_STORE}.")
    elif not path.is_file() or not os.access(path, os.R_OK):
        what = "is not a file" if not path.is_file() else "cannot be read by this user"
        raise UserError(f"{where}: {path} {what}. Fix it (permissions: chmod u+rw {path}), {_OTHER_STORE}.")
    else:
        damage = sqlite_damage(path)
        if damage is not None:
            raise UserError(
                f"{where}: {path} is damaged ({damage}); MLflow cannot use it. Move it aside to start a new store "
                f"(mv {path} {path}.damaged; runs logged there are no longer listed), restore it from a backup, "
                f"{_OTHER_STORE}."
            )
        if writable and not os.access(path, os.W_OK):
            raise UserError(
                f"{where}: {path} is read-only for this user, so no run can be logged. Fix its permissions "
                f"(chmod u+w {path}), {_OTHER_STORE}."
            )
        if writable and not os.access(folder, os.W_OK | os.X_OK):
            raise UserError(
                f"{where}: the folder {folder} is read-only for this user, and SQLite writes its journal next to "
                f"{path.name} there, so no run can be logged. Fix the folder's permissions, {_OTHER_STORE}."
            )
    _CHECKED.add((uri, writable))


def sqlite_damage(path: Path) -> str | None:
    """What SQLite's quick check finds wrong with the database at `path` (opened read-only), or None when it is
    intact or busy (a writer holds it longer than the 10 s timeout: not damage)."""
    import sqlite3

    try:
        con = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=10)
    except sqlite3.Error as exc:
        return str(exc)
    try:
        pragmas = ["PRAGMA quick_check"]
        if path.stat().st_size > FULL_CHECK_BYTES:
            tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
            names = [t for t in tables if t != "metrics" and t.isidentifier()]  # MLflow's tables: plain names
            pragmas = [f"PRAGMA quick_check({t})" for t in names]
        for pragma in pragmas:
            row = con.execute(pragma).fetchone()
            if row is None or row[0] != "ok":
                return str(row[0]) if row else "the integrity check returned nothing"
    except sqlite3.Error as exc:
        if getattr(exc, "sqlite_errorname", "") in ("SQLITE_BUSY", "SQLITE_LOCKED"):
            return None
        return str(exc)
    finally:
        con.close()
    return None


STORE_FAILURES = {  # SQLite's words (inside MLflow's and SQLAlchemy's exceptions) -> what to do
    "database disk image is malformed": "the file is damaged: move it aside to start a new store or restore a backup",
    "file is not a database": "the file is not an SQLite database: move it aside to start a new store",
    "attempt to write a readonly database": "the file or its folder is read-only for this user: fix the permissions",
    "unable to open database file": "the file or its folder cannot be opened: check that it exists and is writable",
    "database or disk is full": "the disk is full: free space",
}


@contextlib.contextmanager
def store_errors(uri: str) -> Iterator[None]:
    """Turn an MLflow / SQLAlchemy error that SQLite's words above explain into a `UserError` naming the store
    (what `check_store` cannot see up front: damage in the metric history of a large store, a disk filling)."""
    try:
        yield
    except Exception as exc:
        text = str(exc)
        found = next((words for words in STORE_FAILURES if words in text), None)
        if found is None or isinstance(exc, UserError):
            raise
        raise UserError(f"the MLflow store {uri} failed ({found}): {STORE_FAILURES[found]}, {_OTHER_STORE}.") from None


def ensure_experiment(client: Any, name: str, root: str | Path = ".") -> str:
    """Get or create the experiment; artifacts go to `<root>/mlartifacts/` for local SQLite stores."""
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    location = None
    if client.tracking_uri.startswith("sqlite:"):
        location = (Path(root).resolve() / ARTIFACT_DIR).as_uri()
    try:
        return client.create_experiment(name, artifact_location=location)
    except Exception:  # another process (a parallel stage) created it meanwhile
        exp = client.get_experiment_by_name(name)
        if exp is None:
            raise
        return exp.experiment_id


def start_run(
    uri: str, experiment: str, run_name: str, parent_run_id: str | None = None, tags: Mapping[str, str] | None = None
) -> MlflowTracker:
    """Create a run (nested under `parent_run_id` when given) and return a tracker bound to it."""
    client = _client(uri)
    exp_id = ensure_experiment(client, experiment)
    all_tags = {"mlflow.runName": run_name, **context_tags(), **(tags or {}), **owner_tags()}
    if parent_run_id:
        all_tags["mlflow.parentRunId"] = parent_run_id
    run = client.create_run(exp_id, run_name=run_name, tags=all_tags)
    return MlflowTracker(client, run.info.run_id)


def reopen_run(uri: str, run_id: str) -> MlflowTracker | None:
    """A tracker bound to an existing run, marked RUNNING again (to continue it); None if the store lacks it."""
    client = _client(uri)
    try:
        client.get_run(run_id)
    except Exception as exc:  # MlflowException: not in this store (another tracking URI, deleted database)
        log.warning("MLflow run %s cannot be continued (%s); starting a new run", run_id, exc)
        return None
    client.update_run(run_id, status="RUNNING")
    tracker = MlflowTracker(client, run_id, resumed=True)
    tracker.set_tags({"asp.resumed": "true", **owner_tags()})  # this process owns it now
    return tracker


def end_run(tracker: Tracker, status: str = "FINISHED") -> None:
    """Mark an MLflow run finished (or FAILED / KILLED); no-op for the null tracker. Inside `open_tracker`, the
    status set here is the one the run keeps."""
    if isinstance(tracker, MlflowTracker):
        tracker.client.set_terminated(tracker.run_id, status=status)
        tracker.status = status


def status_of(exc: BaseException | None) -> str:
    """The status of a run whose block ended with `exc`: FINISHED (none, or an exit with code 0), FAILED (an
    error, or an exit with another code) or KILLED (Ctrl-C, SIGTERM, a Prefect cancellation: the other
    `BaseException`s, and exits with a signal's code)."""
    if exc is None:
        return "FINISHED"
    if isinstance(exc, SystemExit):  # Ray's SIGTERM handler exits with 15; shells report signal N as 128 + N
        killed = exc.code == signal.SIGTERM or (isinstance(exc.code, int) and exc.code > 128)
        return "FINISHED" if exc.code in (0, None) else "KILLED" if killed else "FAILED"
    if isinstance(exc, Exception):
        return "FINISHED" if getattr(exc, "exit_code", None) == 0 else "FAILED"  # typer.Exit(0) is no failure
    return "KILLED"


def nested_statuses(tracker: Tracker) -> list[str]:
    """The statuses of the runs nested under `tracker`'s run (the stage runs of a pipeline); [] without MLflow."""
    if not isinstance(tracker, MlflowTracker):
        return []
    exp_id = tracker.client.get_run(tracker.run_id).info.experiment_id
    runs = tracker.client.search_runs([exp_id], f"tags.mlflow.parentRunId = '{tracker.run_id}'")
    return [run.info.status for run in runs]


def context_tags(cwd: str | Path = ".") -> dict[str, str]:
    """Where a run comes from: the git commit (`mlflow.source.git.commit`) and whether tracked files were
    changed (`asp.git_dirty`), the DVC experiment (`asp.dvc_exp`, set by `dvc exp run` in DVC_EXP_NAME) and the
    Prefect flow run that started it (`asp.prefect_flow_run_id` / `_url`, set by the orchestrator)."""
    from asp import vcs

    tags: dict[str, str] = {}
    sha = vcs.commit(cwd)
    if sha:
        tags["mlflow.source.git.commit"] = sha
        tags["asp.git_dirty"] = str(vcs.dirty(cwd)).lower()
    for env, tag in (
        ("DVC_EXP_NAME", "asp.dvc_exp"),
        (PREFECT_RUN_ENV, "asp.prefect_flow_run_id"),
        (PREFECT_URL_ENV, "asp.prefect_flow_run_url"),
    ):
        if os.environ.get(env):
            tags[tag] = os.environ[env]
    return tags


def run_url(ui: str, tracker_or_ids: Tracker | tuple[str, str]) -> str | None:
    """The MLflow UI address of a run (classic runs view), from a tracker or (experiment id, run id)."""
    if isinstance(tracker_or_ids, tuple):
        exp_id, run_id = tracker_or_ids
    elif isinstance(tracker_or_ids, MlflowTracker):
        run_id = tracker_or_ids.run_id
        exp_id = tracker_or_ids.client.get_run(run_id).info.experiment_id
    else:
        return None
    return f"{ui.rstrip('/')}/#/experiments/{exp_id}/runs/{run_id}?workflowType=machine_learning"


def find_stage_run(
    experiment: str,
    stage: str,
    *,
    parent_run_id: str | None = None,
    tracking_uri: str | None = None,
    workspace_only: bool = False,
) -> dict[str, Any] | None:
    """The newest run of `stage`: under `parent_run_id` when given, else the newest FINISHED one (with
    `workspace_only`, one not made inside a DVC experiment). Returns its ids, status and metrics, for links and
    summaries; None when there is none or MLflow is off."""
    if os.environ.get("ASP_TRACKING", "1") == "0":
        return None
    client = _client(resolve_tracking_uri(tracking_uri))
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        return None
    query = f"tags.`asp.stage` = '{stage}'"
    if parent_run_id:
        query += f" and tags.mlflow.parentRunId = '{parent_run_id}'"
    else:
        query += " and attributes.status = 'FINISHED'"
    runs = client.search_runs([exp.experiment_id], query, max_results=50, order_by=["attributes.start_time DESC"])
    if workspace_only and not parent_run_id:
        runs = [r for r in runs if "asp.dvc_exp" not in r.data.tags]
    if not runs:
        return None
    run = runs[0]
    return {
        "experiment_id": exp.experiment_id,
        "run_id": run.info.run_id,
        "status": run.info.status,
        "metrics": dict(run.data.metrics),
    }


def owner_tags() -> dict[str, str]:
    """Tags naming this process (pid, host, start time), so a later run can tell a dead owner from a live one."""
    return {PID_TAG: str(os.getpid()), HOST_TAG: socket.gethostname(), START_TAG: _process_start(os.getpid()) or ""}


def _process_start(pid: int) -> str | None:
    """When process `pid` started (seconds since the epoch, as text); None if no such live process."""
    import psutil  # a dependency of dvc

    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
        return f"{proc.create_time():.2f}"
    except psutil.NoSuchProcess:
        return None
    except psutil.Error:  # access denied: it exists
        return "?"


def owner_alive(tags: Mapping[str, str]) -> bool:
    """Whether the process a run's tags name may still be running. Unknown (another host, no owner tags) counts
    as alive: only a run whose owner is provably gone is ever marked KILLED."""
    if tags.get(HOST_TAG) != socket.gethostname() or not tags.get(PID_TAG, "").isdigit():
        return True
    started = _process_start(int(tags[PID_TAG]))
    if started is None:
        return False
    try:
        return abs(float(started) - float(tags.get(START_TAG, ""))) < 1.0  # else: the pid was reused
    except ValueError:  # start time unknown: the pid alone says alive
        return True


def sweep_stale_runs(tracker: Tracker, run_name: str) -> list[str]:
    """Mark KILLED the RUNNING runs named `run_name` (in `tracker`'s experiment, other than its own run) whose
    owner process died without ending them (SIGKILL, out of memory, power loss on this host). Returns their ids."""
    if not isinstance(tracker, MlflowTracker):
        return []
    client = tracker.client
    exp_id = client.get_run(tracker.run_id).info.experiment_id
    query = f"attributes.status = 'RUNNING' and attributes.run_name = '{run_name}'"
    stale = [
        run
        for run in client.search_runs([exp_id], query, max_results=1000)
        if run.info.run_id != tracker.run_id and not owner_alive(run.data.tags)
    ]
    for run in stale:
        tags = run.data.tags
        why = f"owner process {tags[PID_TAG]} on {tags[HOST_TAG]} died; found by run {tracker.run_id}"
        client.set_tag(run.info.run_id, "asp.killed_reason", why)
        client.set_terminated(run.info.run_id, status="KILLED")
        log.warning("MLflow run %s (%s) was left RUNNING: %s; marked KILLED", run.info.run_id, run_name, why)
    return [run.info.run_id for run in stale]


@contextlib.contextmanager
def open_tracker(
    run_name: str,
    *,
    experiment: str = "asp",
    tracking_uri: str | None = None,
    enabled: bool = True,
    tags: Mapping[str, str] | None = None,
    resume_run_id: str | None = None,
) -> Iterator[Tracker]:
    """Open a stage run nested under `$ASP_PARENT_RUN_ID` when set; it ends FAILED if the block raises an error,
    KILLED if it is interrupted (see `status_of`), with the status given to `end_run` inside the block if any,
    else FINISHED. Earlier runs of the same name left RUNNING by a dead process are marked KILLED first.

    With `resume_run_id` (a run that was interrupted, e.g. a resumed `launch`), that run is continued
    instead: same run id, metrics logged at later steps extend its curves."""
    if not enabled or os.environ.get("ASP_TRACKING", "1") == "0":
        yield NullTracker()
        return
    uri = resolve_tracking_uri(tracking_uri)
    with store_errors(uri):
        tracker = reopen_run(uri, resume_run_id) if resume_run_id else None
        if tracker is None:
            tracker = start_run(uri, experiment, run_name, os.environ.get(PARENT_ENV), tags)
    try:
        sweep_stale_runs(tracker, run_name)
    except Exception as exc:  # never fail a stage over another run's bookkeeping
        log.warning("could not check for stale MLflow runs of %s: %s", run_name, exc)
    try:
        yield tracker
    except BaseException as exc:
        end_run(tracker, status_of(exc))
        raise
    if tracker.status is None:
        end_run(tracker)


def log_text(tracker: Tracker, text: str, name: str) -> None:
    """Log a small text file as an artifact (via a temporary file)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / Path(name).name
        path.write_text(text)
        parent = str(Path(name).parent)
        tracker.log_artifact(path, None if parent == "." else parent)


def dvc_group(max_depth: int = 8) -> tuple[str, str] | None:
    """The DVC command that started this stage process, as (group key, parent run name): `dvc exp run NAME`
    (DVC_EXP_NAME) or the nearest ancestor `dvc repro` process (pid and start time). None when no DVC
    command is above this process (a stage run by hand)."""
    import time

    import psutil  # a dependency of dvc

    from asp import vcs

    exp = os.environ.get("DVC_EXP_NAME")
    if exp:
        return f"dvc-exp:{exp}", f"dvc exp run {exp}"
    try:
        proc = psutil.Process().parent()
        for _ in range(max_depth):
            if proc is None:
                return None
            cmd = [Path(a).name for a in proc.cmdline()]
            if "repro" in cmd and ("dvc" in cmd or any(a.startswith("dvc") for a in cmd[:3])):
                started = proc.create_time()
                key = f"dvc:{socket.gethostname()}:{proc.pid}:{started:.2f}"
                when = time.strftime("%Y-%m-%d %H:%M", time.localtime(started))
                return key, f"dvc repro {vcs.commit_label() or 'nogit'} {when}"
            proc = proc.parent()
    except psutil.Error:
        return None
    return None


@contextlib.contextmanager
def dvc_parent(experiment: str, tracking_uri: str | None = None) -> Iterator[Tracker | None]:
    """For a stage that plain `dvc repro` / `dvc exp run` started (no orchestrator parent in
    `$ASP_PARENT_RUN_ID`): the pipeline parent run of that DVC command, created by its first stage and reopened
    by the later ones, so their runs nest under one parent. The parent's status follows the stages: RUNNING
    while one runs, then FINISHED, or FAILED / KILLED with the stage. Yields None (and does nothing) when an
    orchestrator already made the parent, MLflow is off, or no DVC command started this process."""
    group = None
    if not os.environ.get(PARENT_ENV) and os.environ.get("ASP_TRACKING", "1") != "0":
        group = dvc_group()
    if group is None:
        yield None
        return
    key, name = group
    uri = resolve_tracking_uri(tracking_uri)
    with store_errors(uri):
        client = _client(uri)
        exp_id = ensure_experiment(client, experiment)
        found = client.search_runs([exp_id], f"tags.`asp.group` = '{key}'", max_results=1)
        if found:
            parent = reopen_run(client.tracking_uri, found[0].info.run_id)
        else:
            tags = {"asp.kind": "pipeline", "asp.runner": "dvc", "asp.group": key}
            parent = start_run(client.tracking_uri, experiment, name, tags=tags)
    assert parent is not None
    os.environ[PARENT_ENV] = parent.run_id
    try:
        yield parent
    except BaseException as exc:
        end_run(parent, status_of(exc))
        raise
    else:
        end_run(parent)
    finally:
        os.environ.pop(PARENT_ENV, None)


def record_in_parent(parent: Tracker, params: Any, params_path: str | Path, metrics: Mapping[str, Any]) -> None:
    """Log into a pipeline parent run what every door records there: the params file (artifact, once), the
    resolved params (flattened; keys already logged are kept) and a stage's numeric metrics."""
    if not isinstance(parent, MlflowTracker):
        return
    logged = parent.client.get_run(parent.run_id).data.params
    if not logged:
        parent.log_artifact(params_path)
        parent.log_params(params.model_dump(mode="json"))
    parent.log_metrics(
        {k: float(v) for k, v in metrics.items() if isinstance(v, int | float) and not isinstance(v, bool)}
    )


def attach_run(run_id: str, tracking_uri: str | None = None) -> MlflowTracker | None:
    """A tracker bound to an existing run, leaving its status as it is (e.g. `asp reprofile --run-id` logging into
    the launch's run); None when the store has no such run or tracking is off (`ASP_TRACKING=0`)."""
    if os.environ.get("ASP_TRACKING", "1") == "0":
        return None
    client = _client(resolve_tracking_uri(tracking_uri))
    try:
        client.get_run(run_id)
    except Exception as exc:  # MlflowException: not in this store
        log.warning("MLflow run %s not found (%s)", run_id, exc)
        return None
    return MlflowTracker(client, run_id, resumed=True)


def register_predictor(
    tracker: Tracker,
    name: str,
    directory: str | Path,
    tags: Mapping[str, Any],
    *,
    artifact_path: str = "predictor",
) -> int | None:
    """Log a saved length predictor (`directory`: adapter, head, tokenizer, predictor.json) as artifacts of
    `tracker`'s run under `artifact_path` and register them as a new version of the registered model `name`
    (created when absent), with `tags` (values as text) and the run id as tag ``run_id``.

    Returns:
        The new registry version number; None with the no-op tracker, or when the store refused (a warning says
        why: registry bookkeeping never fails the caller).
    """
    if not isinstance(tracker, MlflowTracker):
        return None
    client = tracker.client
    try:
        tracker.log_artifact(directory, artifact_path)
        source = f"{client.get_run(tracker.run_id).info.artifact_uri.rstrip('/')}/{artifact_path}"
        _ensure_registered_model(client, name)
        all_tags = {**{k: str(v) for k, v in tags.items()}, "run_id": tracker.run_id}
        version = client.create_model_version(name, source, run_id=tracker.run_id, tags=all_tags)
    except Exception as exc:  # a store without a registry, a refused name, ...
        log.warning("could not register %s in the MLflow Model Registry as %r: %s", directory, name, exc)
        return None
    return int(version.version)


def _ensure_registered_model(client: Any, name: str) -> None:
    """Create the registered model `name` unless it exists (another process may create it meanwhile)."""
    try:
        client.get_registered_model(name)
        return
    except Exception:  # RESOURCE_DOES_NOT_EXIST
        pass
    try:
        client.create_registered_model(name, description="asp length predictor (LoRA adapter + head + tokenizer)")
    except Exception:
        client.get_registered_model(name)  # created by someone else meanwhile; raises if it really failed


def predictor_versions(name: str, tracking_uri: str | None = None) -> list[dict[str, Any]]:
    """The registered versions of `name`, oldest first: ``version``, ``run_id``, ``source`` and ``tags``; [] when
    there are none or tracking is off."""
    if os.environ.get("ASP_TRACKING", "1") == "0":
        return []
    client = _client(resolve_tracking_uri(tracking_uri))
    found = client.search_model_versions(f"name = '{name}'")
    rows = [{"version": int(v.version), "run_id": v.run_id, "source": v.source, "tags": dict(v.tags)} for v in found]
    return sorted(rows, key=lambda r: r["version"])
