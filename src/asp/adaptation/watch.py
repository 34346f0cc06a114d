"""`DriftWatch`: the launch run's length-drift watch (docs/drift.md), the Control Unit's `observer`.

For every minibatch the Control Unit ingests the first time, the watch builds a `MinibatchObservation` (the
prompts' calibrated predicted lengths, the realized lengths of all n responses, the generating policy version,
the batch group of the task that scheduled it) and feeds `asp.drift.DriftMonitor`. Every `drift.window`
minibatches it logs the window's ``drift/...`` metrics to the stage's tracker at step = the trainer step when the
window closed, appends the window to ``<state_dir>/drift_history.jsonl`` and asks `asp.drift.DriftDetector`
(reference tau: the evaluate stage's ``predictor/kendall_tau``; reference bias: ``drift.bias_reference``, by default
the evaluate stage's ``predictor/bias_reference``) whether drift is confirmed. On a `DriftEvent`:

* every event warns: an MLflow tag ``drift.event.<i>`` (the event's message), a Prefect event
  ``asp.drift.detected`` (only when ``PREFECT_API_URL`` is set; never fails the run) and a stderr line;
* the first `drift.max_actions` events also act (later ones only warn):
  ``recalibrate`` refits the calibration map on the prompts realized since the offending streak began (the
  event's `patience` windows and what came after; what came before is stale), waiting, with a warning, until
  `drift.recalibrate_min_prompts` are in; the bias reference becomes the load ratio of those prompts under maps
  cross-fitted on them (as the evaluate stage measures it), so the recalibrated stream is judged against what the
  new map achieves out of sample; it re-balances the pending minibatches (and the plan of later passes) on the new
  loads with `asp.drift.rebalance` and swaps them in with `ControlUnit.replan`. A monotone map cannot restore a
  ranking: an event whose only signal is tau is not recalibrated (it warns and says to re-profile);
  ``reprofile`` and ``refit_from_run`` call `ControlUnit.request_stop`: the session ends with a resumable
  checkpoint and launch re-profiles (`asp.adaptation.launch_drift`; refit_from_run without generation).

`on_start(cu)` (passed to `run_async`) runs after the checkpoint is restored: it keeps the history up to the
resume point (windows up to its step, switches whose plan version the checkpoint holds), rebuilds the watch's
state from it and applies an accepted re-profile newer than the one in use (`asp.adaptation.versions.
latest_accepted`) with `ControlUnit.replan`. Window metrics go to MLflow as they come (they are not held back
like the iteration metrics): a run resumed after a crash logs again the windows of the steps it repeats, at
the same steps. The detector's streak and cooldown start afresh in every session.

`asp.adaptation.summary.drift_summary` turns the history into the ``drift/summary/...`` metrics of
metrics/launch.json; `asp.plots.drift.drift_figure` draws it.

Run the tests: `.venv/bin/python -m pytest tests/pipeline/test_drift_watch.py -q`.
"""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Hashable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from asp.adaptation.predictions import Predictions
from asp.adaptation.versions import VERSIONS_DIR, latest_accepted
from asp.config import DriftParams
from asp.drift import DriftDetector, DriftEvent, DriftMonitor, MinibatchObservation
from asp.drift.monitor import bias
from asp.drift.rebalance import rebalance
from asp.drift.reference import load_ratio_se
from asp.io import atomic_path, read_json, read_json_lines
from asp.predictor.calibration import CALIBRATION_FOLDS, CalibrationMap, cross_fit_calibration, fit_calibration
from asp.runtime import WorkPlan
from asp.tracking import Tracker

HISTORY_FILE = "drift_history.jsonl"
REPROFILE_ACTIONS = ("reprofile", "refit_from_run")  # stop at a checkpoint, make a new predictor version, resume
ACTING = ("recalibrate", *REPROFILE_ACTIONS)  # the actions drift.max_actions counts


def group_key(db: Any, task_id: int) -> tuple | None:
    """A key unique to the batch group (of its pass and plan version) that scheduled task `task_id`."""
    task = db.tasks.get(task_id)
    if task is None:
        return None
    rest, full = db.plans[task.version]
    plan = rest if task.rest else full
    return task.epoch, task.version, task.rest, plan.group_ids[task.rank]


