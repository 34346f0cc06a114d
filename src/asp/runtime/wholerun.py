"""The Control Unit's book-keeping of the whole run across sessions: resume from the run log, the run-log segment
written before each position, and the whole-run `RunSummary`.

A resumed session starts from what `asp.runtime.runlog` says about its position (`resume`): the earlier sessions'
steps, minibatch records, queue-depth trace and counters go to the core (`asp.control.core.ControlCore`'s
``earlier_*``, ``session`` and ``base``), which stamps this session's times in *run time* (seconds over the run's
sessions, this one starting where the resumed position ended) and keeps the cumulative counters; every position
saved appends a `segment` first, and `summary` covers earlier sessions and this one. Functions of a `ControlUnit`
(``cu``); pure Python. Tests: tests/runtime/test_runtime.py (Ctrl-C + resume), tests/runtime/test_runlog.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from asp.control.metrics import RunSummary
from asp.runtime.runlog import RunHistory

if TYPE_CHECKING:
    from asp.runtime.control import ControlUnit


def resume(cu: ControlUnit, history: RunHistory) -> None:
    """Continue the run `history` describes (from the run log at the restored position): its counters, records,
    queue trace and steps; the steps whose metrics a kill kept from the logger are logged now."""
    core = cu.core
    cu.earlier = history
    core.session = int(history.totals.get("sessions", 0))
    core.base = float(history.totals.get("wall_s", 0.0))
    core.earlier_totals = dict(history.totals)
    core.earlier_records, core.earlier_iterations = history.records, history.iterations
    core.earlier_trace = history.trace
    if history.trace:
        history.trace.append((core.base, 0.0))  # the queue is empty when the session starts
    for record in history.records:
        core.by_gu[int(record["gu"])] += int(record["prompts"])
        core.by_actor[int(record["actor"])] = core.by_actor.get(int(record["actor"]), 0) + int(record["prompts"])
    core.lag_max = float(history.totals.get("lag_max", float("nan")))
    if cu.logger is not None:
        for step, metrics in history.unlogged:
            cu.logger.log_metrics(metrics, step=step)
    if history.unlogged and cu.runlog is not None:
        cu.runlog.mark("logged", cu.step)


def segment(cu: ControlUnit, finished: bool) -> dict[str, Any]:
    """The run-log line written before the position of the current step is saved (see `asp.runtime.runlog`)."""
    core = cu.core
    records, trace = cu.flushed
    cu.flushed = (len(core.records), len(core.tq.trace))
    entry: dict[str, Any] = {
        "kind": "segment",
        "step": cu.step,
        "session": core.session,
        "iterations": [{"step": step, **metrics} for step, metrics in cu.unlogged],
        "records": core.records[records:],
        "trace": [(core.run_time(t), d) for t, d in core.tq.trace[trace:]],
        "totals": core.totals(),
    }
    if finished:
        entry["summary"] = summary(cu).to_record()
    return entry


def summary(cu: ControlUnit) -> RunSummary:
    """The summary of the whole run: earlier sessions (from the run log) and this one."""
    core = cu.core
    return RunSummary(
        metrics=core.summary_metrics(),
        iterations=core.all_iterations(),
        minibatches=core.all_records(),
        events=core.events,
        trainer_step=cu.step,
        policy_version=cu.version,
        resumed_from_step=cu.start_step,
        resume_reason=cu.resume_reason,
        finished=cu.finished(),
        checkpoint_path=str(cu.checkpointer.path) if cu.checkpointer else None,
        stopped=cu.stop_reason,
    )
