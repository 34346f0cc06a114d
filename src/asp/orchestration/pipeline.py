"""One pipeline run, whichever door started it (`asp repro` or the Prefect flow): stages run THROUGH DVC.

    with PipelineRun(RunRequest(stages=("schedule",)), runner="cli") as run:
        for name in run.stages:
            report = run.run_stage(name)          # dvc repro --single-item NAME (skipped when up to date)

A run without a preset or overrides runs each stage with `dvc repro --single-item` in the workspace, so
`dvc.lock`, DVC's cache and run cache and `dvc status` stay truthful. A run with a preset or overrides is a
DVC experiment (`run_experiment`: `dvc exp run --temp -n LABEL -S ...`): it runs in a temporary copy, so
`params.yaml` and `outputs/` are never rewritten; `dvc exp show` lists it and `dvc exp apply NAME` brings it
into the workspace. Either way one MLflow parent run, named `run.name` (`run_label` stamped with the start time, or
the name the user gave the Prefect run), holds the stage runs (nested through `$ASP_PARENT_RUN_ID`, named
`<stage> · <run.name>`), the params file, the resolved params and every stage's metrics; its description says
what the run is and, once it ended, what each stage did.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import shlex
import shutil
import sys
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from asp import vcs
from asp.env import Terminated
from asp.errors import UserError
from asp.orchestration import workspace
from asp.orchestration.dvc import (
    StageStatus,
    changed_outputs,
    classify,
    clear_stale_copies,
    dvc_exp_cmd,
    dvc_repro_cmd,
    experiment_copies,
    mark_experiment,
    note_copy,
    remove_experiment_copies,
    run_streaming,
    stage_env,
    stage_exit_code,
    stage_status,
)
from asp.orchestration.request import (
    RunRequest,
    check_request,
    describe_run,
    effective_overrides,
    experiment_name,
    ordered_stages,
    run_label,
)
from asp.orchestration.retry import RetryPolicy, call_with_retries
from asp.stage import RESUME_ENV, check_stage_inputs, persistent_outputs, stage_names
from asp.steps.launch_state import holds_progress
from asp.tracking import (
    NOTE_TAG,
    PARENT_ENV,
    PREFECT_RUN_ENV,
    PREFECT_URL_ENV,
    end_nested_runs,
    end_run,
    find_run_made_with,
    find_stage_run,
    nested_statuses,
    open_tracker,
    record_in_parent,
    resolve_tracking_uri,
    run_artifacts,
    run_url,
    stamped,
)

EXP_PROGRESS = Path(".dvc/tmp/asp-exp-progress")  # what stopped experiments keep for the same run to resume


class StageFailed(Exception):
    """A stage failed (or timed out) under DVC; its own MLflow run says why, its output was streamed. `workspace`:
    what became of the workspace (a timed-out stage's outputs are put back as they were)."""

    def __init__(
        self,
        stage: str,
        returncode: int,
        timed_out: bool = False,
        workspace: str | None = None,
        stage_code: int | None = None,
    ) -> None:
        why = "timed out (orchestration.timeout_s)" if timed_out else f"failed (dvc exit code {returncode})"
        if stage_code is not None and not timed_out:
            why = f"failed (the stage exited with {stage_code}, dvc with {returncode})"
        where = f"; {workspace.rstrip('.')}" if workspace else ""
        super().__init__(f"stage '{stage}' {why}; its output is above and its MLflow run has the details{where}")
        self.stage, self.returncode, self.timed_out, self.stage_code = stage, returncode, timed_out, stage_code

    @property
    def exit_code(self) -> int:
        """What the command exits with: the stage's own code (2: it refused bad input) where DVC named it, else
        DVC's (255 for any failed stage)."""
        return self.stage_code if self.stage_code is not None and not self.timed_out else self.returncode or 1


@dataclass
class StageReport:
    """What happened to one stage: `status` ran / skipped (up to date) / restored (DVC run cache), its
    seconds, its metrics (from its metrics files), its plots, and the MLflow run that made its outputs."""

    stage: str
    status: StageStatus
    seconds: float
    metrics: dict[str, float] = field(default_factory=dict)
    plots: list[str] = field(default_factory=list)
    mlflow_run_id: str | None = None
    mlflow_url: str | None = None
    artifacts: list[str] = field(default_factory=list)  # plots/ and tables/ files of that MLflow run
    experiment: str | None = None  # the DVC experiment that holds the outputs (None: the workspace)


def shown_cmd(cmd: list[str]) -> str:
    """A DVC command as a person types it: `python -m dvc` shown as `dvc`, the arguments shell-quoted."""
    head = 3 if cmd[:3] == [sys.executable, "-m", "dvc"] else 0
    return shlex.join(["dvc", *cmd[head:]] if head else cmd)


def stage_files(name: str, dvc_file: str | Path = "dvc.yaml") -> tuple[list[str], list[str]]:
    """The metrics files and plot files `dvc.yaml` declares for stage `name`."""
    spec = (yaml.safe_load(Path(dvc_file).read_text()).get("stages") or {}).get(name) or {}

    def paths(key: str) -> list[str]:
        return [next(iter(e)) if isinstance(e, dict) else str(e) for e in spec.get(key) or []]

    return paths("metrics"), paths("plots")


def uncached_outputs(dvc_file: str | Path = "dvc.yaml") -> list[str]:
    """The outputs `dvc.yaml` marks `cache: false` (metrics, plots, timings), except persistent ones (checkpoints
    that must not leak into another run). A `dvc exp run --temp` copy lacks them when git does not hold them
    (untracked, or new), and DVC would rerun their stages for nothing, so they are copied in (`-C`)."""
    stages = yaml.safe_load(Path(dvc_file).read_text()).get("stages") or {}
    found = []
    for spec in stages.values():
        for key in ("outs", "metrics", "plots"):
            for entry in spec.get(key) or []:
                if isinstance(entry, dict):
                    ((path, opts),) = entry.items()
                    if opts and opts.get("cache") is False and not opts.get("persist"):
                        found.append(path)
    return sorted(set(found))


def copy_paths(paths: list[str], root: Path) -> list[str]:
    """What `dvc exp run -C` must copy for `paths` to exist in the temporary copy: a path whose top folder git
    ignores is copied as that whole folder (DVC copies into existing folders only), others one by one."""
    out: list[str] = []
    for path in paths:
        top = path.split("/", 1)[0]
        ignored = vcs.git("check-ignore", top, cwd=root) == top
        target = top if ignored and "/" in path else path
        if (root / target).exists() and target not in out:
            out.append(target)
    return out


def stage_seconds(marks: list[tuple[float, str]], end: float) -> dict[str, float]:
    """Seconds per stage from timestamped DVC output: from the line that names a stage to the next such line."""
    named = [(t, stage) for t, line in marks for stage in classify([line])]
    return {stage: (named[i + 1][0] if i + 1 < len(named) else end) - t for i, (t, stage) in enumerate(named)}


def numeric_leaves(data: Any, prefix: str = "") -> dict[str, float]:
    """Finite numbers in a metrics mapping, nested keys joined with '/' (lists and text are left out)."""
    out: dict[str, float] = {}
    if isinstance(data, Mapping):
        for key, value in data.items():
            out.update(numeric_leaves(value, f"{prefix}{key}/" if isinstance(value, Mapping) else f"{prefix}{key}"))
    elif isinstance(data, int | float) and not isinstance(data, bool) and math.isfinite(data):
        out[prefix] = float(data)
    return out


def _absolute_store(uri: str, root: Path) -> str:
    """A relative SQLite store made absolute, so stages in a DVC temp workspace write to the same database."""
    prefix = "sqlite:///"
    if uri.startswith(prefix) and not Path(uri[len(prefix) :]).is_absolute():
        return prefix + (root / uri[len(prefix) :]).resolve().as_posix()
    return uri


def _stopped_by(exc: BaseException) -> str:
    """How an interrupt stopped a stage, in words: Ctrl-C, SIGTERM, or Prefect's cancellation / termination."""
    if isinstance(exc, Terminated):
        return "was stopped by SIGTERM"
    if isinstance(exc, KeyboardInterrupt):
        return "was interrupted (Ctrl-C)"
    return "was cancelled"  # prefect.exceptions.TerminationSignal: a cancellation (UI, API) or a SIGTERM to the run


def _print_line(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class PipelineRun:
    """A pipeline run under one MLflow parent run; see the module docstring. Validation happens in the
    constructor (before any server, DVC or MLflow call), so bad input fails at once with `UserError`."""

    def __init__(
        self,
        request: RunRequest,
        *,
        params_path: str | Path = "params.yaml",
        root: str | Path = ".",
        runner: str = "cli",
        prefect_run: tuple[str, str | None] | None = None,
        on_line: Callable[[str], None] | None = None,
        name: str | None = None,
        source: str | None = None,
    ) -> None:
        """`name`: the run's name (the Prefect flow run's; default `run_label` stamped with now); `source`: what
        MLflow shows as the parent run's Source (default `asp repro`, or `prefect` for the Prefect runner)."""
        self.request = request
        self._name, self.started, self.source = name, time.time(), source
        self.root = Path(root).resolve()
        self.params_path = Path(params_path)
        self.params = check_request(request, params_path, self.root)
        self.stages = ordered_stages(request, self.root)
        self.label = run_label(request, vcs.commit_label(self.root), stage_names(self.root / "dvc.yaml"))
        self.exp_name = (
            experiment_name(self.label, (prefect_run[0] if prefect_run else uuid.uuid4().hex)[:8])
            if request.is_experiment
            else None
        )
        self.runner, self.prefect_run = runner, prefect_run
        self.on_line: Callable[[str], None] = on_line or _print_line  # None: print to stderr
        self.reports: dict[str, StageReport] = {}
        self._stack = contextlib.ExitStack()
        self.parent: Any = None
        self.failed = False
        self.exp_ref: str | None = None
        self.parent_url: str | None = None
        self.interrupted: BaseException | None = None  # the Ctrl-C / SIGTERM / cancellation that stopped a stage
        self.stop_note: str | None = None  # what became of the workspace after that stop (or a timeout)
        self._snapshots: dict[str, workspace.Snapshot] = {}  # outputs kept while a stage runs (put back on a stop)
        self._changed: dict[str, bool] = {}  # whether DVC found the stage changed when it started (not just forced)

    @property
    def name(self) -> str:
        """The run's name: in MLflow (the parent run) and Prefect (the flow run) alike."""
        return self._name or stamped(self.label, self.started)

    def _description(self) -> str:
        """The parent run's description (`describe_run`), with what each stage did so far."""
        outcomes = [(r.stage, r.status, r.seconds) for r in self.reports.values()]
        url = self.prefect_run[1] if self.prefect_run else None
        return describe_run(
            self.request, self.label, self.runner, exp_name=self.exp_name, prefect_url=url, outcomes=outcomes
        )

    # -- the parent run -------------------------------------------------------------------------------------
    def __enter__(self) -> PipelineRun:
        for line in clear_stale_copies(self.root, self._keep_progress):  # what SIGKILLed experiments left
            self.on_line(f"[asp] {line}")
        common = self.params.common
        tags = {
            "asp.kind": "pipeline",
            "asp.runner": self.runner,
            "asp.stages": ",".join(self.stages),
            "asp.preset": self.request.preset or "",
            "asp.overrides": json.dumps(dict(self.request.overrides), sort_keys=True),
            "asp.label": self.label,
        }
        if self.exp_name:
            tags["asp.dvc_exp"] = self.exp_name
        if self.prefect_run:
            os.environ[PREFECT_RUN_ENV] = self.prefect_run[0]
            if self.prefect_run[1]:
                os.environ[PREFECT_URL_ENV] = self.prefect_run[1]
        prefect = self.runner == "prefect"
        source = (self.source or ("prefect" if prefect else "asp repro"), "JOB" if prefect else "LOCAL")
        self.parent = self._stack.enter_context(
            open_tracker(
                self.name,
                experiment=common.experiment,
                tracking_uri=common.tracking_uri,
                tags=tags,
                key="pipeline",  # a new pipeline run sweeps parent runs whose process died
                description=self._description(),
                source=source,
            )
        )
        self.parent_url = run_url(self.params.orchestration.mlflow_ui, self.parent)
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        try:
            self._record_parent()
            if isinstance(exc, StageFailed) or (exc is None and self.failed):
                # a stage that failed because it was killed (SIGTERM, a timeout) makes the parent KILLED too
                killed = exc is not None and exc.timed_out or "KILLED" in nested_statuses(self.parent)
                end_run(self.parent, "KILLED" if killed else "FAILED")
                exc_type = exc = tb = None  # the status is set; the exception still propagates (returns None)
        finally:
            for snap in self._snapshots.values():
                workspace.discard(snap)
            self._snapshots.clear()
            for env in (PREFECT_RUN_ENV, PREFECT_URL_ENV):
                os.environ.pop(env, None)
            self._stack.__exit__(exc_type, exc, tb)

    def _record_parent(self) -> None:
        """Params file, resolved params and the metrics of every stage (as they are after this run)."""
        metrics: dict[str, float] = {}
        for name in stage_names(self.root / "dvc.yaml"):
            metrics.update(self._metrics_of(name))
        with contextlib.suppress(Exception):  # the parent's bookkeeping never hides the run's own outcome
            record_in_parent(self.parent, self.params, self.root / self.params_path, metrics)
            self.parent.set_tags({f"asp.stage_status.{r.stage}": r.status for r in self.reports.values()})
            self.parent.set_tags({NOTE_TAG: self._description()})  # now with what each stage did

    def env(self) -> dict[str, str]:
        """Environment of the DVC command: the parent run, the store (absolute), the Prefect run."""
        extra = {
            "MLFLOW_TRACKING_URI": _absolute_store(
                resolve_tracking_uri(self.params.common.tracking_uri, self.root), self.root
            )
        }
        if self.parent is not None and self.parent.run_id:
            extra[PARENT_ENV] = self.parent.run_id
        if self.prefect_run:
            extra[PREFECT_RUN_ENV] = self.prefect_run[0]
            extra[PREFECT_URL_ENV] = self.prefect_run[1] or ""
        return stage_env(extra)

    # -- stages -----------------------------------------------------------------------------------------------
    def timeout_s(self, name: str) -> float | None:
        return self.params.orchestration.timeout_s.get(name)

    def retry_policy(self, name: str) -> RetryPolicy:
        """The stage's retries (`orchestration.retries`; 0 for a stage it does not list), for every door alike."""
        return RetryPolicy(retries=self.params.orchestration.retries.get(name, 0))

    def run_stage_with_retries(self, name: str) -> StageReport:
        """`run_stage`, tried again after a failure as `retry_policy(name)` says; a stage stopped past its
        timeout is not retried. What `asp repro` and the Prefect stage task both call. Raises `StageFailed`."""

        def again(line: str) -> None:
            self.failed = False  # the retry decides the run's outcome
            self.on_line(f"[asp] {line}")

        try:
            return call_with_retries(
                lambda: self.run_stage(name),
                self.retry_policy(name),
                retryable=lambda exc: isinstance(exc, StageFailed) and not exc.timed_out,
                on_retry=again,
            )
        finally:  # the outputs as they were before the first attempt are kept across retries, then let go
            snap = self._snapshots.pop(name, None)
            if snap is not None:
                workspace.discard(snap)

    def run_stage(self, name: str) -> StageReport:
        """`dvc repro --single-item NAME` in the workspace (one attempt). Raises `StageFailed`.

        A stage stopped by Ctrl-C, SIGTERM or a Prefect cancellation, or past its timeout, leaves the workspace as
        it was before it started: its outputs, metrics, plots and dvc.lock are put back (`workspace.restore`)
        once its processes have ended, and `stop_note` says so; the interrupt is then re-raised. A stage that
        fails keeps DVC's outcome (its outputs deleted; a rerun rebuilds them); one whose input file (another
        stage's output) is damaged is refused before DVC starts (`UserError`), so nothing is deleted."""
        if self.request.is_experiment:
            raise UserError("a run with a preset or overrides is a DVC experiment: use run_experiment()")
        cmd = dvc_repro_cmd(name, self.request.force)
        self.on_line(f"[asp] stage {name}: {shown_cmd(cmd)}")  # the command as it runs (--force included)
        dvc_status = self._status(name)  # DVC's status, before it runs (None: DVC cannot say)
        skips = not self.request.force and dvc_status == []
        if not skips:  # DVC deletes the outputs before the stage can refuse a damaged input: check it first
            check_stage_inputs(name, self.root)
        self._changed[name] = bool(dvc_status)  # a stop keeps a changed stage's new progress (`_put_back`)
        try:
            if not skips and name not in self._snapshots:  # DVC deletes the outputs before the command runs
                self._snapshots[name] = self._take(name, dvc_status)
            result = run_streaming(
                cmd,
                env=self.env(),
                on_line=self.on_line,
                timeout_s=self.timeout_s(name),
                cwd=self.root,
            )
        except BaseException as exc:
            if not isinstance(exc, Exception):  # Ctrl-C, SIGTERM, a cancellation: DVC and the stage have ended
                self.interrupted = exc
                self._put_back(name, _stopped_by(exc))
            raise
        if result.returncode != 0 or result.timed_out:
            self.failed = True
            self.reports[name] = StageReport(name, "timeout" if result.timed_out else "failed", result.seconds)
            note = self._put_back(name, "timed out") if result.timed_out else None
            raise StageFailed(name, result.returncode, result.timed_out, note, stage_exit_code(result.lines))
        snap = self._snapshots.pop(name, None)
        if snap is not None:
            workspace.discard(snap)
        # restored from the run cache: only DVC's message says so (asp.orchestration.dvc's docstring says why)
        status: StageStatus = (
            "skipped" if skips else "restored" if classify(result.lines).get(name) == "restored" else "ran"
        )
        return self._report(name, status, result.seconds)

    def _take(self, name: str, status: list[Any] | None) -> workspace.Snapshot:
        """`workspace.take` of the stage, after removing copies that killed runs (SIGKILL) left behind. Its
        persistent outputs are kept too where they match dvc.lock (`status`: none of DVC's changed outs), i.e.
        hold the last finished run's result: a forced or changed rerun that starts afresh must not lose them when
        it is stopped. Those that differ (an interrupted attempt's resume state) keep what the stopped run adds."""
        for line in workspace.clear_stale(self.root):
            self.on_line(f"[asp] {line}")
        _, persistent = workspace.stage_outputs(name, self.root / "dvc.yaml")
        changed = changed_outputs(status) if status is not None else set(persistent)
        return workspace.take(self.root, name, persisted=[p for p in persistent if p not in changed])

    def _put_back(self, name: str, why: str) -> str | None:
        """Put the stage's outputs and dvc.lock back as they were before it started; the line says so (or what to
        run where that was impossible) and is kept in `stop_note`. None when nothing was kept (a skipped stage)."""
        self._end_stage_runs()
        snap = self._snapshots.pop(name, None)
        if snap is None:
            return None
        # A changed stage (not merely forced) started afresh: its stopped run's saved progress is what a rerun
        # resumes, so it stays; a forced rerun of an unchanged stage gets the last finished run's state back.
        keep = holds_progress if self._changed.get(name) else None
        done = workspace.restore(snap, keep_progress=keep)
        self.stop_note = f"stage '{name}' {why}: {done.message}"
        self.on_line(f"[asp] {self.stop_note}")
        return done.message

    def _end_stage_runs(self) -> None:
        """The stopped stage's MLflow run KILLED where its process could not end it (SIGKILLed past its grace
        time): its processes have ended, so a run still RUNNING under the parent never ends otherwise."""
        if self.parent is None:
            return
        with contextlib.suppress(Exception):  # bookkeeping never hides the stop itself
            for run_id in end_nested_runs(self.parent, "KILLED"):
                self.on_line(f"[asp] MLflow run {run_id}: ended KILLED (its stage process was stopped)")

    def _status(self, name: str) -> list[Any] | None:
        """`stage_status` (DVC's status of the stage: [] when up to date); None with a note when DVC cannot say
        (the command then reports the problem itself)."""
        from dvc.exceptions import DvcException

        try:
            return stage_status(self.root, name)
        except DvcException as exc:
            self.on_line(f"[asp] DVC cannot give the status of stage {name} ({exc})")
            return None

    def run_experiment(self) -> list[StageReport]:
        """`dvc exp run --temp -n NAME -S ... STAGES` (the chosen stages; DVC reruns or restores changed
        upstream stages too). Raises `StageFailed` naming the stage that was running."""
        assert self.exp_name is not None
        overrides = effective_overrides(self.request, self.root)
        copies = copy_paths(uncached_outputs(self.root / "dvc.yaml"), self.root)
        cmd = dvc_exp_cmd(self.exp_name, self.stages, overrides, self.request.force, copy_paths=copies)
        self.on_line(f"[asp] DVC experiment {self.exp_name}: {shown_cmd(cmd)}")
        timeout = sum(self.timeout_s(s) or 0 for s in stage_names(self.root / "dvc.yaml")) or None
        marks: list[tuple[float, str]] = []  # when each line arrived: a stage's time runs to the next stage's

        before = experiment_copies(self.root)
        progress = self._progress_dir(overrides)
        mark = mark_experiment(self.root, self.exp_name, progress)  # a later run removes the copy if SIGKILLed
        noted, last = False, ""

        def note(line: str) -> None:
            nonlocal noted, last
            marks.append((time.monotonic(), line))
            noted = noted or note_copy(mark, self.root, before)
            if line.startswith("ERROR:") and line == last:  # DVC's experiment executor and its CLI both print it
                return
            last = line
            self.on_line(line)

        try:
            env = {**self.env(), RESUME_ENV: str(progress)}  # a stage brings in what a stopped run kept there
            result = run_streaming(cmd, env=env, on_line=note, timeout_s=timeout, cwd=self.root)
        except BaseException as exc:
            if not isinstance(exc, Exception):  # the experiment ran in a temporary copy: the workspace is untouched
                kept = self._stopped_experiment(before, progress)  # DVC, stopped, leaves its copy (outputs included)
                self.interrupted = exc
                self.stop_note = (
                    f"DVC experiment {self.exp_name} {_stopped_by(exc)}: it ran in a temporary copy, so the "
                    "workspace is as it was (params.yaml, outputs/, dvc.lock untouched)." + kept
                )
                self.on_line(f"[asp] {self.stop_note}")
            raise
        finally:
            mark.unlink(missing_ok=True)
        if result.timed_out:
            self.on_line(
                f"[asp] DVC experiment {self.exp_name} timed out.{self._stopped_experiment(before, progress)}"
            )
        elif result.returncode == 0:
            shutil.rmtree(progress, ignore_errors=True)  # resumed and finished: nothing left to resume
        seen = classify(result.lines)  # DVC's messages: it has no structured account of an experiment's stages
        seconds = stage_seconds(marks, time.monotonic())
        if result.returncode != 0 or result.timed_out:
            self.failed = True
            failed = [s for s, st in seen.items() if st == "failed"] or [s for s, st in seen.items() if st == "ran"]
            stage = failed[-1] if failed else ",".join(self.stages)
            raise StageFailed(stage, result.returncode, result.timed_out, stage_code=stage_exit_code(result.lines))
        self.exp_ref = vcs.experiment_ref(self.exp_name, self.root)
        return [self._report(name, seen.get(name, "skipped"), seconds.get(name, 0.0)) for name in self.stages]

    def _progress_dir(self, overrides: Mapping[str, Any]) -> Path:
        """Where a stopped run of this experiment (these stages with these params) keeps its progress."""
        key = json.dumps({"stages": self.stages, "params": overrides}, sort_keys=True, default=str)
        return self.root / EXP_PROGRESS / hashlib.sha256(key.encode()).hexdigest()[:16]

    def _keep_progress(self, copy: Path, progress: Path) -> list[str]:
        """Move the persistent outputs of a stopped experiment's `copy` that hold progress to `progress`."""
        return workspace.keep_progress(copy, progress, self._persistent_outputs(), holds_progress)

    def _persistent_outputs(self) -> list[str]:
        return [p for name in stage_names(self.root / "dvc.yaml") for p in persistent_outputs(name, self.root)]

    def _stopped_experiment(self, before: set[Path], progress: Path) -> str:
        """Keep the stopped experiment's progress, remove its temporary copies; a sentence saying what was kept."""
        left = sorted(experiment_copies(self.root) - before)  # left when DVC was killed before its cleanup
        for copy in left:
            self._keep_progress(copy, progress)
        remove_experiment_copies(self.root, before)
        kept = [rel for rel in self._persistent_outputs() if (progress / rel).exists()]
        if kept:  # (a stage keeps its state itself when it is stopped: `asp.stage.keep_progress_on_stop`)
            return (
                f" Its progress ({', '.join(kept)}) is kept in {progress.relative_to(self.root)}: the same command "
                "resumes it."
            )
        if not any(persistent_outputs(name, self.root) for name in self.stages):
            return ""  # nothing these stages could resume from
        return (
            f" It kept no progress to resume (the stage moved none out, and {len(left)} temporary "
            "cop" + ("y" if len(left) == 1 else "ies") + " left held no unfinished checkpoint): the same "
            "command starts it afresh."
        )

    def _metrics_of(self, name: str) -> dict[str, float]:
        files, _ = stage_files(name, self.root / "dvc.yaml")
        out: dict[str, float] = {}
        for rel in files:
            if self.exp_ref:
                text = vcs.file_at(self.exp_ref, rel, self.root)
            else:
                path = self.root / rel
                text = path.read_text() if path.is_file() else None
            if text:
                with contextlib.suppress(ValueError, TypeError):
                    out.update(numeric_leaves(json.loads(text)))
        return out

    def _report(self, name: str, status: StageStatus, seconds: float) -> StageReport:
        """The stage's metrics and plots and the MLflow run that made its outputs: the one this run made when the
        stage ran, else the newest finished run of it made with this run's params (`find_run_made_with`: the
        outputs DVC kept or restored; in the workspace, one made outside an experiment), else the newest finished
        run of it; with the plots and tables that MLflow run logged."""
        _, plots = stage_files(name, self.root / "dvc.yaml")
        report = StageReport(name, status, seconds, self._metrics_of(name), plots, experiment=self.exp_name)
        common = self.params.common
        uri = common.tracking_uri
        parent_id = self.parent.run_id if status == "ran" and self.parent is not None else None
        workspace_only = not self.exp_name
        try:
            found = None
            if parent_id:  # it ran in this run
                found = find_stage_run(common.experiment, name, parent_run_id=parent_id, tracking_uri=uri)
            if found is None:  # up to date or restored: the run made with these params
                found = find_run_made_with(
                    common.experiment, name, self.params.model_dump(), tracking_uri=uri, workspace_only=workspace_only
                )
            if found is None:
                found = find_stage_run(common.experiment, name, workspace_only=workspace_only, tracking_uri=uri)
            if found:
                report.artifacts = run_artifacts(found["run_id"], tracking_uri=uri)
        except Exception as exc:  # a link is a convenience; the stage's outcome stands
            self.on_line(f"[asp] could not look up the MLflow run of {name}: {exc}")
            found = None
        if found:
            report.mlflow_run_id = found["run_id"]
            report.mlflow_url = run_url(self.params.orchestration.mlflow_ui, (found["experiment_id"], found["run_id"]))
        self.reports[name] = report
        return report


def run_pipeline(
    request: RunRequest,
    *,
    params_path: str | Path = "params.yaml",
    on_line: Callable[[str], None] = _print_line,
) -> list[StageReport]:
    """`asp repro`: every chosen stage through DVC under one parent run, with the configured retries.
    Raises `StageFailed` (after the retries) or `UserError`."""
    with PipelineRun(request, params_path=params_path, runner="cli", on_line=on_line) as run:
        on_line(f"[asp] run '{run.name}'" + (f": MLflow {run.parent_url}" if run.parent_url else ""))
        if request.is_experiment:
            reports = run.run_experiment()
        else:
            reports = [run.run_stage_with_retries(name) for name in run.stages]
        for r in reports:
            on_line(f"[asp] {r.stage:16s} {r.status:9s} {r.seconds:7.1f}s  {r.mlflow_url or ''}")
        if run.exp_name:
            on_line(
                f"[asp] experiment {run.exp_name}: `dvc exp show` lists it, `dvc exp apply {run.exp_name}` applies it"
            )
    return reports
