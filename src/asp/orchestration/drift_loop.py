"""The drift loop as the Prefect flow `asp-drift-loop`: launch -> drift -> re-profile -> resume, through DVC.

    asp ui prefect                           # Prefect server + UI on http://127.0.0.1:4200
    asp serve                                # (other shell) serves asp-pipeline AND asp-drift-loop; run it from the UI
    python -m flows.drift_loop               # or run the loop once from the shell (--max-actions N)

A DAG cannot say "run launch until it stops for drift, re-profile, run it again", so this flow drives DVC around
the `launch` stage (docs/drift_loop.md):

1. launch runs as `dvc repro --single-item launch` with `ASP_DRIFT_HANDOFF=1`: on a drift event whose action is
   `reprofile` the stage checkpoints, writes `<state_dir>/drift_pending.json` and ends successfully;
2. the loop *claims* that file (reads it and deletes it at once, so launch's persisted output no longer matches
   dvc.lock and `dvc status` says launch must run again), emits the Prefect event `asp.drift.detected`, runs the
   re-profile sub-flow `asp-reprofile` (`asp reprofile` as a subprocess: the command a person runs by hand, its
   output in the run's log, its GPU memory freed before launch resumes), publishes its result as a markdown
   artifact and emits `asp.reprofile.completed`;
3. launch runs again (`dvc repro --force --single-item launch`): it resumes from its checkpoint and applies the
   accepted re-profile (`<state_dir>/predictors/v<k>/`); after `drift.max_actions` re-profiles the last segment
   runs without the handoff, so it finishes. The final segment is recorded in dvc.lock, so `dvc status` is clean
   exactly when the run finished.

`drift_loop` is the loop itself; its `launch` and `reprofile` arguments default to the real ones
(`run_launch_stage`, `run_reprofile`) and tests pass small real stand-ins. `asp_drift_loop` is the flow and
`loop_deployment` the deployment `asp serve` registers (`asp.orchestration.serve`).
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.events import emit_event
from prefect.runtime import deployment, flow_run

from asp import vcs
from asp.config import DriftParams, load_params
from asp.errors import UserError
from asp.orchestration.dvc import run_streaming
from asp.orchestration.flow import call_stage
from asp.orchestration.pipeline import PipelineRun
from asp.orchestration.prefect_run import (
    flow_run_name_for,
    flow_run_url,
    keep_cancel_message,
    prefect_ui,
    quiet_user_errors,
)
from asp.orchestration.request import RunRequest

if TYPE_CHECKING:
    from prefect.deployments.runner import RunnerDeployment

HANDOFF_ENV = "ASP_DRIFT_HANDOFF"
PENDING_FILE = "drift_pending.json"
STATE_ROOT = Path("outputs/launch_state")  # launch's persisted DVC output (dvc.yaml); one folder per condition
PREDICTORS = "predictors"  # <state_dir>/predictors/v<k>/ (asp.pipeline.reprofile)
DRIFT_EVENT, REPROFILE_EVENT = "asp.drift.detected", "asp.reprofile.completed"


class LoopRun(PipelineRun):
    """The loop's `PipelineRun` of the launch stage: one MLflow parent run for all segments; `handoff` adds
    ASP_DRIFT_HANDOFF=1 to the stage's environment, `force_next` makes the next segment `dvc repro --force`."""

    def __init__(
        self,
        *,
        params_path: str | Path = "params.yaml",
        root: str | Path = ".",
        prefect_run: tuple[str, str | None] | None = None,
        on_line: Callable[[str], None] | None = None,
        name: str | None = None,
        source: str | None = None,
    ) -> None:
        super().__init__(
            RunRequest(stages=("launch",)),
            params_path=params_path,
            root=root,
            runner="prefect",
            on_line=on_line,
            name=name,
            source=source,
        )
        self.prefect_run = prefect_run
        self.label = f"{self.label} drift-loop"
        self.handoff = False
        self.state_dir = self.root / STATE_ROOT / self.params.runtime.condition

    def env(self) -> dict[str, str]:
        env = super().env()
        if self.handoff:
            env[HANDOFF_ENV] = "1"
        else:
            env.pop(HANDOFF_ENV, None)
        return env


