"""Prefect flow of the pipeline: each DVC stage is a Prefect task calling the same `asp.pipeline.<stage>.run`
(through `asp.stage.run_stage`), so no logic exists twice; one MLflow parent run per flow run.

Run once:      python -m flows.pipeline                 (all stages, in DAG order)
               python -m flows.pipeline schedule launch (just these)
Serve for UI:  asp serve   (a deployment "asp-pipeline" you can trigger from the Prefect UI: asp ui prefect)

The flow runs stages directly; `dvc repro` (make run) remains the way to get DVC's caching and dvc.lock.
"""

from __future__ import annotations

import importlib
import os
import sys

from prefect import flow, task

from asp.env import set_offline_defaults


@task(name="stage", task_run_name="{name}", retries=0)
def stage_task(name: str, params_path: str) -> dict:
    """One pipeline stage, exactly as `asp stage NAME` runs it."""
    from asp.stage import run_stage

    module = importlib.import_module(f"asp.pipeline.{name}")
    resume = getattr(module, "resume_run_id", None)  # launch: continue the interrupted run's MLflow run
    return run_stage(name, module.run, module.Paths(), params_path, resume_run=resume)


@flow(name="asp-pipeline", log_prints=True)
def asp_pipeline(stages: list[str] | None = None, params_path: str = "params.yaml") -> dict[str, dict]:
    """Run the chosen stages (default: all) in DAG order under one MLflow parent run."""
    from asp.config import load_params
    from asp.errors import UserError
    from asp.stage import stage_names
    from asp.tracking import PARENT_ENV, open_tracker

    order = stage_names()
    chosen = list(order) if not stages else [s for s in order if s in stages]
    unknown = sorted(set(stages or []) - set(order))
    if unknown:
        raise UserError(f"unknown stage(s) {unknown}; choose from {', '.join(order)}")
    params = load_params(params_path)
    results: dict[str, dict] = {}
    with open_tracker(
        "pipeline",
        experiment=params.common.experiment,
        tracking_uri=params.common.tracking_uri,
        tags={"asp.kind": "pipeline", "asp.runner": "prefect"},
    ) as parent:
        previous = os.environ.get(PARENT_ENV)
        if parent.run_id:
            os.environ[PARENT_ENV] = parent.run_id
        try:
            for name in chosen:
                results[name] = stage_task(name, params_path)
        finally:
            if previous is None:
                os.environ.pop(PARENT_ENV, None)
            else:
                os.environ[PARENT_ENV] = previous
    return results


if __name__ == "__main__":
    set_offline_defaults()
    asp_pipeline(sys.argv[1:] or None)
