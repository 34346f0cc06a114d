"""The launch stage's drift handling (issue 12): build the `DriftWatch`, re-profile and resume, hand off, report.

With ``drift.enabled`` the launch stage (`asp.pipeline.launch`) passes the watch to `run_async` as observer and
its `on_start`. When the watch stopped the session for the ``reprofile`` action:

* by default the stage re-profiles in-process (`asp.pipeline.reprofile.reprofile`, logged to the same MLflow
  run) and resumes from the checkpoint in the same process; the watch's `on_start` applies an accepted version
  (`ControlUnit.replan`); a rejected one leaves the schedule as it was (the stage says so) and the run goes on;
* with ``ASP_DRIFT_HANDOFF=1`` (set by the Prefect drift loop, `asp.orchestration.drift_loop`) it writes
  ``<state_dir>/drift_pending.json`` (the event and the step) and ends successfully with
  ``runtime/summary/finished`` 0 and ``drift/summary/handoff`` 1; the loop re-profiles and launches again, and
  that launch applies the accepted version in `on_start`.

At the end `finish` adds the ``drift/summary/...`` metrics (`drift_summary`: windows, events, actions, first event
step and its window tau, mean window tau after the last switch, padding and realized group-load CV before the
first / after the last switch, re-profiles and their seconds, the final predictor version, and the exactly-once
ledger: prompts lost or trained twice per `Database.trained_counts`) and draws plots/launch_drift.png (window tau
and mean length per trainer step, the actions marked). A fresh run (no checkpoint to resume) first removes an
old run's drift history, pending hand-off and re-profiled predictors from the state directory.

Run: through the launch stage (`asp stage launch` with ``drift.enabled: true``, e.g. configs/drift-demo.yaml).
Tests: `.venv/bin/python -m pytest tests/pipeline/test_drift_watch.py -q`.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable, Hashable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from asp.config import Params
from asp.errors import UserError
from asp.io import read_json, write_json
from asp.pipeline.drift_watch import HISTORY_FILE, PREDICTORS_DIR, DriftWatch, Predictions
from asp.predictor.calibration import CalibrationMap
from asp.tracking import Tracker

HANDOFF_ENV = "ASP_DRIFT_HANDOFF"
PENDING_FILE = "drift_pending.json"
TAU_KEY = "predictor/kendall_tau"
NAN = float("nan")


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


def load_predictions(predictions: Path, calibration: Path) -> Predictions:
    """Predictor version 1: outputs/predictions.parquet (calibrated lengths as the schedule used them)."""
    if not predictions.is_file():
        raise UserError(f"{predictions}: missing; drift.enabled needs it. Run the predict stage first.")
    frame = pd.read_parquet(predictions)
    missing = {"prompt_id", "predicted_length"} - set(frame.columns)
    if missing:
        raise UserError(f"{predictions}: lacks column(s) {sorted(missing)}; re-run the predict stage.")
    cal = CalibrationMap.from_dict(read_json(calibration)) if calibration.is_file() else None
    return Predictions.from_frame(frame, 1, cal if "calibrated_length" not in frame.columns else None)


def build_watch(params: Params, paths: Any, plan: Any, directory: Path, tracker: Tracker) -> DriftWatch:
    """The watch of a launch run: predictions and calibration of the schedule, the evaluate stage's tau.

    Raises:
        UserError: predictions or metrics/predictor.json missing, or a scheduled prompt without a prediction.
    """
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
    return DriftWatch(
        params.drift,
        predictions,
        reference_tau=reference_tau(paths.predictor_metrics),
        k=sched.k,
        tracker=tracker,
        balance=balance,
        state_dir=directory,
        prompt_ids=plan.prompt_ids(),
    )


def finished_watch(params: Params, paths: Any, plan: Any, directory: Path, tracker: Tracker) -> DriftWatch:
    """The watch of a run that finished but whose end-of-run work a kill cut short: built as `build_watch` does, its
    history read back from the state directory (no Control Unit: the exactly-once counts are not reported)."""
    watch = build_watch(params, paths, plan, directory, tracker)
    watch._reset_session(watch._read_history())  # the whole history: the run finished
    return watch


def reset_fresh(directory: Path) -> None:
    """A fresh run: forget an old run's drift history, pending hand-off and re-profiled predictors."""
    (directory / HISTORY_FILE).unlink(missing_ok=True)
    (directory / PENDING_FILE).unlink(missing_ok=True)
    shutil.rmtree(directory / PREDICTORS_DIR, ignore_errors=True)


def consume_pending(directory: Path) -> None:
    """A resumed launch has picked up the hand-off: the Prefect loop must not see it again."""
    (directory / PENDING_FILE).unlink(missing_ok=True)


def stopped_for_drift(watch: DriftWatch, summary: Any) -> bool:
    """True when the session ended early, unfinished, because the watch asked for a re-profile."""
    return watch.stop_event is not None and bool(summary.stopped) and not summary.finished


def resume_after_drift(
    params: Params, watch: DriftWatch, summary: Any, tracker: Tracker, resume: Callable[[], Any]
) -> Any:
    """Re-profile in-process and resume while the watch stopped the session (not in hand-off mode).

    Args:
        resume: runs the next session from the checkpoint (with the watch) and returns its `RunSummary`.

    Returns:
        The last session's `RunSummary`.
    """
    from asp.pipeline.reprofile import reprofile

    while stopped_for_drift(watch, summary) and not handoff():
        event, step = watch.stop_event, summary.trainer_step
        print(f"[drift] re-profiling at step {step}: {event.message}", file=sys.stderr, flush=True)
        result = reprofile(params, watch.state_dir, tracker, reason=event.message)
        watch.record_reprofile(result, step)
        summary = resume()
    return summary