@dataclass(frozen=True)
class ReprofileOutcome:
    """What one re-profile did (the fields of `asp.adaptation.reprofile.ReprofileResult`, read from its report):
    `gate_min_tau` is the report's ``min_tau`` (the gate it applied), `prompts_profiled` its ``prompts``."""

    accepted: bool
    version: int
    tau: float = float("nan")
    gate_min_tau: float = float("nan")
    policy_step: int = -1
    prompts_profiled: int = 0
    seconds: float = 0.0
    message: str = ""
    directory: str = ""


@dataclass
class LoopResult:
    """The launch segments (`dvc repro` status, whether the handoff was on), drift events and re-profiles."""

    segments: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    reprofiles: list[ReprofileOutcome] = field(default_factory=list)
    timeline: list[dict[str, Any]] = field(default_factory=list)  # launch and re-profile rows, in order

    def as_dict(self) -> dict[str, Any]:
        return {
            "segments": self.segments,
            "events": self.events,
            "reprofiles": [asdict(r) for r in self.reprofiles],
        }


LaunchFn = Callable[[LoopRun, bool, bool], str]  # (run, handoff, resume) -> ran / skipped / restored
ReprofileFn = Callable[[LoopRun, str], ReprofileOutcome]  # (run, reason) -> outcome


TURN_ON = (
    "To have the loop re-profile, set drift.enabled: true and drift.action: reprofile in params.yaml (`asp preset "
    "apply drift-demo` sets up the CPU drift demo), then run the loop again"
)


def drift_off(drift: DriftParams) -> str | None:
    """Why launch never hands a drift event over to the loop with these params; None when it does."""
    if not drift.enabled:
        return "drift is off (drift.enabled: false)"
    if drift.action not in ("reprofile", "refit_from_run"):
        return f"drift.action is {drift.action}, not reprofile (launch warns or recalibrates by itself)"
    return None


# -- the pending drift event ------------------------------------------------------------------------------------
def claim_pending(state_dir: Path) -> dict[str, Any] | None:
    """Read `<state_dir>/drift_pending.json` and delete it at once (None when there is none).

    Deleting it changes launch's persisted output, so from this moment `dvc status` reports launch as changed
    until a later segment finishes and DVC records it (see docs/drift_loop.md)."""
    path = state_dir / PENDING_FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except ValueError as exc:
        raise UserError(f"{path}: not valid JSON ({exc}); delete it and run the drift loop again.") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a JSON object with the drift event and step; delete it and rerun.")
    path.unlink()
    return data


def pending_reason(pending: dict[str, Any]) -> tuple[str, int]:
    """The event's message (the re-profile's reason) and the trainer step the launch stopped at."""
    event = pending.get("event")
    message = pending.get("message") or (event.get("message") if isinstance(event, dict) else event) or "drift"
    try:
        step = int(pending.get("step", -1))
    except (TypeError, ValueError):
        step = -1
    return str(message), step


# -- the real launch and re-profile -----------------------------------------------------------------------------
def run_launch_stage(run: LoopRun, handoff: bool, resume: bool) -> str:
    """One launch segment: `dvc repro --single-item launch` (with `--force` when resuming after a re-profile:
    launch stopped, so it must run) as a Prefect task with the stage's retries; returns what DVC did."""
    run.handoff = handoff
    run.request = replace(run.request, force=resume)
    name = f"launch ({'resume' if resume else 'start'}{', handoff' if handoff else ''})"
    force = " --force" if resume else ""
    run.on_line(f"[drift-loop] {name}: dvc repro{force} --single-item launch, {HANDOFF_ENV}={int(handoff)}")
    return call_stage(run, "launch", name)  # ran / skipped / restored; raises when it failed or was cancelled


