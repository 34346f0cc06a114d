"""The Prefect flow of the pipeline and its deployment: each task runs one stage THROUGH DVC.

    asp ui prefect              # Prefect server + UI on http://127.0.0.1:4200
    asp serve                   # (other shell) deployment "asp-pipeline/asp-pipeline"; trigger it from the UI
    python -m flows.pipeline schedule --set schedule.k=3   # or run the flow once from the shell

The flow is a thin shell over `asp.orchestration.pipeline.PipelineRun`, the same code `asp repro` uses:
a run without preset or overrides is one task per stage (`dvc repro --single-item STAGE`; an up-to-date stage
ends in the state "Skipped", one restored from DVC's run cache "Restored"), a run with a preset or overrides
one task running the DVC experiment (`dvc exp run --temp`, named after the flow run), so params.yaml and
outputs/ are never rewritten. Every stage publishes an artifact (its key metrics, plots, a link to its MLflow
run), the flow a summary with the MLflow parent run. The deployment takes typed parameters (the stages as a
multi-select of dvc.yaml's names, a preset, overrides validated before anything runs), runs one flow run at a
time (concurrency limit 1), retries `profile` and `launch` (they resume) and stops a stage past its timeout
(`orchestration:` in params.yaml). Stage output, including progress lines every ~10 %, goes to the run's log.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NONE
from prefect.client.schemas.objects import State  # at run time: Prefect evaluates the flow's annotations
from prefect.exceptions import TerminationSignal
from prefect.runtime import deployment, flow_run
from prefect.states import Cancelled, Completed, Failed

from asp import vcs
from asp.errors import UserError
from asp.orchestration.key_metrics import key_metrics
from asp.orchestration.pipeline import PipelineRun, StageReport
from asp.orchestration.prefect_run import (
    flow_run_name_for,
    flow_run_url,
    keep_cancel_message,
    prefect_ui,
    quiet_user_errors,
    tag_with_label,
)
from asp.orchestration.request import RunRequest, parse_set_args, run_label
from asp.stage import stage_names

STATE_NAMES = {"ran": "Completed", "skipped": "Skipped", "restored": "Restored"}


def _stage_type() -> Any:
    """`Literal[<dvc.yaml's stage names>]`, so the UI offers them as a multi-select; `str` without dvc.yaml."""
    try:
        return Literal[tuple(stage_names())]
    except UserError:
        return str


StageName = _stage_type()

NO_PRESET = "none"  # the `preset` choice "params.yaml as it is"


def _preset_type() -> Any:
    """`Literal["none", <the presets in configs/>]`, so the UI offers them as a choice (read when the module is
    imported: `asp serve` in the project root; a preset added later shows after `asp serve` restarts)."""
    found = sorted(p.stem for p in Path("configs").glob("*.yaml") if p.stem != NO_PRESET)
    return Literal[tuple([NO_PRESET, *found])]


PresetName = _preset_type()


def parse_overrides(overrides: Iterable[str] | None) -> dict[str, Any]:
    """The flow's `overrides`, the run form's list of `SECTION.KEY=VALUE` items (blank ones skipped; values read as
    YAML scalars, as `asp repro --set` reads them), as dotted keys. `UserError` naming a bad item. (A JSON object
    of dotted keys is refused by the server before the run starts: the deployment enforces the list's schema.)"""
    return parse_set_args((str(o).strip() for o in overrides or () if str(o).strip()), origin="overrides")


def _request(stages: Any, preset: Any, overrides: Any, force: Any) -> RunRequest:
    return RunRequest(
        tuple(stages or ()),
        None if preset in (None, "", NO_PRESET) else preset,
        parse_overrides(overrides),
        bool(force),
        overrides_from="overrides",  # the parameter's name, in the UI's form: messages name it
    )


def flow_run_name() -> str:
    """Name of a flow run, and of its MLflow parent run: the Run Name the user typed in the UI, else what runs
    (`run_label`: commit, preset, stages, overrides) stamped with the start time (`asp.orchestration.prefect_run`)."""
    p = flow_run.parameters
    try:
        request = _request(p.get("stages"), p.get("preset"), p.get("overrides"), p.get("force"))
        label = run_label(request, vcs.commit_label(), stage_names())
    except UserError:
        label = "asp-pipeline (no dvc.yaml)"
    return flow_run_name_for(flow_run.name, label)


def _key(*parts: str) -> str:
    """An artifact key (lowercase letters, digits, dashes)."""
    return "-".join(p.lower().replace("_", "-") for p in parts)


WHAT = {"ran": "ran", "skipped": "was up to date (DVC skipped it)", "restored": "was restored from DVC's run cache"}


def artifact_url(run_url: str, path: str) -> str:
    """The MLflow UI address of artifact `path` (e.g. plots/x.png) of the run at `run_url` (`asp.tracking.run_url`)."""
    base, sep, query = run_url.partition("?")
    return f"{base}/artifacts/{quote(path)}{sep}{query}"


def metrics_rows(report: StageReport) -> list[dict[str, Any]]:
    """The stage's key metrics (`asp.orchestration.key_metrics`) as table rows."""
    rows = [{"metric": k, "value": round(v, 6)} for k, v in key_metrics(report.stage, report.metrics)]
    return rows or [{"metric": "(no metrics file)", "value": ""}]


def stage_markdown(report: StageReport) -> str:
    """The stage's note: what DVC did and where (workspace or DVC experiment), the MLflow run that made the outputs
    and that run's own plots and tables, linked in MLflow."""
    where = f" in the DVC experiment `{report.experiment}`" if report.experiment else ""
    text = f"### {report.stage}: {WHAT.get(report.status, report.status)}{where}\n\n"
    if report.mlflow_url:
        whose = "made by this run" if report.status == "ran" else "the run that made these outputs"
        text += f"[MLflow run of {report.stage}]({report.mlflow_url}) ({whose}). "
    else:
        text += "No MLflow run of it was found. "
    text += f"Took {report.seconds:.1f} s.\n\n"
    if report.mlflow_url and report.artifacts:
        links = "\n".join(f"- [{p}]({artifact_url(report.mlflow_url, p)})" for p in report.artifacts)
        text += f"Plots and tables of that MLflow run:\n{links}\n\n"
    files = ", ".join(f"`{p}`" for p in report.plots) or "none"
    if report.experiment:
        text += (
            f"The workspace's files ({files}) are not this run's: `dvc exp apply {report.experiment}` brings the "
            "experiment's outputs into the workspace.\n"
        )
    else:
        text += f"In the workspace: {files}.\n"
    return text


def publish_stage(report: StageReport) -> None:
    """The stage's artifacts: a table of its key metrics and a note with its MLflow run and that run's plots."""
    where = f" in DVC experiment {report.experiment}" if report.experiment else ""
    what = WHAT.get(report.status, report.status) + where
    shown = len(key_metrics(report.stage, report.metrics))
    create_table_artifact(
        table=metrics_rows(report),
        key=_key("asp", report.stage, "metrics"),
        description=f"**{report.stage}** {what}: key metrics ({shown} of {len(report.metrics)}; all in MLflow)",
    )
    create_markdown_artifact(
        markdown=stage_markdown(report),
        key=_key("asp", report.stage),
        description=f"{report.stage}: {report.status}; MLflow link",
    )


def _finish(report: StageReport) -> State[str]:
    """A Completed state named after what DVC did (Completed / Skipped / Restored)."""
    publish_stage(report)
    message = f"{report.stage}: {report.status}" + (f" (MLflow {report.mlflow_url})" if report.mlflow_url else "")
    return Completed(name=STATE_NAMES.get(report.status, "Completed"), message=message, data=report.status)


def _cancelled(run: PipelineRun, exc: BaseException) -> State[Any]:
    """A Cancelled state for a task whose stage `exc` stopped (the workspace already put back, `run.stop_note` says
    so); re-raises anything else. The interrupt itself goes on to the flow through `reraise_stop`."""
    if exc is not run.interrupted:
        raise exc
    return Cancelled(message=run.stop_note or "cancelled")


def reraise_stop(run: PipelineRun) -> None:
    """In the flow, after a task: re-raise the cancellation (or Ctrl-C / SIGTERM) that stopped its stage, so Prefect
    ends the flow run Cancelled (its engine's handling of the runner's cancellation) and the MLflow parent KILLED."""
    if run.interrupted is not None:
        raise run.interrupted


@contextlib.contextmanager
def ends_cancelled(run: PipelineRun) -> Iterator[list[State[Any]]]:
    """Around the flow's `with run:` block: the cancellation that stopped a stage (Prefect's termination signal,
    re-raised by `reraise_stop`; the MLflow parent has ended KILLED) is caught here and a Cancelled state whose
    message says what became of the workspace is yielded, for the flow to return: the flow run's message and last
    log line then say it, where the engine's own handling would leave "Finished in state Running()". A Ctrl-C or
    SIGTERM of a flow run outside a deployment goes on as it is (Ctrl-C exits 130)."""
    outcome: list[State[Any]] = []
    try:
        yield outcome
    except TerminationSignal as exc:
        if exc is not run.interrupted:
            raise
        outcome.append(Cancelled(message=run.stop_note or "cancelled"))


@task(name="stage", cache_policy=NONE, persist_result=False)
def stage_task(run: PipelineRun, name: str) -> State[str]:
    """One stage through `dvc repro --single-item`, with the stage's retries (`asp.orchestration.retry`, the same
    mechanism as `asp repro`; Prefect's own task retries stay off) and timeout from `orchestration:` params. A
    cancelled stage ends Cancelled, not Crashed, once the workspace is as it was before it (`call_stage`)."""
    run.on_line = get_run_logger().info
    try:
        return _finish(run.run_stage_with_retries(name))
    except BaseException as exc:
        return _cancelled(run, exc)


def call_stage(run: PipelineRun, name: str, task_run_name: str | None = None) -> str:
    """`stage_task` as a flow calls it: what DVC did (ran / skipped / restored); raises the stage's failure, and
    the interrupt that stopped it (`reraise_stop`: the task Cancelled, then the flow run)."""
    state = stage_task.with_options(task_run_name=task_run_name or name)(run, name, return_state=True)
    reraise_stop(run)
    return str(state.result())


@task(name="dvc-experiment", cache_policy=NONE, persist_result=False)
def experiment_task(run: PipelineRun) -> list[str] | State[Any]:
    """The chosen stages as one DVC experiment in a temporary workspace (`dvc exp run --temp`); Cancelled (not
    Crashed) when a cancellation stops it."""
    run.on_line = get_run_logger().info
    try:
        reports = run.run_experiment()
    except BaseException as exc:
        return _cancelled(run, exc)
    for report in reports:
        publish_stage(report)
    return [f"{r.stage}: {r.status}" for r in reports]


@flow(
    name="asp-pipeline",
    flow_run_name=flow_run_name,
    log_prints=True,
    persist_result=False,
    on_cancellation=[keep_cancel_message],  # the runner's generic message must not replace the flow's
)
def asp_pipeline(
    stages: list[StageName] = [],  # type: ignore[valid-type]  # noqa: B006 (shown as a multi-select; not mutated)
    preset: PresetName = NO_PRESET,  # type: ignore[valid-type]  # shown as a choice of configs/'s presets
    overrides: list[str] = [],  # noqa: B006 (a list of text boxes in the UI's form, not `None`; not mutated)
    force: bool = False,
) -> dict[str, str] | State[Any]:
    """Run the chosen stages (default: all, in dvc.yaml order) through DVC under one MLflow parent run; a bad
    request ends the run Failed with its message.

    Args:
        stages: stage names from dvc.yaml; none means all.
        preset: a preset in configs/ applied on top of params.yaml for this run only (the run is then a DVC
            experiment); none: params.yaml as it is.
        overrides: params for this run only, one SECTION.KEY=VALUE per item (dotted keys), e.g. schedule.k=3 or
            runtime.trainer=grpo, as `asp repro --set` takes them; the run is then a DVC experiment and params.yaml
            stays as it is. Checked against the params models before anything runs.
        force: rerun stages even when DVC finds them up to date (force=true with no overrides reruns them in the
            workspace). How to run, cancel and read a run: docs/ui.md.
    """
    logger = get_run_logger()
    quiet_user_errors()
    try:  # bad stages, preset or overrides fail here, before DVC or MLflow is touched
        request = _request(stages, preset, overrides, force)
        run = PipelineRun(
            request,
            runner="prefect",
            prefect_run=(str(flow_run.id), flow_run_url(prefect_ui(), str(flow_run.id))),
            on_line=logger.info,
            name=flow_run.name,  # the MLflow parent run is named as the flow run
            source=f"{flow_run.flow_name}/{deployment.name}" if deployment.name else flow_run.flow_name,
        )
    except UserError as exc:  # what the user typed: one message, in the state, without a traceback
        return Failed(message=str(exc), data=exc)
    if not run.name.startswith(f"{run.label} @ "):  # the user named it: what runs goes to a tag
        tag_with_label(str(flow_run.id), run.label)
    with ends_cancelled(run) as cancelled, run:
        logger.info("run '%s': MLflow parent run %s", run.name, run.parent_url or "(tracking off)")
        if request.is_experiment:
            state = experiment_task.with_options(task_run_name=f"dvc exp run {run.exp_name}")(run, return_state=True)
            reraise_stop(run)
            state.result()  # raises the experiment's failure
        else:
            for name in run.stages:
                call_stage(run, name)
        summary = [
            {"stage": r.stage, "status": r.status, "seconds": round(r.seconds, 1), "mlflow": r.mlflow_url or ""}
            for r in run.reports.values()
        ]
        create_table_artifact(table=summary, key="asp-pipeline", description=f"Stages of '{run.label}'")
        exp = (
            f"\n\nDVC experiment `{run.exp_name}`: `dvc exp show` lists it; `dvc exp apply {run.exp_name}` "
            "brings its params and outputs into the workspace."
            if run.exp_name
            else ""
        )
        parent = f"[MLflow parent run]({run.parent_url})" if run.parent_url else "MLflow tracking is off"
        create_markdown_artifact(
            markdown=f"### {run.label}\n\n{parent}{exp}", key="asp-pipeline-run", description="MLflow link"
        )
    if cancelled:
        return cancelled[0]
    return {r.stage: r.status for r in run.reports.values()}
