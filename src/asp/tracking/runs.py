"""The MLflow adapter: `MlflowTracker` logs to one run through an explicit `MlflowClient`; runs are started, reopened,
attached to and ended here, with their status following how the block ended (`status_of`), and stale RUNNING runs
of dead owners are marked KILLED when a run of the same key opens (`sweep_stale_runs`).

    with open_tracker("prepare", experiment="asp") as tracker:   # nested under $ASP_PARENT_RUN_ID when set
        tracker.log_metrics({"prepare/prompts": 2000})

A run nested under a parent is named `<name> · <parent's name>` (`prepare · 840e457 demo all @ 05-14 10:32:07`),
so stage runs of different pipeline runs are told apart in MLflow's compare view. Every run carries MLflow's source
and git tags (`asp.tracking.context`), a description when one is given, and while it runs the bookkeeping tags of
its owner process; those are deleted when it ends.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from asp.tracking.context import NOTE_TAG, context_tags
from asp.tracking.liveness import BOOKKEEPING_TAGS, HOST_TAG, PID_TAG, RUN_KEY_TAG, owner_alive, owner_tags
from asp.tracking.protocol import PARENT_ENV, NullTracker, Tracker, flatten
from asp.tracking.store import ARTIFACT_DIR, mlflow_client, resolve_tracking_uri, store_errors

if TYPE_CHECKING:
    from matplotlib.figure import Figure
    from mlflow import MlflowClient

log = logging.getLogger("asp.tracking")


class MlflowTracker:
    """Logs to one MLflow run through an explicit `MlflowClient` (no global active-run state)."""

    def __init__(self, client: MlflowClient, run_id: str, resumed: bool = False) -> None:
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

    def log_figure(self, figure: Figure, name: str) -> None:
        self.client.log_figure(self.run_id, figure, name)

    def log_dict(self, data: Mapping[str, Any], name: str) -> None:
        self.client.log_dict(self.run_id, dict(data), name)

    def set_tags(self, tags: Mapping[str, str]) -> None:
        for k, v in tags.items():
            self.client.set_tag(self.run_id, k, str(v))


def ensure_experiment(client: MlflowClient, name: str, root: str | Path = ".") -> str:
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


def nested_name(client: MlflowClient, run_name: str, parent_run_id: str | None) -> str:
    """`run_name · <the parent run's name>` (the parent named when it has a name), else `run_name`."""
    if not parent_run_id:
        return run_name
    try:
        parent = client.get_run(parent_run_id).info.run_name
    except Exception:  # MlflowException: the parent is not in this store; the run still nests under its id
        parent = None
    return f"{run_name} · {parent}" if parent else run_name


def start_run(
    uri: str,
    experiment: str,
    run_name: str,
    parent_run_id: str | None = None,
    tags: Mapping[str, str] | None = None,
    *,
    key: str | None = None,
    description: str | None = None,
    source: tuple[str, str] | None = None,
) -> MlflowTracker:
    """Create a run and return a tracker bound to it. Nested under `parent_run_id` when given, and then named
    `run_name · <parent's name>`; `key` (default `run_name`) is the runs a later `sweep_stale_runs` looks at;
    `description` (Markdown) is shown as the run's description; `source` (name, type) as its Source (default what
    MLflow records itself, see `asp.tracking.context`)."""
    client = mlflow_client(uri)
    exp_id = ensure_experiment(client, experiment)
    name = nested_name(client, run_name, parent_run_id)
    all_tags = {**context_tags(source=source), **(tags or {}), **owner_tags(), RUN_KEY_TAG: key or run_name}
    all_tags["mlflow.runName"] = name
    if description:
        all_tags[NOTE_TAG] = description
    if parent_run_id:
        all_tags["mlflow.parentRunId"] = parent_run_id
    run = client.create_run(exp_id, run_name=name, tags=all_tags)
    return MlflowTracker(client, run.info.run_id)


def reopen_run(uri: str, run_id: str, key: str | None = None) -> MlflowTracker | None:
    """A tracker bound to an existing run, marked RUNNING again (to continue it), this process its owner (and `key`
    its key, when given); None if the store lacks it."""
    client = mlflow_client(uri)
    try:
        client.get_run(run_id)
    except Exception as exc:  # MlflowException: not in this store (another tracking URI, deleted database)
        log.warning("MLflow run %s cannot be continued (%s); starting a new run", run_id, exc)
        return None
    client.update_run(run_id, status="RUNNING")
    tracker = MlflowTracker(client, run_id, resumed=True)
    tracker.set_tags({"asp.resumed": "true", **owner_tags(), **({RUN_KEY_TAG: key} if key else {})})
    return tracker


EARLIER_PARENTS_TAG = "asp.earlier_parent_runs"  # parent runs a resumed run was nested under before (oldest first)


def move_under(tracker: MlflowTracker, parent: str | None) -> None:
    """Nest a continued run under this attempt's parent run (`parent`; None: leave it where it is): a resumed
    launch belongs to the pipeline run that finished it, not to the one that was stopped (which would keep a
    FINISHED child under its KILLED self while the new parent had none). The earlier parents stay listed in
    `EARLIER_PARENTS_TAG`."""
    if not parent:
        return
    tags = tracker.client.get_run(tracker.run_id).data.tags
    old = tags.get("mlflow.parentRunId")
    if old == parent:
        return
    moved = {"mlflow.parentRunId": parent}
    if old:
        moved[EARLIER_PARENTS_TAG] = ",".join(filter(None, [tags.get(EARLIER_PARENTS_TAG), old]))
    tracker.set_tags(moved)


def drop_bookkeeping(client: MlflowClient, run_id: str) -> None:
    """Delete the owner and key tags of a run that ended (`BOOKKEEPING_TAGS`; those it lacks are skipped)."""
    for tag in BOOKKEEPING_TAGS:
        with contextlib.suppress(Exception):  # MlflowException: no such tag
            client.delete_tag(run_id, tag)


def attach_run(run_id: str, tracking_uri: str | None = None) -> MlflowTracker | None:
    """A tracker bound to an existing run, leaving its status as it is (e.g. `asp reprofile --run-id` logging into
    the launch's run); None when the store has no such run or tracking is off (`ASP_TRACKING=0`)."""
    if os.environ.get("ASP_TRACKING", "1") == "0":
        return None
    client = mlflow_client(resolve_tracking_uri(tracking_uri))
    try:
        client.get_run(run_id)
    except Exception as exc:  # MlflowException: not in this store
        log.warning("MLflow run %s not found (%s)", run_id, exc)
        return None
    return MlflowTracker(client, run_id, resumed=True)


def end_run(tracker: Tracker, status: str = "FINISHED") -> None:
    """Mark an MLflow run finished (or FAILED / KILLED); no-op for the null tracker. Inside `open_tracker`, the
    status set here is the one the run keeps."""
    if isinstance(tracker, MlflowTracker):
        tracker.client.set_terminated(tracker.run_id, status=status)
        tracker.status = status
        drop_bookkeeping(tracker.client, tracker.run_id)


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


def end_nested_runs(tracker: Tracker, status: str = "KILLED") -> list[str]:
    """End the runs nested under `tracker`'s run that are still RUNNING with `status` (a stage process stopped
    before it could end its own run: SIGKILLed past its grace time, or its signal handler replaced by Ray's);
    returns their ids. [] without MLflow."""
    if not isinstance(tracker, MlflowTracker):
        return []
    exp_id = tracker.client.get_run(tracker.run_id).info.experiment_id
    query = f"tags.mlflow.parentRunId = '{tracker.run_id}' and attributes.status = 'RUNNING'"
    ended = []
    for run in tracker.client.search_runs([exp_id], query):
        tracker.client.set_terminated(run.info.run_id, status=status)
        drop_bookkeeping(tracker.client, run.info.run_id)
        ended.append(run.info.run_id)
    return ended


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


def stage_runs(
    experiment: str,
    stage: str,
    *,
    parent_run_id: str | None = None,
    tracking_uri: str | None = None,
    workspace_only: bool = False,
    max_runs: int = 50,
) -> tuple[str, list[Any]] | None:
    """The runs of `stage` in `experiment`, newest first (at most `max_runs`): under `parent_run_id` when given,
    else the FINISHED ones (with `workspace_only`, those not made inside a DVC experiment). Returns the experiment's
    id and the runs; None when MLflow is off or the experiment does not exist."""
    if os.environ.get("ASP_TRACKING", "1") == "0":
        return None
    client = mlflow_client(resolve_tracking_uri(tracking_uri))
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        return None
    query = f"tags.`asp.stage` = '{stage}'"
    if parent_run_id:
        query += f" and tags.mlflow.parentRunId = '{parent_run_id}'"
    else:
        query += " and attributes.status = 'FINISHED'"
    runs = client.search_runs(
        [exp.experiment_id], query, max_results=max_runs, order_by=["attributes.start_time DESC"]
    )
    if workspace_only and not parent_run_id:
        runs = [r for r in runs if "asp.dvc_exp" not in r.data.tags]
    return exp.experiment_id, runs


def found_run(experiment_id: str, run: Any) -> dict[str, Any]:
    """A run as `find_stage_run` and `find_run_made_with` return it: ids, status and metrics."""
    return {
        "experiment_id": experiment_id,
        "run_id": run.info.run_id,
        "status": run.info.status,
        "metrics": dict(run.data.metrics),
    }


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
    found = stage_runs(
        experiment, stage, parent_run_id=parent_run_id, tracking_uri=tracking_uri, workspace_only=workspace_only
    )
    if found is None or not found[1]:
        return None
    return found_run(found[0], found[1][0])


def sweep_stale_runs(tracker: Tracker, key: str) -> list[str]:
    """Mark KILLED the RUNNING runs of `key` (`asp.run_key`: a stage's name; in `tracker`'s experiment, other than
    its own run) whose owner process died without ending them (SIGKILL, out of memory, power loss on this host);
    their bookkeeping tags give way to `asp.killed_reason`. Returns their ids."""
    if not isinstance(tracker, MlflowTracker) or "'" in key:
        return []
    client = tracker.client
    exp_id = client.get_run(tracker.run_id).info.experiment_id
    query = f"attributes.status = 'RUNNING' and tags.`{RUN_KEY_TAG}` = '{key}'"
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
        drop_bookkeeping(client, run.info.run_id)
        log.warning("MLflow run %s (%s) was left RUNNING: %s; marked KILLED", run.info.run_id, run.info.run_name, why)
    return [run.info.run_id for run in stale]


@contextlib.contextmanager
def open_tracker(
    run_name: str,
    *,
    experiment: str,
    tracking_uri: str | None = None,
    enabled: bool = True,
    tags: Mapping[str, str] | None = None,
    resume_run_id: str | None = None,
    key: str | None = None,
    description: str | None = None,
    source: tuple[str, str] | None = None,
) -> Iterator[Tracker]:
    """Open a stage run nested under `$ASP_PARENT_RUN_ID` when set (named `run_name · <parent's name>` there); it
    ends FAILED if the block raises an error, KILLED if it is interrupted (see `status_of`), with the status given
    to `end_run` inside the block if any, else FINISHED. Earlier runs of the same `key` (default `run_name`) left
    RUNNING by a dead process are marked KILLED first. `description` and `source`: see `start_run`.

    With `resume_run_id` (a run that was interrupted, e.g. a resumed `launch`), that run is continued
    instead: same run id, metrics logged at later steps extend its curves."""
    if not enabled or os.environ.get("ASP_TRACKING", "1") == "0":
        yield NullTracker()
        return
    key = key or run_name
    uri = resolve_tracking_uri(tracking_uri)
    with store_errors(uri):
        tracker = reopen_run(uri, resume_run_id, key) if resume_run_id else None
        parent = os.environ.get(PARENT_ENV)
        if tracker is not None:
            move_under(tracker, parent)
        else:
            tracker = start_run(
                uri, experiment, run_name, parent, tags, key=key, description=description, source=source
            )
    try:
        sweep_stale_runs(tracker, key)
    except Exception as exc:  # never fail a stage over another run's bookkeeping
        log.warning("could not check for stale MLflow runs of %s: %s", key, exc)
    try:
        yield tracker
    except BaseException as exc:
        end_run(tracker, status_of(exc))
        raise
    if tracker.status is None:
        end_run(tracker)