def finish(
    watch: DriftWatch, summary: Any, directory: Path, plot: Path, tracker: Tracker, log: bool = True
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
    if stopped and handoff():
        event = watch.stop_event
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


def label_predictor_versions(records: list[dict[str, Any]], rows: list[dict[str, Any]]) -> None:
    """Add ``predictor_version`` to every minibatch record: the predictor whose schedule (``plan_version``)
    scheduled it, from the history's switch rows (plan 1 is the pipeline's predictor 1; a recalibration makes a
    new plan version with the same predictor)."""
    switches = sorted((int(r["plan_version"]), int(r["predictor_version"])) for r in rows if r["kind"] == "switch")
    for record in records:
        plan = int(record.get("plan_version", 1))
        record["predictor_version"] = max(((p, v) for p, v in switches if p <= plan), default=(1, 1))[1]


def drift_summary(watch: DriftWatch) -> dict[str, float]:
    """``drift/summary/...`` metrics over the whole run's history (see the module docstring)."""
    windows = watch.windows()
    events = [r for r in windows if r.get("event")]
    switches = [int(r["plan_version"]) for r in watch.rows if r["kind"] == "switch"]
    before = [r for r in windows if not switches or int(r["plan_version"]) < min(switches)]
    after = [r for r in windows if switches and int(r["plan_version"]) >= max(switches)]
    attempts = reprofile_attempts(watch)
    out = {
        "drift/summary/enabled": 1.0,
        "drift/summary/windows": float(len(windows)),
        "drift/summary/events": float(len(events)),
        "drift/summary/actions": float(sum(r.get("action") in ("recalibrate", "reprofile") for r in events)),
        "drift/summary/switches": float(len(switches)),
        "drift/summary/first_event_step": float(events[0]["step"]) if events else NAN,
        "drift/summary/tau_at_first_event": _num(events[0].get("drift/tau_window")) if events else NAN,
        "drift/summary/tau_after_last_switch": _mean(after, "drift/tau_window"),
        "drift/summary/padding_before_first_switch": _mean(before, "drift/padding_rate"),
        "drift/summary/padding_after_last_switch": _mean(after, "drift/padding_rate"),
        "drift/summary/group_load_cv_before_first_switch": _mean(before, "drift/group_load_cv_realized"),
        "drift/summary/group_load_cv_after_last_switch": _mean(after, "drift/group_load_cv_realized"),
        "drift/summary/reprofiles": float(len(attempts)),
        "drift/summary/reprofile_s": float(sum(r["seconds"] for r in attempts)),
        "drift/summary/reprofile_accepted": float(sum(bool(r["accepted"]) for r in attempts)),
        "drift/summary/predictor_version_final": float(watch.predictions.version),
    }
    if watch.cu is not None and watch.prompt_ids is not None:
        lost, duplicated = exactly_once(watch.cu.db, watch.prompt_ids)
        out["drift/summary/lost_prompts"], out["drift/summary/duplicated_prompts"] = float(lost), float(duplicated)
    return out


def reprofile_attempts(watch: DriftWatch) -> list[dict[str, Any]]:
    """Re-profiles of this run: the in-process ones, else the reports under <state_dir>/predictors/."""
    rows = [r for r in watch.rows if r["kind"] == "reprofile"]
    if rows or watch.state_dir is None:
        return rows
    found = []
    for path in sorted((watch.state_dir / PREDICTORS_DIR).glob("v*/report.json")):
        try:
            report = read_json(path)
            for attempt in [*report.get("rejected_attempts", []), report]:
                found.append({"accepted": bool(attempt["accepted"]), "seconds": _seconds(attempt)})
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
    return found


def exactly_once(db: Any, prompt_ids: list[Hashable]) -> tuple[int, int]:
    """(lost, duplicated) training counts of `prompt_ids` from `Database.trained_counts`.

    Every pass begun trains each prompt at most once (more is duplicated); every pass before the current one (and
    the current one once the Database is exhausted) trains each prompt exactly once (less is lost).
    """
    counts = db.trained_counts()
    begun = int(db.epochs_created)
    complete = begun if db.exhausted else begun - 1
    lost = sum(max(0, complete - counts.get(p, 0)) for p in prompt_ids)
    duplicated = sum(max(0, c - begun) for c in counts.values())
    return lost, duplicated


def _seconds(report: Mapping[str, Any]) -> float:
    """Total seconds of a re-profile report (``seconds`` as a number, or ``timings_s`` / ``seconds`` with total)."""
    for key in ("seconds", "timings_s"):
        value = report.get(key)
        if isinstance(value, int | float):
            return float(value)
        if isinstance(value, Mapping) and "total" in value:
            return float(value["total"])
    return 0.0


def _num(value: Any) -> float:
    return NAN if value is None else float(value)


def _mean(rows: list[dict[str, Any]], key: str) -> float:
    values = [float(r[key]) for r in rows if r.get(key) is not None]
    return float(np.mean(values)) if values else NAN
