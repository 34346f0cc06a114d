"""The pipeline parent run of a plain `dvc repro` / `dvc exp run`: found by walking up this stage process's parents
to the DVC command that started it, created by its first stage and reopened by the later ones, so the stage runs of
one DVC command nest under one parent (an orchestrator, `asp repro` or the Prefect flow, makes its own parent and
passes it in $ASP_PARENT_RUN_ID). `record_in_parent` logs what every door records in a parent run.

    with dvc_parent("asp") as parent:        # None unless a DVC command above this process started it
        ...
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

from asp import vcs
from asp.tracking.context import stamped
from asp.tracking.protocol import PARENT_ENV, Tracker
from asp.tracking.runs import MlflowTracker, end_run, ensure_experiment, reopen_run, start_run, status_of
from asp.tracking.store import mlflow_client, resolve_tracking_uri, store_errors

if TYPE_CHECKING:
    from asp.config import Params


def dvc_group(max_depth: int = 8) -> tuple[str, str] | None:
    """The DVC command that started this stage process, as (group key, parent run name): `dvc exp run NAME`
    (DVC_EXP_NAME) or the nearest ancestor `dvc repro` process (pid and start time; named `dvc repro <commit> @
    <its start time>`). None when no DVC command is above this process (a stage run by hand)."""
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
                return key, stamped(f"dvc repro {vcs.commit_label() or 'nogit'}", started)
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
        client = mlflow_client(uri)
        exp_id = ensure_experiment(client, experiment)
        found = client.search_runs([exp_id], f"tags.`asp.group` = '{key}'", max_results=1)
        if found:
            parent = reopen_run(client.tracking_uri, found[0].info.run_id)
        else:
            tags = {"asp.kind": "pipeline", "asp.runner": "dvc", "asp.group": key}
            command = "dvc exp run" if key.startswith("dvc-exp:") else "dvc repro"
            note = (
                f"Pipeline run of a plain `{command}` (not through `asp repro` or Prefect): the runs of the stages "
                "this DVC command ran nest here, with the params file, the resolved params and every stage's metrics."
            )
            parent = start_run(
                client.tracking_uri, experiment, name, tags=tags, description=note, source=(command, "LOCAL")
            )
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


def record_in_parent(parent: Tracker, params: Params, params_path: str | Path, metrics: Mapping[str, Any]) -> None:
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
