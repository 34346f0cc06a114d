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
import re
from collections.abc import Iterator
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
    end_flow_run_as,
    flow_run_name_for,
    flow_run_url,
    keep_cancel_message,
    prefect_ui,
    quiet_user_errors,
    runner_cancelling,
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


OVERRIDE_START = re.compile(r"[\s,;]+(?=[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+\s*=)")  # where the next KEY= begins


def parse_overrides(text: str | None) -> dict[str, Any]:
    """The flow's `overrides`, what the user typed in the run form's text box: `SECTION.KEY=VALUE` items separated
    by spaces, commas or new lines (`schedule.k=4 runtime.trainer.kind=grpo`; a value may hold spaces and commas, as
    `a.b=[1, 2]` does), read as `asp repro --set` reads them (values as YAML scalars). `UserError` naming a bad
    item."""
    items = OVERRIDE_START.split((text or "").strip())
    return parse_set_args((i.strip().rstrip(",;") for i in items if i.strip()), origin="overrides")


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


def mlflow_link(url: str | None, text: str) -> str:
    """A Markdown link to an MLflow run (Prefect renders Markdown in markdown artifacts and artifact descriptions,
    not in logs or table artifacts), or a note that tracking found none."""
    return f"[{text}]({url})" if url else "no MLflow run"


def run_summary(label: str, parent_url: str | None, reports: list[StageReport], exp_name: str | None) -> str:
    """The flow run's Markdown summary: the MLflow parent run and each stage's MLflow run as links (so far: it is
    published when the run starts and again when it ends), and the DVC experiment."""
    parent = f"[MLflow parent run]({parent_url})" if parent_url else "MLflow tracking is off"
    text = f"### {label}\n\n{parent}"
    if reports:
        rows = [
            f"| {r.stage} | {r.status} | {r.seconds:.1f} | {mlflow_link(r.mlflow_url, 'MLflow run')} |"
            for r in reports
        ]
        text += "\n\n| stage | status | seconds | MLflow |\n|---|---|---|---|\n" + "\n".join(rows)
    if exp_name:
        text += (
            f"\n\nDVC experiment `{exp_name}`: `dvc exp show` lists it; `dvc exp apply {exp_name}` brings its params "
            "and outputs into the workspace."
        )
    return text


def publish_summary(run: PipelineRun) -> None:
    """The `asp-pipeline-run` artifact (`run_summary`); its description, shown on the run's Artifacts tab, links the
    MLflow parent run."""
    create_markdown_artifact(
        markdown=run_summary(run.label, run.parent_url, list(run.reports.values()), run.exp_name),
        key="asp-pipeline-run",
        description=mlflow_link(run.parent_url, "Open this run in MLflow"),
    )


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
        description=f"{report.stage}: {report.status}; " + mlflow_link(report.mlflow_url, "MLflow run"),
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
    re-raised by `reraise_stop`; the MLflow parent has ended KILLED) ends the flow run Cancelled with a message
    that says what became of the workspace: the flow run's message and last log line then say it, where the
    engine's own handling would leave "Finished in state Running()".

    The runner's cancel (`runner_cancelling`): the state is set here (`end_flow_run_as`) and the signal goes on to
    the engine, which then ends the process as a cancel (exit 0, no traceback, no "Process exited with status
    code: 1" from the runner). Any other termination signal (a plain SIGTERM): a Cancelled state is yielded for
    the flow to return. A Ctrl-C of a flow run outside a deployment goes on as it is (exits 130)."""
    outcome: list[State[Any]] = []
    try:
        yield outcome
    except TerminationSignal as exc:
        if exc is not run.interrupted:
            raise
        state = Cancelled(message=run.stop_note or "cancelled")
        if runner_cancelling() and end_flow_run_as(state):
            raise
        outcome.append(state)


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
    overrides: str = "",  # a text box in the UI's form
    force: bool = False,
) -> dict[str, str] | State[Any]:
    """Run the chosen stages (default: all, in dvc.yaml order) through DVC under one MLflow parent run; a bad
    request ends the run Failed with its message.

    Args:
        stages: stage names from dvc.yaml; none means all.
        preset: a preset in configs/ applied on top of params.yaml for this run only (the run is then a DVC
            experiment); none: params.yaml as it is.
        overrides: params for this run only, SECTION.KEY=VALUE items (dotted keys) separated by spaces, e.g.
            schedule.k=3 runtime.trainer.kind=grpo, as `asp repro --set` takes them; the run is then a DVC experiment
            and params.yaml stays as it is. Checked against the params models before anything runs.
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
        publish_summary(run)  # the link to MLflow while the run runs, on the Artifacts tab
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
        publish_summary(run)
    if cancelled:
        return cancelled[0]
    return {r.stage: r.status for r in run.reports.values()}
