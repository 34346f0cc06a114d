"""The launch stage's drift handling (docs/drift.md): build the `DriftWatch`, re-profile and resume, hand off, report.

With ``drift.enabled`` the launch stage (`asp.pipeline.launch`) passes the watch to `run_async` as observer and
its `on_start`. When the watch stopped the session for the ``reprofile`` action:

* by default the stage re-profiles in-process (`asp.adaptation.reprofile.reprofile`, logged to the same MLflow
  run) and resumes from the checkpoint in the same process; the watch's `on_start` applies an accepted version
  (`ControlUnit.replan`); a rejected one leaves the schedule as it was (the stage says so) and the run goes on;
* with ``ASP_DRIFT_HANDOFF=1`` (set by the Prefect drift loop, `asp.orchestration.drift_loop`) it writes
  ``<state_dir>/drift_pending.json`` (the event and the step) and ends successfully with
  ``runtime/summary/finished`` 0 and ``drift/summary/handoff`` 1; the loop re-profiles and launches again, and
  that launch applies the accepted version in `on_start`.

At the end `finish` adds the ``drift/summary/...`` metrics (`asp.adaptation.summary.drift_summary`) and draws
plots/launch_drift.png (window tau and mean length per trainer step, the actions marked). A fresh run (no checkpoint
to resume) first removes an old run's drift history, pending hand-off and re-profiled predictors from the state
directory.

Run: through the launch stage (`asp stage launch` with ``drift.enabled: true``, e.g. configs/drift-demo.yaml).
Tests: `.venv/bin/python -m pytest tests/pipeline/test_drift_watch.py tests/pipeline/test_drift_e2e.py -q`.
"""

from __future__ import annotations

import math
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from asp.adaptation.predictions import Predictions
from asp.adaptation.refit import ACTION as REFIT
from asp.adaptation.refit import refit_from_run
from asp.adaptation.reprofile import reprofile
from asp.adaptation.summary import drift_summary, label_predictor_versions
from asp.adaptation.versions import VERSIONS_DIR
from asp.adaptation.watch import HISTORY_FILE, DriftWatch
from asp.config import Params
from asp.errors import UserError
from asp.io import read_json, write_json
from asp.steps.loaders import load_calibration
from asp.steps.paths import LaunchPaths
from asp.tracking import Tracker

if TYPE_CHECKING:
    from asp.control.metrics import RunSummary

HANDOFF_ENV = "ASP_DRIFT_HANDOFF"
PENDING_FILE = "drift_pending.json"
TAU_KEY = "predictor/kendall_tau"
BIAS_KEY = "predictor/bias_reference"
TAU_SE_KEY, BIAS_SE_KEY = "predictor/kendall_tau_se", "predictor/bias_reference_se"


def handoff() -> bool:
    """True when the Prefect drift loop re-profiles (``ASP_DRIFT_HANDOFF=1``), not the launch stage itself."""
    return os.environ.get(HANDOFF_ENV, "") == "1"


def reference_tau(path: Path) -> float:
    """The evaluate stage's held-out Kendall tau (`predictor/kendall_tau` in metrics/predictor.json).

    Raises:
        UserError: the file or the key is missing or not a number.
    """
    try:
        return float(read_json(path)[TAU_KEY])
    except FileNotFoundError:
        raise UserError(
            f"{path}: missing; drift.enabled needs the evaluate stage's {TAU_KEY} as the drift reference. "
            "Run `dvc repro evaluate` first, or set drift.enabled: false."
        ) from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UserError(f"{path}: cannot read {TAU_KEY} ({exc!s:.200}); re-run the evaluate stage.") from None


def references(path: Path, bias_reference: float | str) -> tuple[float, float, tuple[float, float]]:
    """(reference tau, reference bias, their standard errors) of the drift detector from metrics/predictor.json.

    `bias_reference` is ``drift.bias_reference``: "auto" reads the evaluate stage's `predictor/bias_reference` (and
    its standard error); a number is taken as given (standard error 0). A missing standard error counts as 0.

    Raises:
        UserError: the file, the tau or (auto) the bias reference missing or not a positive number.
    """
    tau = reference_tau(path)
    metrics = read_json(path)

    def se(key: str) -> float:
        value = metrics.get(key)
        return float(value) if isinstance(value, int | float) and math.isfinite(value) and value >= 0 else 0.0

    if bias_reference != "auto":
        return tau, float(bias_reference), (se(TAU_SE_KEY), 0.0)
    value = metrics.get(BIAS_KEY)
    if not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise UserError(
            f"{path}: no positive {BIAS_KEY} (found {value!r}); drift.bias_reference: auto reads it from the "
            "evaluate stage. Re-run `dvc repro evaluate`, or set drift.bias_reference to a number (e.g. 1.0)."
        )
    return tau, float(value), (se(TAU_SE_KEY), se(BIAS_SE_KEY))


def load_predictions(predictions: Path, calibration: Path) -> Predictions:
    """Predictor version 1: outputs/predictions.parquet (calibrated lengths as the schedule used them)."""
    if not predictions.is_file():
        raise UserError(f"{predictions}: missing; drift.enabled needs it. Run the predict stage first.")
    frame = pd.read_parquet(predictions)
    missing = {"prompt_id", "predicted_length"} - set(frame.columns)
    if missing:
        raise UserError(f"{predictions}: lacks column(s) {sorted(missing)}; re-run the predict stage.")
    cal = load_calibration(calibration)
    return Predictions.from_frame(frame, 1, cal if "calibrated_length" not in frame.columns else None)