class DriftWatch:
    """The Control Unit's observer that monitors length drift and acts on it (see the module docstring).

    Args:
        drift: the ``drift:`` params.
        predictions: the predictions the schedule was built on (predictor version 1).
        reference_tau: the evaluate stage's held-out Kendall tau (None disables the tau signal).
        reference_bias: the load ratio that counts as calibrated (the evaluate stage's ``predictor/bias_reference``
            or ``drift.bias_reference``).
        reference_se: standard errors of (reference_tau, log reference_bias) (`asp.drift.reference`).
        k: minibatches per batch group (``schedule.k``).
        tracker: the stage's tracker.
        balance: keyword arguments of `rebalance` (method, seed, shuffle, iterations) for ``recalibrate``; None
            keeps the order of a condition that is not balanced (C0-C3): the calibration is refitted only.
        state_dir: the run's state directory (history file, re-profiled predictors); None keeps nothing on disk.
        prompt_ids: the run's prompts (the exactly-once ledger); None skips the ledger.
    """

    def __init__(
        self,
        drift: DriftParams,
        predictions: Predictions,
        *,
        reference_tau: float | None,
        reference_bias: float = 1.0,
        reference_se: tuple[float, float] = (0.0, 0.0),
        k: int,
        tracker: Tracker,
        balance: Mapping[str, Any] | None = None,
        state_dir: Path | None = None,
        prompt_ids: list[Hashable] | None = None,
    ) -> None:
        self.params, self.initial, self.k, self.tracker = drift, predictions, k, tracker
        self.initial_tau, self.initial_bias, self.initial_se = reference_tau, reference_bias, reference_se
        self.balance = dict(balance) if balance is not None else None
        self.state_dir, self.prompt_ids = state_dir, prompt_ids
        self.monitor = DriftMonitor(drift.window, group_size=k)
        self.cu: Any = None
        self.rows: list[dict[str, Any]] = []
        self._reset_session([])

    # ---- state ---------------------------------------------------------------------------------------------------
    def _reset_session(self, rows: list[dict[str, Any]]) -> None:
        """Rebuild the watch's state from history rows (the ones a resumed checkpoint covers)."""
        self.rows = rows
        self.predictions, self.reference_tau = self.initial, self.initial_tau
        self.reference_bias, self.reference_se = self.initial_bias, self.initial_se
        for row in (r for r in rows if r["kind"] == "switch"):
            self._apply_switch_row(row)
        p = self.params
        self.detector = DriftDetector(
            self.reference_tau,
            reference_bias=self.reference_bias,
            reference_tau_se=self.reference_se[0],
            reference_bias_se=self.reference_se[1],
            min_prompts=p.min_prompts,
            tau_drop=p.tau_drop,
            bias_tolerance=p.bias_tolerance,
            trend=p.trend,
            trend_min_r2=p.trend_min_r2,
            patience=p.patience,
            cooldown=p.cooldown,
            action=p.action,
        )
        self.monitor.reset()
        self.monitor.windows_emitted = sum(r["kind"] == "window" for r in rows)
        windows = [r for r in rows if r["kind"] == "window"]
        self.events = sum(bool(r.get("event")) for r in windows)
        self.actions = sum(r.get("action") in ACTING for r in windows)
        self.seen: list[tuple[np.ndarray, np.ndarray]] = []  # (raw, realized mean) since the last switch
        self.window_ends: list[int] = []  # len(self.seen) when each window since the last switch closed
        self.refit_from = 0  # self.seen[refit_from:] are the prompts a recalibration fits on
        self.waiting: DriftEvent | None = None  # a recalibration waiting for enough realized prompts
        self.waiting_refit: DriftEvent | None = None  # a refit_from_run waiting for enough recorded lengths
        self.stop_event: DriftEvent | None = None
        self.groups: dict[tuple, int] = {}

    def state_path(self) -> Path:
        """The run's state directory; RuntimeError for a watch that keeps nothing on disk (re-profiled predictors
        live there, so re-profiling needs one)."""
        if self.state_dir is None:
            raise RuntimeError("this drift watch keeps no state directory: it cannot re-profile or switch predictors")
        return self.state_dir

    def _apply_switch_row(self, row: Mapping[str, Any]) -> None:
        if row["action"] == "reprofile":
            directory = self.state_path() / VERSIONS_DIR / f"v{int(row['predictor_version'])}"
            cal = read_json(directory / "calibration.json")
            frame = pd.read_parquet(directory / "predictions.parquet")
            self.predictions = Predictions.from_frame(
                frame, int(row["predictor_version"]), CalibrationMap.from_dict(cal)
            )
            tau = row.get("reference_tau")
            self.reference_tau = self.reference_tau if tau is None else float(tau)
        else:
            self.predictions = self.predictions.recalibrated(CalibrationMap.from_dict(row["calibration"]))
        if row.get("reference_bias") is not None:
            self.reference_bias = float(row["reference_bias"])
            self.reference_se = (self.reference_se[0], float(row.get("reference_bias_se") or 0.0))

    def _append(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        if self.state_dir is not None:
            self.state_dir.mkdir(parents=True, exist_ok=True)
            with (self.state_dir / HISTORY_FILE).open("a") as fh:
                fh.write(json.dumps(row) + "\n")

    def _read_history(self) -> list[dict[str, Any]]:
        if self.state_dir is None:
            return []
        return [row for row in read_json_lines(self.state_dir / HISTORY_FILE) if "kind" in row]

    # ---- hooks of the Control Unit ------------------------------------------------------------------------------
    def on_start(self, cu: Any) -> None:
        """`run_async`'s on_start: keep the history the restored checkpoint covers, rebuild the state from it and
        apply an accepted re-profile newer than the predictor in use."""
        self.cu = cu
        version = cu.db.plan_version()
        kept = [
            r
            for r in self._read_history()
            if (r["kind"] == "switch" and int(r["plan_version"]) <= version)
            or (r["kind"] != "switch" and int(r["step"]) <= cu.step)
        ]
        if self.state_dir is not None:
            self.state_dir.mkdir(parents=True, exist_ok=True)
            with atomic_path(self.state_dir / HISTORY_FILE) as tmp:
                tmp.write_text("".join(json.dumps(r) + "\n" for r in kept))
        self._reset_session(kept)
        self._apply_accepted(cu)

    def _apply_accepted(self, cu: Any) -> None:
        if self.state_dir is None:
            return
        found = latest_accepted(self.state_dir)
        if found is None or int(found[0]) <= self.predictions.version:
            return
        version, rest, full, frame, calibration = found
        try:
            plan_version = cu.replan(rest, full)
        except ValueError as exc:  # the remaining prompts moved on since the re-profile: re-balance them instead
            self._say(f"re-profile v{version}: its plan does not fit the remaining prompts ({exc}); re-balancing")
            loads = Predictions.from_frame(frame, int(version), calibration).calibrated
            plan_version = self._replan(cu, loads, full)
        row = {
            "kind": "switch",
            "action": "reprofile",
            "step": cu.step,
            "plan_version": plan_version,
            "predictor_version": int(version),
            "reference_tau": self._reprofile_tau(int(version)),
            "reference_bias": self._reprofile_report(int(version)).get("bias_reference"),
            "reference_bias_se": self._reprofile_report(int(version)).get("bias_reference_se"),
        }
        self._apply_switch_row(row)
        self.detector.reference_tau = self.reference_tau
        self.detector.reference_bias, self.detector.reference_bias_se = self.reference_bias, self.reference_se[1]
        self._append(row)
        self._say(f"applied re-profiled predictor v{version} (plan version {plan_version}) at step {cu.step}")

    def _reprofile_report(self, version: int) -> dict[str, Any]:
        try:
            report = read_json(self.state_path() / VERSIONS_DIR / f"v{version}" / "report.json")
        except (OSError, ValueError):
            return {}
        return report if isinstance(report, dict) else {}

    def _reprofile_tau(self, version: int) -> float | None:
        try:
            return float(self._reprofile_report(version)["kendall_tau"])
        except (KeyError, ValueError, TypeError):
            return self.reference_tau

    def __call__(self, cu: Any, out: Any) -> None:
        """The observer: one first-time ingested `MinibatchOutput`."""
        self.cu = cu
        obs = self.observation(cu.db, out)
        self.seen.append((np.array([self.predictions.raw[p] for p in obs.prompt_ids]), obs.realized_mean))
        metrics = self.monitor.add(obs)
        if metrics is None:
            return
        self.window_ends.append(len(self.seen))
        row: dict[str, Any] = {
            "kind": "window",
            "step": cu.step,
            "plan_version": cu.db.plan_version(),
            "predictor_version": self.predictions.version,
            **{k: (None if math.isnan(v) else v) for k, v in metrics.items()},
        }
        if self.waiting is not None and self._recalibrate(cu, self.waiting):
            self.waiting = None
        if self.waiting_refit is not None and self._refit_ready(cu, say=False):
            self._stop(cu, self.waiting_refit)
            self.waiting_refit = None
        event = self.detector.update(metrics)
        if event is not None:
            self._on_event(cu, event, row)
        logged = {
            **metrics,
            "drift/plan_version": row["plan_version"],
            "drift/predictor_version": row["predictor_version"],
        }
        self.tracker.log_metrics({**logged, "drift/event": float(event is not None)}, step=cu.step)
        self._append(row)

    def observation(self, db: Any, out: Any) -> MinibatchObservation:
        """The monitor's view of one `MinibatchOutput` (calibrated predictions of the predictor in use)."""
        ids = list(out.prompt_ids)
        key = group_key(db, out.task_id)
        group = None if key is None else self.groups.setdefault(key, len(self.groups))
        return MinibatchObservation(
            ids,
            np.array([self.predictions.calibrated[p] for p in ids], dtype=np.float64),
            np.asarray(out.lengths, dtype=np.float64).reshape(len(ids), int(out.n)),
            int(out.policy_version),
            group_id=group,
            padding_rate=float(out.padding_rate),
        )

    # ---- actions ------------------------------------------------------------------------------------------------
    def _on_event(self, cu: Any, event: DriftEvent, row: dict[str, Any]) -> None:
        self.events += 1
        action = event.action
        message = event.message
        if action != "warn" and (
            self.actions >= self.params.max_actions or self.stop_event is not None or self.waiting_refit is not None
        ):
            action = "warn"
            message += f" Only warning: drift.max_actions ({self.params.max_actions}) used or a stop is pending."
        if action == "recalibrate" and event.signals == ("tau",):
            action = "warn"
            message += (
                " Only warning: the ranking dropped and a recalibration (a monotone map) cannot restore it; "
                "set drift.action: reprofile or refit_from_run to re-train the predictor on the current policy."
            )
        row.update(event=message, signals=",".join(event.signals), action=action)
        self.warn(message, cu.step)
        if action == "recalibrate":
            self.actions += 1
            streak_start = len(self.window_ends) - event.streak - 1
            self.refit_from = self.window_ends[streak_start] if streak_start >= 0 else 0
            if not self._recalibrate(cu, event):
                self.waiting = event
        elif action in REPROFILE_ACTIONS:
            self.actions += 1
            if action == "refit_from_run" and not self._refit_ready(cu, say=True):
                self.waiting_refit = event
            else:
                self._stop(cu, event)

    def _stop(self, cu: Any, event: DriftEvent) -> None:
        """Stop the session at the next checkpoint for a re-profile (`asp.adaptation.launch_drift`)."""
        self.stop_event = event
        cu.request_stop(event.message)

    def _refit_ready(self, cu: Any, *, say: bool) -> bool:
        """Whether the run has recorded the realized lengths of `drift.refit_min_prompts` prompts (the Database's
        `runtime.history`), so that a stop now gives `refit_from_run` enough to fine-tune on; says so when not."""
        recorded, need = len(getattr(cu.db, "history", ())), self.params.refit_min_prompts
        if recorded < need and say:
            self._say(f"refit_from_run waits: {recorded} prompts have realized lengths, {need} needed")
        return recorded >= need

    def warn(self, message: str, step: int) -> None:
        """MLflow tag ``drift.event.<i>``, Prefect event ``asp.drift.detected`` (if a server is set), stderr."""
        self.tracker.set_tags({f"drift.event.{self.events}": message[:5000]})
        self._say(f"step {step}: {message}")
        emit_prefect_event("asp.drift.detected", {"message": message, "step": step, "event": self.events})

    def _recalibrate(self, cu: Any, event: DriftEvent) -> bool:
        """Refit the calibration on the prompts realized since the streak began and re-balance the pending work;
        False (with a warning) while fewer than `drift.recalibrate_min_prompts` are in."""
        seen = self.seen[self.refit_from :]
        raw = np.concatenate([r for r, _ in seen]) if seen else np.zeros(0)
        need = self.params.recalibrate_min_prompts
        if raw.size < need:
            self._say(f"recalibrate waits: {raw.size} prompts realized since the drift began, {need} needed")
            return False
        realized = np.concatenate([m for _, m in seen])
        calibration = fit_calibration(raw, realized)
        out_of_fold = cross_fit_calibration(raw, realized, min(CALIBRATION_FOLDS, raw.size))
        reference, reference_se = bias(out_of_fold, realized), load_ratio_se(out_of_fold, realized)
        reference_se = reference_se if math.isfinite(reference_se) else 0.0
        new = self.predictions.recalibrated(calibration)
        plan_version = self._replan(cu, new.calibrated, None)
        row = {
            "kind": "switch",
            "action": "recalibrate",
            "step": cu.step,
            "plan_version": plan_version,
            "predictor_version": new.version,
            "prompts": int(raw.size),
            "calibration": calibration.to_dict(),
            "reference_bias": reference,
            "reference_bias_se": reference_se,
        }
        self.predictions, self.reference_bias = new, reference
        self.reference_se = (self.reference_se[0], reference_se)
        self.detector.reference_bias, self.detector.reference_bias_se = reference, reference_se
        self._append(row)
        self._after_switch()
        self._say(f"recalibrated on {raw.size} realized prompts at step {cu.step} (plan version {plan_version})")
        return True

    def _replan(self, cu: Any, loads: Mapping[Hashable, float], full: Any) -> int:
        """Re-balance the pending minibatches (and, without `full`, the plan of later passes) on `loads`; swap
        them in. Returns the plan version in use afterwards (unchanged when nothing is re-balanced)."""
        pending = cu.db.pending_plan()
        if self.balance is None or pending is None:
            return cu.db.plan_version()
        ids = {tuple(mb): i for mb, i in zip(pending.minibatches, pending.minibatch_ids, strict=True)}
        ordered, groups = rebalance(pending.minibatches, loads, self.k, **self.balance)
        rest = WorkPlan.from_lists(ordered, groups, [ids[tuple(mb)] for mb in ordered], _loads_of(ordered, loads))
        if full is None:
            plan = cu.db.plan
            mb_ids = {tuple(mb): i for mb, i in zip(plan.minibatches, plan.minibatch_ids, strict=True)}
            ordered, groups = rebalance(plan.minibatches, loads, self.k, **self.balance)
            full = WorkPlan.from_lists(
                ordered, groups, [mb_ids[tuple(mb)] for mb in ordered], _loads_of(ordered, loads)
            )
        return cu.replan(rest, full)

    def _after_switch(self) -> None:
        self.monitor.reset()
        self.seen, self.window_ends, self.refit_from = [], [], 0
        self.detector.streak = 0

    def record_reprofile(self, result: Any, step: int) -> None:
        """Note a re-profile launch ran in-process after this watch stopped the session (`ReprofileResult`)."""
        row = {
            "kind": "reprofile",
            "step": step,
            "accepted": bool(result.accepted),
            "version": int(result.version),
            "tau": float(result.tau),
            "seconds": float(result.seconds),
            "message": str(result.message),
        }
        self._append(row)
        if not result.accepted:
            self._say(f"re-profile v{result.version} rejected ({result.message}); keeping the current schedule")

    def _say(self, text: str) -> None:
        print(f"[drift] {text}", file=sys.stderr, flush=True)

    # ---- results ------------------------------------------------------------------------------------------------
    def windows(self) -> list[dict[str, Any]]:
        """The history's window rows (``drift/...`` metrics, step, plan and predictor version, event, action)."""
        return [r for r in self.rows if r["kind"] == "window"]


def emit_prefect_event(name: str, payload: Mapping[str, Any]) -> None:
    """Emit a Prefect event when a Prefect server is configured (PREFECT_API_URL); never raises."""
    if not os.environ.get("PREFECT_API_URL"):
        return
    try:
        from prefect.events import emit_event

        emit_event(event=name, resource={"prefect.resource.id": "asp.launch"}, payload=dict(payload))
    except Exception as exc:  # a missing or unreachable Prefect never fails the run
        print(f"[drift] Prefect event {name} not sent: {exc}", file=sys.stderr)


def _loads_of(minibatches: Any, loads: Mapping[Hashable, float]) -> dict[Hashable, float]:
    """The loads a re-plan balanced on, for its prompts (the online continuation order reads them)."""
    return {pid: float(loads[pid]) for mb in minibatches for pid in mb if pid in loads}
