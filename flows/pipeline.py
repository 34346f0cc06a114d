"""Prefect flow of the pipeline: each DVC stage is a Prefect task calling the same `asp.pipeline.<stage>.run`
(through `asp.stage.run_stage`), so no logic exists twice; one MLflow parent run per flow run.

Run once:      python -m flows.pipeline                 (all stages, in DAG order)
               python -m flows.pipeline schedule launch (just these; --help lists the stages)
Serve for UI:  asp serve   (a deployment "asp-pipeline" you can trigger from the Prefect UI: asp ui prefect)

The flow runs stages directly; `dvc repro` (make run) remains the way to get DVC's caching and dvc.lock.
A stage that fails ends its own MLflow run and the flow's parent run FAILED (KILLED when interrupted or
cancelled) and fails the flow run. From the shell: an unknown stage, bad params or a stage's bad input exit 2
with one message, any other failure 1, Ctrl-C 130.
"""

from __future__ import annotations

import argparse
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
    from asp.tracking import PARENT_ENV, open_tracker

    chosen = check_stages(stages)
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


def check_stages(stages: list[str] | None) -> list[str]:
    """The chosen stages in DAG order (all when none); `UserError` naming the registered ones for unknown names."""
    from asp.errors import UserError
    from asp.stage import stage_names

    order = stage_names()
    unknown = sorted(set(stages or []) - set(order))
    if unknown:
        raise UserError(f"unknown stage(s) {unknown}; choose from {', '.join(order)}")
    return [s for s in order if not stages or s in stages]


def main(argv: list[str] | None = None) -> int:
    """`python -m flows.pipeline [STAGE ...] [--params FILE]`: run the flow once; returns the exit code."""
    from asp.config import load_params
    from asp.errors import UserError
    from asp.stage import stage_names

    try:
        epilog = f"stages (dvc.yaml order): {' '.join(stage_names())}"
    except UserError as exc:
        epilog = str(exc)
    parser = argparse.ArgumentParser(
        prog="python -m flows.pipeline", description=__doc__.split("\n\n")[0], epilog=epilog
    )
    parser.add_argument("stages", nargs="*", metavar="STAGE", help="stages to run (default: all)")
    parser.add_argument("--params", default="params.yaml", help="params file (default: params.yaml)")
    args = parser.parse_args(argv)
    set_offline_defaults()
    try:
        check_stages(args.stages)  # bad input fails here, before Prefect starts its server
        load_params(args.params)
        asp_pipeline(args.stages or None, args.params)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # Prefect has logged the stage's traceback
        print(f"error: the pipeline failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