def versions(state_dir: Path) -> dict[int, Path]:
    """The predictor versions under `<state_dir>/predictors/` (v2, v3, ...) by number."""
    found = {}
    for path in (state_dir / PREDICTORS).glob("v*"):
        if path.is_dir() and path.name[1:].isdigit():
            found[int(path.name[1:])] = path
    return found


REPORT_KEYS = {"gate_min_tau": "min_tau", "prompts_profiled": "prompts"}  # ReprofileOutcome field -> report.json key


def read_outcome(directory: Path) -> ReprofileOutcome:
    """The outcome in `<directory>/report.json` (written by the re-profile, accepted or not)."""
    report = directory / "report.json"
    if not report.is_file():
        raise RuntimeError(f"the re-profile wrote {directory} without report.json; see its output above")
    data = json.loads(report.read_text())
    keys = {name: REPORT_KEYS.get(name, name) for name in ReprofileOutcome.__dataclass_fields__}
    known = {name: data[key] for name, key in keys.items() if data.get(key) is not None}
    known.setdefault("version", int(directory.name[1:]))
    known.setdefault("accepted", False)
    known["directory"] = str(directory)
    return ReprofileOutcome(**known)


def reprofile_cmd(reason: str) -> list[str]:
    """`asp reprofile --reason REASON` (state dir, params and tracking from the workspace, as by hand)."""
    return [sys.executable, "-m", "asp", "reprofile", "--reason", reason]


def run_reprofile(run: LoopRun, reason: str) -> ReprofileOutcome:
    """`asp reprofile` in its own process (output to the run's log; nested under the loop's MLflow parent run;
    timeout `orchestration.timeout_s.reprofile`, else profile's); returns the new version's outcome."""
    before = set(versions(run.state_dir))
    run.handoff = False
    timeouts = run.params.orchestration.timeout_s
    result = run_streaming(
        reprofile_cmd(reason),
        env=run.env(),
        on_line=run.on_line,
        timeout_s=timeouts.get("reprofile") or timeouts.get("profile"),
        cwd=run.root,
    )
    if result.returncode != 0 or result.timed_out:
        why = "timed out" if result.timed_out else f"failed with exit code {result.returncode}"
        raise RuntimeError(f"asp reprofile {why}; its output is above")
    new = sorted(set(versions(run.state_dir)) - before)
    if not new:
        raise RuntimeError(f"asp reprofile ended without writing a new version under {run.state_dir / PREDICTORS}")
    return read_outcome(versions(run.state_dir)[new[-1]])


# -- Prefect: sub-flow, events, artifacts ------------------------------------------------------------------------
def outcome_markdown(outcome: ReprofileOutcome, reason: str, step: int, mlflow_url: str | None) -> str:
    verdict = "accepted: launch resumes on its schedule" if outcome.accepted else "rejected: the old schedule stays"
    rows = [
        ("version", f"v{outcome.version}"),
        ("Kendall τ (held out)", f"{outcome.tau:.4f}"),
        ("τ gate (evaluate.min_tau)", f"{outcome.gate_min_tau:.4f}"),
        ("policy step", str(outcome.policy_step)),
        ("prompts profiled", str(outcome.prompts_profiled)),
        ("seconds", f"{outcome.seconds:.1f}"),
        ("directory", f"`{outcome.directory}`"),
    ]
    table = "\n".join(f"| {k} | {v} |" for k, v in rows)
    link = f"[MLflow parent run]({mlflow_url})" if mlflow_url else "MLflow tracking is off"
    return (
        f"### Re-profile v{outcome.version}: {verdict}\n\nDrift at trainer step {step}: {reason}\n\n"
        f"| | |\n|---|---|\n{table}\n\n{outcome.message}\n\n{link}\n"
    )