def build_watch(params: Params, paths: LaunchPaths, plan: Any, directory: Path, tracker: Tracker) -> DriftWatch | None:
    """The watch of a launch run: predictions and calibration of the schedule, the evaluate stage's references.

    None, with a warning on stderr, when the predict stage's predictions or the evaluate stage's metrics are not
    there (a launch run outside the DVC pipeline, which always provides them): watching is on by default and
    needs both.

    Raises:
        UserError: unreadable predictions or references, or a scheduled prompt without a prediction.
    """
    absent_inputs = [p for p in (paths.predictions, paths.predictor_metrics) if not p.is_file()]
    if absent_inputs:
        print(
            f"[drift] the drift watch is off for this run: {', '.join(map(str, absent_inputs))} missing (it needs "
            "the predict stage's predictions and the evaluate stage's references: `dvc repro evaluate predict`; "
            "drift.enabled: false turns it off without this warning)",
            file=sys.stderr,
        )
        return None
    predictions = load_predictions(paths.predictions, paths.calibration)
    absent = [p for p in plan.prompt_ids() if p not in predictions.calibrated]
    if absent:
        raise UserError(
            f"{paths.predictions}: no prediction for {len(absent)} scheduled prompts (e.g. {absent[:3]}); the "
            "schedule and the predictions are out of step. Re-run `dvc repro schedule`."
        )
    sched = params.schedule
    balance = None
    if params.runtime.condition == "C4":
        balance = {
            "method": sched.method,
            "iterations": sched.iterations,
            "seed": params.common.seed,
            "shuffle": sched.shuffle_groups,
        }
    tau, bias, se = references(paths.predictor_metrics, params.drift.bias_reference)
    return DriftWatch(
        params.drift,
        predictions,
        reference_tau=tau,
        reference_bias=bias,
        reference_se=se,
        k=sched.k,
        tracker=tracker,
        balance=balance,
        state_dir=directory,
        prompt_ids=plan.prompt_ids(),
    )


def finished_watch(
    params: Params, paths: LaunchPaths, plan: Any, directory: Path, tracker: Tracker
) -> DriftWatch | None:
    """The watch of a run that finished but whose end-of-run work a kill cut short: built as `build_watch` does, its
    history read back from the state directory (no Control Unit: the exactly-once counts are not reported)."""
    watch = build_watch(params, paths, plan, directory, tracker)
    if watch is not None:
        watch._reset_session(watch._read_history())  # the whole history: the run finished
    return watch


def reset_fresh(directory: Path) -> None:
    """A fresh run: forget an old run's drift history, pending hand-off and re-profiled predictors."""
    (directory / HISTORY_FILE).unlink(missing_ok=True)
    (directory / PENDING_FILE).unlink(missing_ok=True)
    shutil.rmtree(directory / VERSIONS_DIR, ignore_errors=True)


def consume_pending(directory: Path) -> None:
    """A resumed launch has picked up the hand-off: the Prefect loop must not see it again."""
    (directory / PENDING_FILE).unlink(missing_ok=True)


def stopped_for_drift(watch: DriftWatch, summary: RunSummary) -> bool:
    """True when the session ended early, unfinished, because the watch asked for a re-profile."""
    return watch.stop_event is not None and bool(summary.stopped) and not summary.finished


def resume_after_drift(
    params: Params,
    paths: LaunchPaths,
    watch: DriftWatch,
    summary: RunSummary,
    tracker: Tracker,
    resume: Callable[[], RunSummary],
) -> RunSummary:
    """Re-profile in-process (from the launch's `paths`) and resume while the watch stopped the session (not in
    hand-off mode).

    Args:
        resume: runs the next session from the checkpoint (with the watch) and returns its `RunSummary`.

    Returns:
        The last session's `RunSummary`.
    """
    remake = refit_from_run if params.drift.action == REFIT else reprofile
    while (event := watch.stop_event) is not None and stopped_for_drift(watch, summary) and not handoff():
        step = summary.trainer_step
        print(f"[drift] re-profiling at step {step}: {event.message}", file=sys.stderr, flush=True)
        result = remake(params, watch.state_path(), tracker, reason=event.message, paths=paths)
        watch.record_reprofile(result, step)
        summary = resume()
    return summary


def finish(
    watch: DriftWatch, summary: RunSummary, directory: Path, plot: Path, tracker: Tracker, log: bool = True
) -> dict[str, Any]:
    """The ``drift/summary/...`` metrics (logged at the last step unless `log` is false: the launch stage logs them
    with its other end-of-run metrics); the hand-off file when the run stopped for a re-profile in hand-off mode; the
    drift plot."""
    from asp.plots import save_figure
    from asp.plots.drift import drift_figure

    metrics: dict[str, Any] = drift_summary(watch)
    label_predictor_versions(summary.minibatches, watch.rows)
    stopped = stopped_for_drift(watch, summary)
    metrics["drift/summary/handoff"] = int(stopped and handoff())
    event = watch.stop_event
    if stopped and handoff() and event is not None:
        pending = {
            "step": summary.trainer_step,
            "message": event.message,
            "window_index": event.window_index,
            "signals": list(event.signals),
            "values": event.values,
        }
        write_json(pending, directory / PENDING_FILE)
        print(f"[drift] handed off to the re-profile loop: {directory / PENDING_FILE}", file=sys.stderr)
    if log:
        tracker.log_metrics({k: float(v) for k, v in metrics.items()}, step=summary.trainer_step)
    save_figure(drift_figure(watch.rows, watch.initial_tau, watch.params.tau_drop), plot, tracker)
    return metrics
