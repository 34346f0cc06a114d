"""Which MLflow run made a stage's current outputs, and the plots and tables it logged.

    found = find_run_made_with("asp", "schedule", {"schedule": {"k": 4}, "common": {"seed": 0}})
    run_artifacts(found["run_id"])       # ['plots/schedule_loads.png', 'tables/schedule_ablation.csv']

When DVC skips a stage or restores it from its run cache, the outputs are those of an earlier run of the stage
made with the same params: `find_run_made_with` picks the newest FINISHED run of the stage whose logged params
(as `MlflowTracker.log_params` wrote them) agree with the params of this run on every key both have, so a
DVC experiment's link goes to that experiment's own run, not to the newest run of the stage.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

from asp.tracking.protocol import flatten
from asp.tracking.runs import found_run, stage_runs
from asp.tracking.store import mlflow_client, resolve_tracking_uri


def _logged(value: Any) -> str:
    """A param value as `MlflowTracker.log_params` logs it."""
    return str(value)[:6000]


def find_run_made_with(
    experiment: str,
    stage: str,
    params: Mapping[str, Any],
    *,
    tracking_uri: str | None = None,
    workspace_only: bool = False,
    max_runs: int = 200,
) -> dict[str, Any] | None:
    """The newest FINISHED run of `stage` (among the newest `max_runs`) whose logged params agree with `params`
    (nested or dotted) on every key both have; with `workspace_only`, one not made inside a DVC experiment.
    Returns its experiment id, run id, status and metrics; None when there is none or MLflow is off."""
    found = stage_runs(experiment, stage, tracking_uri=tracking_uri, workspace_only=workspace_only, max_runs=max_runs)
    if found is None:
        return None
    experiment_id, runs = found
    want = {k: _logged(v) for k, v in flatten(params).items()}
    for run in runs:
        logged = run.data.params
        if all(logged[k] == want[k] for k in logged.keys() & want.keys()):
            return found_run(experiment_id, run)
    return None


def run_artifacts(
    run_id: str, folders: Iterable[str] = ("plots", "tables"), tracking_uri: str | None = None
) -> list[str]:
    """The files run `run_id` logged under `folders` (e.g. `plots/schedule_loads.png`), in that order; [] when
    MLflow is off."""
    if os.environ.get("ASP_TRACKING", "1") == "0":
        return []
    client = mlflow_client(resolve_tracking_uri(tracking_uri))
    found: list[str] = []
    for folder in folders:
        found += sorted(f.path for f in client.list_artifacts(run_id, folder) if not f.is_dir)
    return found
