"""The ``drift/summary/...`` metrics of a launch run's drift history (metrics/launch.json), and the predictor
version of every minibatch record.

`drift_summary`: windows, events, actions, first event step and its window tau, mean window tau after the last
switch, padding and realized group-load CV before the first / after the last switch, re-profiles and their seconds,
the final predictor version, and the exactly-once ledger (prompts lost or trained twice per
`Database.trained_counts`).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Any

import numpy as np

from asp.adaptation.versions import VERSIONS_DIR
from asp.adaptation.watch import ACTING, DriftWatch
from asp.io import read_json

NAN = float("nan")


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
        "drift/summary/actions": float(sum(r.get("action") in ACTING for r in events)),
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
    for path in sorted((watch.state_dir / VERSIONS_DIR).glob("v*/report.json")):
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
