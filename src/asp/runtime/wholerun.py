"""The Control Unit's book-keeping of the whole run across sessions: resume from the run log, run time, cumulative
counters, the run-log segment written before each position, and the whole-run `RunSummary`.

A resumed session starts from what `asp.runtime.runlog` says about its position (`resume`): the earlier sessions'
steps, minibatch records, queue-depth trace and counters. Its own times are turned into *run time* (`run_time`:
seconds over the run's sessions, this one starting where the resumed position ended), every position saved appends a
`segment` first, and `summary` covers earlier sessions and this one. Functions of a `ControlUnit` (``cu``); pure
Python. Tests: tests/runtime/test_runtime.py (Ctrl-C + resume), tests/runtime/test_runlog.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from asp.runtime.metrics import RunSummary, comparison_summary, summary_metrics
from asp.runtime.runlog import RunHistory

if TYPE_CHECKING:
    from asp.runtime.control import ControlUnit


def resume(cu: ControlUnit, history: RunHistory) -> None:
    """Continue the run `history` describes (from the run log at the restored position): its counters, records,
    queue trace and steps; the steps whose metrics a kill kept from the logger are logged now."""
    cu.earlier = history
    cu.session = int(history.totals.get("sessions", 0))
    cu.base_wall = float(history.totals.get("wall_s", 0.0))
    if history.trace:
        history.trace.append((cu.base_wall, 0.0))  # the queue is empty when the session starts
    for record in history.records:
        cu.by_gu[int(record["gu"])] += int(record["prompts"])
        cu.by_actor[int(record["actor"])] = cu.by_actor.get(int(record["actor"]), 0) + int(record["prompts"])
    cu.lag_max = float(history.totals.get("lag_max", float("nan")))
    if cu.logger is not None:
        for step, metrics in history.unlogged:
            cu.logger.log_metrics(metrics, step=step)
    if history.unlogged and cu.runlog is not None:
        cu.runlog.mark("logged", cu.step)


def total(cu: ControlUnit, name: str, session_value: float) -> float:
    """A counter over the whole run: the earlier sessions' (at the resumed position) plus this session's."""
    return float(cu.earlier.totals.get(name, 0.0)) + float(session_value)


def run_time(cu: ControlUnit, t: float) -> float:
    """A time of this session (time.time()) in run time."""
    return t - cu.t0 + cu.base_wall


def totals(cu: ControlUnit) -> dict[str, float]:
    """The run's cumulative counters (earlier sessions up to the resumed position, plus this one)."""
    session_wall = cu.last_step_end - cu.t0 if cu.last_step_end is not None else 0.0
    counters = {
        "prompts_trained": cu.prompts_trained,
        "failed_attempts": cu.db.failed_attempts,
        "duplicates": cu.db.duplicates,
        "pauses": cu.bp.pauses,
        "dead_actors": cu.dead_actors,
        "stale_dropped": cu.stale_dropped,
        "stale_regenerated": cu.stale_regenerated,
        "reload_failures": cu.reload_failures,
        "lag_sum": cu.lag_sum,
        "lag_count": cu.lag_count,
    }
    out = {name: total(cu, name, value) for name, value in counters.items()}
    out.update(sessions=float(cu.session + 1), wall_s=cu.base_wall + session_wall, lag_max=cu.lag_max)
    return out


def segment(cu: ControlUnit, finished: bool) -> dict[str, Any]:
    """The run-log line written before the position of the current step is saved (see `asp.runtime.runlog`)."""
    records, trace = cu.flushed
    cu.flushed = (len(cu.records), len(cu.tq.trace))
    entry: dict[str, Any] = {
        "kind": "segment",
        "step": cu.step,
        "session": cu.session,
        "iterations": [{"step": step, **metrics} for step, metrics in cu.unlogged],
        "records": cu.records[records:],
        "trace": [(run_time(cu, t), d) for t, d in cu.tq.trace[trace:]],
        "totals": totals(cu),
    }
    if finished:
        entry["summary"] = summary(cu).to_record()
    return entry


def lag_counters(cu: ControlUnit) -> dict[str, float]:
    """The stale-sample and reload counters of the per-iteration metrics, cumulative over the whole run."""
    return {
        "runtime/stale_dropped_prompts": total(cu, "stale_dropped", cu.stale_dropped),
        "runtime/stale_regenerated_prompts": total(cu, "stale_regenerated", cu.stale_regenerated),
        "runtime/reload_failures": total(cu, "reload_failures", cu.reload_failures),
    }


def summary(cu: ControlUnit) -> RunSummary:
    """The summary of the whole run: earlier sessions (from the run log) and this one."""
    counts = totals(cu)
    wall = counts["wall_s"]
    records = cu.earlier.records + cu.records
    iterations = cu.earlier.iterations + cu.iterations
    trace = cu.earlier.trace + [(run_time(cu, t), d) for t, d in cu.tq.trace]
    base = summary_metrics(
        [it["runtime/iteration_time_s"] for it in iterations],
        trace,
        [r["depth_at_arrival_batches"] for r in records],
        [r["gen_s"] for r in records],
        [r["padding_rate"] for r in records],
        cu.by_actor,
        n_samples=cu.config.n_samples,
        tokens=sum(int(r["tokens"]) for r in records),
        wall_s=wall,
        end=run_time(cu, cu.last_step_end) if cu.last_step_end is not None else None,
    )
    base.update(
        {
            "runtime/minibatches": float(len(records)),
            "runtime/prompts_trained": counts["prompts_trained"],
            "runtime/failed_attempts": counts["failed_attempts"],
            "runtime/duplicates_dropped": counts["duplicates"],
            "runtime/pauses": counts["pauses"],
            "runtime/dead_actors": counts["dead_actors"],
            **lag_counters(cu),
            **comparison_summary(
                records,
                [it["runtime/train_step_s"] for it in iterations],
                (counts["lag_sum"], int(counts["lag_count"]), cu.lag_max),
                actors=len(cu.by_actor),
                wall_s=wall,
                sync=cu.sync,
            ),
        }
    )
    metrics = {k.replace("runtime/", "runtime/summary/", 1): v for k, v in base.items()}
    return RunSummary(
        metrics=metrics,
        iterations=iterations,
        minibatches=records,
        events=cu.events,
        trainer_step=cu.step,
        policy_version=cu.version,
        resumed_from_step=cu.start_step,
        resume_reason=cu.resume_reason,
        finished=cu.finished(),
        checkpoint_path=str(cu.checkpointer.path) if cu.checkpointer else None,
        stopped=cu.stop_reason,
    )