@flow(name="asp-reprofile", validate_parameters=False, persist_result=False, log_prints=True)
def reprofile_flow(
    reason: str, step: int, action: Callable[[], ReprofileOutcome], mlflow_url: str | None = None
) -> ReprofileOutcome:
    """Re-profile the current policy after the drift event `reason` at trainer step `step` (`action()`: the
    loop's `reprofile(run, reason)`), publish the result as the markdown artifact `asp-reprofile`."""
    outcome = action()
    get_run_logger().info(
        "re-profile v%d %s: %s", outcome.version, "accepted" if outcome.accepted else "rejected", outcome.message
    )
    create_markdown_artifact(
        markdown=outcome_markdown(outcome, reason, step, mlflow_url),
        key="asp-reprofile",
        description=f"re-profile v{outcome.version}: {'accepted' if outcome.accepted else 'rejected'}",
    )
    return outcome


def emit(name: str, run: LoopRun, payload: dict[str, Any]) -> None:
    """A Prefect event about `asp.launch.<condition>`, related to the loop's MLflow parent run."""
    condition = run.params.runtime.condition
    related = []
    if run.parent is not None and getattr(run.parent, "run_id", None):
        related.append({"prefect.resource.id": f"mlflow.run.{run.parent.run_id}", "prefect.resource.role": "mlflow"})
    emit_event(
        event=name,
        resource={"prefect.resource.id": f"asp.launch.{condition}", "prefect.resource.name": f"launch {condition}"},
        related=related,
        payload=payload,
    )


def _safe(value: Any) -> Any:
    """A JSON-safe event payload: non-finite floats become null, anything unknown its text."""
    if isinstance(value, dict):
        return {str(k): _safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_safe(v) for v in value]
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    return value if value is None or isinstance(value, str | int | bool) else str(value)


