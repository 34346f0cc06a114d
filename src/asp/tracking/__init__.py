"""Experiment tracking: a `Tracker` protocol, an MLflow implementation and a no-op one. Only this package imports
mlflow (import-linter checks it).

* `protocol` - `Tracker`, `NullTracker`, `flatten`, `log_text` and the environment variables naming a parent run
* `store`    - the tracking URI, the SQLite store's health check (`check_store`, `store_errors`), the client
* `runs`     - the MLflow adapter `MlflowTracker`; `open_tracker`, `start_run` / `reopen_run` / `attach_run` /
  `end_run`, how a run ends (`status_of`), run lookups and links, the sweep of runs whose owner died
* `context`  - where a run comes from in MLflow's system tags (source, git, user), descriptions, `stamped` names
* `liveness` - the owner-process tags of a run and whether that process is still alive
* `parents`  - the pipeline parent run of a plain `dvc repro` / `dvc exp run` (walking up to the DVC process)
* `registry` - length predictors in the MLflow Model Registry
* `artifacts` - which run made a stage's current outputs (`find_run_made_with`) and the plots / tables it logged

Conventions (see shared/DESIGN.md):

* store: `MLFLOW_TRACKING_URI`, else `common.tracking_uri`, else `sqlite:///mlflow.db` in the repo root,
  with artifacts under `mlartifacts/`;
* one parent run per pipeline execution (`asp repro` creates it and hands its id to the stage processes
  through the `ASP_PARENT_RUN_ID` environment variable) and one nested run per stage;
* metric names are namespaced: `prepare/prompts`, `schedule/group_load_cv`, `runtime/queue_depth`, ...
* length predictors are registered in the MLflow Model Registry (`register_predictor`): the evaluate stage's is
  version 1 of `drift.registry_model`, every accepted re-profile (`asp.pipeline.reprofile`) adds one;
* a run ends FINISHED, FAILED (an exception) or KILLED (Ctrl-C, SIGTERM, a Prefect cancellation); a status set
  with `end_run` inside the `open_tracker` block stays. While it runs, a run records its owner process (`asp.pid`,
  `asp.host`, `asp.pid_start`) and its key (`asp.run_key`); when a run opens, earlier RUNNING runs of the same key
  whose owner process on this host is gone (killed with SIGKILL, out of memory) are marked KILLED. These
  bookkeeping tags are deleted when a run ends;
* runs carry MLflow's own source tags (`mlflow.source.name` / `.type`, `mlflow.source.git.commit` / `.branch` /
  `.repoURL` / `.dirty`, `mlflow.user`) and a description (`mlflow.note.content`); names tell runs apart: a
  pipeline run is `stamped` with its start time, a nested run is named `<stage> · <parent's name>`.

Usage (callers import from `asp.tracking`; the submodules are its layout)::

    with open_tracker("prepare", experiment="asp") as tracker:
        tracker.log_params({"prepare.b": 32})
        tracker.log_metrics({"prepare/prompts": 2000})
"""

from __future__ import annotations

from asp.tracking.artifacts import find_run_made_with, run_artifacts
from asp.tracking.context import NOTE_TAG, context_tags, stamped
from asp.tracking.liveness import BOOKKEEPING_TAGS, HOST_TAG, PID_TAG, RUN_KEY_TAG, START_TAG, owner_alive, owner_tags
from asp.tracking.parents import dvc_group, dvc_parent, record_in_parent
from asp.tracking.protocol import (
    PARENT_ENV,
    PREFECT_RUN_ENV,
    PREFECT_URL_ENV,
    NullTracker,
    Tracker,
    flatten,
    log_text,
)
from asp.tracking.registry import predictor_versions, register_predictor
from asp.tracking.runs import (
    MlflowTracker,
    attach_run,
    end_nested_runs,
    end_run,
    ensure_experiment,
    find_stage_run,
    nested_statuses,
    open_tracker,
    reopen_run,
    run_url,
    start_run,
    status_of,
    sweep_stale_runs,
)
from asp.tracking.store import (
    ARTIFACT_DIR,
    STORE_FAILURES,
    check_store,
    mlflow_client,
    resolve_tracking_uri,
    sqlite_damage,
    sqlite_file,
    store_errors,
)

__all__ = [
    "ARTIFACT_DIR",
    "BOOKKEEPING_TAGS",
    "HOST_TAG",
    "NOTE_TAG",
    "PARENT_ENV",
    "PID_TAG",
    "PREFECT_RUN_ENV",
    "PREFECT_URL_ENV",
    "RUN_KEY_TAG",
    "START_TAG",
    "STORE_FAILURES",
    "MlflowTracker",
    "NullTracker",
    "Tracker",
    "attach_run",
    "check_store",
    "context_tags",
    "dvc_group",
    "dvc_parent",
    "end_run",
    "ensure_experiment",
    "find_run_made_with",
    "find_stage_run",
    "flatten",
    "log_text",
    "mlflow_client",
    "nested_statuses",
    "end_nested_runs",
    "open_tracker",
    "owner_alive",
    "owner_tags",
    "predictor_versions",
    "record_in_parent",
    "register_predictor",
    "reopen_run",
    "resolve_tracking_uri",
    "run_artifacts",
    "run_url",
    "sqlite_damage",
    "sqlite_file",
    "stamped",
    "start_run",
    "status_of",
    "store_errors",
    "sweep_stale_runs",
]
