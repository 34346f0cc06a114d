"""The run log: what a checkpointed run did, kept beside its runtime checkpoint, so that a run resumed after a crash
(or killed between its last step and the end of its caller's work) still reports, logs and writes the whole run.

``<checkpoint_dir>/run_log.jsonl`` is append-only, one JSON object per line (a line cut short by a kill is skipped):

* ``{"kind": "segment", "step": s, ...}``: written by the Control Unit right *before* it saves the position of step
  ``s``: the metrics of the steps since the previous segment (``iterations``), the minibatch records ingested since
  (``records``), the Training Queue depth changes since (``trace``: ``[time, depth in prompts]``), the run's
  cumulative counters (``totals``) and, in the segment of the finished position, the run's ``summary``;
* ``{"kind": "logged", "step": s}``: the iteration metrics of every step up to ``s`` reached the logger;
* ``{"kind": "summary_logged", "step": s}``: the run's summary metrics reached the logger;
* ``{"kind": "note", "step": s, "name": ..., "data": ...}``: a result of the caller's end-of-run work kept so that a
  rerun need not compute it again (the launch stage: the held-out reward);
* ``{"kind": "closed", "step": s}``: the caller finished its own end-of-run work (the launch stage: outputs written).

Times in records and traces are *run time*: seconds over the run's sessions, each resumed session starting where the
position it resumed from ended (a killed session's time after its last position, and the time between sessions,
are not counted). `RunLog.restore` keeps what the resumed position covers (dropping the records of minibatches of
which nothing was trained by then: they are generated again) and says which steps' metrics may not have been
logged yet; `RunLog.read` reads without rewriting (a finished run). Pure Python; tests: tests/runtime/test_runlog.py.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FILENAME = "run_log.jsonl"


@dataclass(slots=True)
class RunHistory:
    """The run up to a position, from the run log (empty for a fresh run).

    Attributes:
        iterations: ``{"step": k, **metrics}`` per step up to the position, in step order.
        records: minibatch records (run time), in the order they were ingested.
        trace: ``(run time, depth in prompts)`` of the Training Queue.
        totals: the run's cumulative counters at the position (``prompts_trained``, ``wall_s``, ``sessions``, ...).
        unlogged: ``(step, metrics)`` of the steps whose metrics may not have reached the logger.
        summary: the finished position's summary (``metrics``, ``trainer_step``, ...); None before the end.
        summary_logged: whether the summary metrics reached the logger.
        closed: whether the caller marked the run closed (`RunLog.mark` ``"closed"``).
        notes: the caller's notes by name (`RunLog.note`), the newest of each.
    """

    iterations: list[dict[str, Any]] = field(default_factory=list)
    records: list[dict[str, Any]] = field(default_factory=list)
    trace: list[tuple[float, float]] = field(default_factory=list)
    totals: dict[str, float] = field(default_factory=dict)
    unlogged: list[tuple[int, dict[str, float]]] = field(default_factory=list)
    summary: dict[str, Any] | None = None
    summary_logged: bool = False
    closed: bool = False
    notes: dict[str, Any] = field(default_factory=dict)


def _number(value: Any) -> Any:
    """numpy scalars and arrays as Python values (json's `default`)."""
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


class RunLog:
    """Reads and appends ``<directory>/run_log.jsonl`` (see the module docstring)."""

    def __init__(self, directory: str | Path) -> None:
        self.path = Path(directory) / FILENAME

    def reset(self) -> None:
        """Forget every earlier run (a fresh run)."""
        self.path.unlink(missing_ok=True)

    def append(self, entry: Mapping[str, Any]) -> None:
        """Append one line (what a kill cuts short is skipped by the reader)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as fh:
            fh.write(json.dumps(dict(entry), default=_number) + "\n")

    def mark(self, kind: str, step: int) -> None:
        """Append a ``logged`` / ``summary_logged`` / ``closed`` line for `step`."""
        self.append({"kind": kind, "step": int(step)})

    def note(self, name: str, step: int, data: Any) -> None:
        """Keep `data` (JSON-able) under `name` for a rerun (see `RunHistory.notes`)."""
        self.append({"kind": "note", "step": int(step), "name": name, "data": data})

    def lines(self) -> list[dict[str, Any]]:
        """Every complete line, in order."""
        from asp.io import read_json_lines  # imports pandas: keep it out of the actor processes

        return [e for e in read_json_lines(self.path) if "kind" in e and "step" in e]

    def read(self, upto: int) -> RunHistory:
        """The run up to the position of step `upto` (lines about later steps belong to an abandoned attempt)."""
        return history_of([e for e in self.lines() if int(e["step"]) <= upto], upto)

    def restore(self, upto: int, consumed: Mapping[str, int]) -> RunHistory:
        """`read`, minus the records of tasks with nothing trained at `upto` (`consumed`: task id -> trained prompts,
        as in the checkpoint's Database state); the file is rewritten to the lines kept."""
        kept = [e for e in self.lines() if int(e["step"]) <= upto and e["kind"] != "closed"]
        for entry in kept:
            if entry["kind"] == "segment":
                entry["records"] = [r for r in entry.get("records", []) if int(consumed.get(str(r["task_id"]), 0))]
        from asp.io import atomic_path  # imports pandas: keep it out of the actor processes

        self.path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(self.path) as tmp:
            tmp.write_text("".join(json.dumps(e, default=_number) + "\n" for e in kept))
        return history_of(kept, upto)


def history_of(entries: list[dict[str, Any]], upto: int) -> RunHistory:
    """Fold run-log lines (all about steps <= `upto`) into a `RunHistory`."""
    history = RunHistory()
    rows: dict[int, dict[str, Any]] = {}
    logged = 0
    for entry in entries:
        kind = entry["kind"]
        if kind == "segment":
            for row in entry.get("iterations", []):
                rows[int(row["step"])] = row
            history.records.extend(entry.get("records", []))
            history.trace.extend((float(t), float(d)) for t, d in entry.get("trace", []))
            history.totals = dict(entry.get("totals", history.totals))
            history.summary = entry.get("summary", history.summary)
        elif kind == "logged":
            logged = max(logged, int(entry["step"]))
        elif kind == "summary_logged":
            history.summary_logged = True
        elif kind == "closed":
            history.closed = True
        elif kind == "note":
            history.notes[str(entry.get("name"))] = entry.get("data")
    history.iterations = [rows[s] for s in sorted(rows)]
    history.unlogged = [
        (s, {k: v for k, v in rows[s].items() if k != "step"}) for s in sorted(rows) if logged < s <= upto
    ]
    return history