def _on_line_default(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


# -- the loop ---------------------------------------------------------------------------------------------------
def drift_loop(
    params_path: str | Path = "params.yaml",
    *,
    root: str | Path = ".",
    max_actions: int | None = None,
    launch: LaunchFn = run_launch_stage,
    reprofile: ReprofileFn = run_reprofile,
    prefect_run: tuple[str, str | None] | None = None,
    on_line: Callable[[str], None] = _on_line_default,
    name: str | None = None,
    source: str | None = None,
) -> LoopResult:
    """Launch until it finishes, re-profiling at most `max_actions` times (default `drift.max_actions`). `name` and
    `source`: the MLflow parent run's (the Prefect flow run's name and deployment, so both UIs name it alike).

    Raises:
        UserError: bad params or dvc.yaml (before anything runs), an unreadable drift_pending.json.
        StageFailed: a launch segment failed after its retries.
    """
    run = LoopRun(
        params_path=params_path, root=root, prefect_run=prefect_run, on_line=on_line, name=name, source=source
    )
    drift = run.params.drift
    limit = drift.max_actions if max_actions is None else max_actions
    if limit < 0:
        raise UserError(f"max_actions = {limit}: expected 0 or more re-profiles.")
    off = drift_off(drift)
    if off:
        on_line(f"[drift-loop] {off}: launch never hands a drift event over, so this run is one launch. {TURN_ON}.")
    result = LoopResult()
    with run:
        plan = "one launch (no re-profiling)" if off else f"at most {limit} re-profile(s)"
        on_line(f"[drift-loop] '{run.label}': {plan}; MLflow {run.parent_url or '(off)'}")
        pending = claim_pending(run.state_dir)
        if pending:
            on_line(f"[drift-loop] {run.state_dir / PENDING_FILE} was left by an earlier loop: re-profiling first")
        resume = pending is not None
        while True:
            if pending is None:
                handoff = len(result.reprofiles) < limit
                run.handoff = handoff  # ASP_DRIFT_HANDOFF=1 in the stage's environment, or not
                status = launch(run, handoff, resume)
                result.segments.append({"status": status, "handoff": handoff, "resume": resume})
                result.timeline.append({"step": f"launch {len(result.segments)}", "what": status, "handoff": handoff})
                pending = claim_pending(run.state_dir)
                if pending is None:
                    break
                if not handoff:
                    raise RuntimeError(f"launch wrote {PENDING_FILE} although {HANDOFF_ENV} was not set")
            resume = True
            reason, step = pending_reason(pending)
            if len(result.reprofiles) >= limit:
                on_line(f"[drift-loop] {limit} re-profile(s) done: not acting on '{reason}'; launch resumes")
                pending = None
                continue
            result.events.append({"step": step, "reason": reason})
            emit(DRIFT_EVENT, run, _safe({"step": step, "reason": reason, "pending": pending}))
            n = len(result.reprofiles) + 1
            outcome = reprofile_flow.with_options(flow_run_name=f"reprofile {n} after step {step}")(
                reason, step, functools.partial(reprofile, run, reason), run.parent_url
            )
            result.reprofiles.append(outcome)
            verdict = "accepted" if outcome.accepted else "rejected"
            result.timeline.append({"step": f"reprofile v{outcome.version}", "what": verdict, "handoff": ""})
            emit(REPROFILE_EVENT, run, _safe({"step": step, **asdict(outcome)}))
            pending = None
        publish_summary(run, result, off)
    return result


def publish_summary(run: LoopRun, result: LoopResult, off: str | None = None) -> None:
    """The loop's table artifact: one row per launch segment and re-profile, in order (`off`: why drift was off)."""
    if flow_run.id is None:  # outside a flow run there is nothing to attach it to
        return
    rows = result.timeline or [{"step": "", "what": "", "handoff": ""}]
    note = f" ({off}: one launch; {TURN_ON})" if off else ""
    with contextlib.suppress(Exception):
        create_table_artifact(table=rows, key="asp-drift-loop", description=f"Drift loop '{run.label}'{note}")


# -- the flow and its deployment ---------------------------------------------------------------------------------
def flow_run_name() -> str:
    """The Run Name the user typed, else `drift-loop <commit> @ <start time>` (`asp.orchestration.prefect_run`)."""
    return flow_run_name_for(flow_run.name, f"drift-loop {vcs.commit_label() or 'nogit'}")


@flow(
    name="asp-drift-loop",
    flow_run_name=flow_run_name,
    log_prints=True,
    persist_result=False,
    on_cancellation=[keep_cancel_message],
)
def asp_drift_loop(max_actions: int | None = None) -> dict[str, Any]:
    """Run launch through DVC with the drift handoff; re-profile and resume on each drift event.

    Args:
        max_actions: re-profiles at most (default: drift.max_actions in params.yaml); after that the last launch
            runs without the handoff and finishes.
    """
    logger = get_run_logger()
    quiet_user_errors()  # a failed run's last line at ERROR; a user error without a traceback
    result = drift_loop(
        max_actions=max_actions,
        prefect_run=(str(flow_run.id), flow_run_url(prefect_ui(), str(flow_run.id))),
        on_line=logger.info,
        name=flow_run.name,  # the MLflow parent run is named as the flow run
        source=f"{flow_run.flow_name}/{deployment.name}" if deployment.name else flow_run.flow_name,
    )
    return result.as_dict()


def loop_description(params_path: str | Path = "params.yaml") -> str:
    """The deployment's description: what the loop does, what it needs, and whether drift is on in `params_path`
    when `asp serve` starts (so a user sees it before running a loop that would be one plain launch)."""
    text = (
        "launch through DVC; on drift: re-profile the current policy and resume (docs/drift_loop.md). Needs "
        "drift.enabled: true and drift.action: reprofile in params.yaml, else a run is one plain launch."
    )
    try:
        drift = load_params(params_path).drift
    except (UserError, OSError):
        return text
    off = drift_off(drift)
    if off:
        return f"{text} In {params_path} when asp serve started: {off}. {TURN_ON}."
    return f"{text} In {params_path} when asp serve started: on, at most {drift.max_actions} re-profile(s) a run."


def loop_deployment(name: str = "asp-drift-loop") -> RunnerDeployment:
    """The deployment `asp serve` registers next to asp-pipeline (one run at a time)."""
    from prefect.deployments.runner import EntrypointType

    return asp_drift_loop.to_deployment(
        name=name,
        concurrency_limit=1,
        description=loop_description(),
        tags=["asp", "drift"],
        entrypoint_type=EntrypointType.MODULE_PATH,
    )
