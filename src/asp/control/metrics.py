"""Runtime metrics: per-iteration dicts, the run summary (the paper's Table 4(b) columns) and `RunSummary`, what a
run returns. Pure functions.

Names are namespaced ``runtime/...``. An *iteration* is one trainer step; its time runs from the end of
the previous step (the run start for the first) to the end of this one. Queue statistics are over the
Training Queue depth as a function of time (piecewise constant between arrivals and batch takes; mean and
STD weighted by time, so a depth that persists counts more), in samples (prompts * n) as in Table 4(b);
depth at arrival is in global batches (the `Q_arrival` of the paper's lag estimate).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from asp.control.messages import MinibatchOutput
from asp.rl.lag import lag_stats


@dataclass(slots=True)
class RunSummary:
    """What `run_async` returns.

    Attributes:
        metrics: summary metrics (``runtime/summary/...``; Table 4(b) columns first).
        iterations: per-iteration metric dicts of the whole run (earlier sessions of a resumed run from the run log,
            `asp.runtime.runlog`), each with its ``step``.
        minibatches: one record per ingested minibatch of the whole run (provenance, timing, padding, depth at
            arrival, ``session``), times in run time; of an earlier session only those trained (partly) by the
            resumed position.
        events: of this session: (seconds since its start, "send" | "recv" | "fail" | "dup" | "pause" | "resume"
            | "train" | "trained" | "replan" | "stop", gu, actor, task_id, attempt); -1 where it does not apply;
            "train" (batch handed to the trainer), "trained" (step finished) and "stop" carry the trainer step in
            place of the task id, "replan" the new plan version.
        trainer_step, policy_version: position at the end.
        resumed_from_step: trainer step the session started from (0 for a fresh run).
        resume_reason: why it resumed or started fresh.
        finished: True when the run reached its iterations (or trained the whole schedule).
        stopped: why `ControlUnit.request_stop` ended the session early ("" when it was not stopped).
    """

    metrics: dict[str, float]
    iterations: list[dict[str, float]]
    minibatches: list[dict[str, Any]]
    events: list[tuple[float, str, int, int, int, int]]
    trainer_step: int
    policy_version: int
    resumed_from_step: int
    resume_reason: str
    finished: bool
    checkpoint_path: str | None = None
    stopped: str = ""

    SCALARS = (
        "metrics",
        "trainer_step",
        "policy_version",
        "resumed_from_step",
        "resume_reason",
        "finished",
        "stopped",
    )

    def to_record(self) -> dict[str, Any]:
        """The summary without its lists (what the run log keeps of a finished run; `from_record` reverses it)."""
        return {name: getattr(self, name) for name in self.SCALARS}

    @classmethod
    def from_record(
        cls, record: dict[str, Any], iterations: list[dict[str, Any]], minibatches: list[dict[str, Any]]
    ) -> RunSummary:
        """A summary from `to_record`'s dict and the run's iterations and minibatch records (no events)."""
        return cls(iterations=iterations, minibatches=minibatches, events=[], **{k: record[k] for k in cls.SCALARS})


def busy_fraction(intervals: Sequence[tuple[float, float]], t0: float, t1: float) -> float:
    """Fraction of [t0, t1] covered by (start, end) intervals (which do not overlap: one actor), in [0, 1].

    Example: intervals (0, 1) and (2, 5) over window [0.5, 3.0] cover 0.5 + 1.0 = 1.5 of 2.5 s -> 0.6.
    """
    if t1 <= t0:
        return 0.0
    covered = sum(max(0.0, min(end, t1) - max(start, t0)) for start, end in intervals)
    return min(1.0, covered / (t1 - t0))


def generation_utilization(gen_times: Sequence[float], actors: int, wall_s: float) -> float:
    """Fraction of the wall time the generation actors spent decoding: sum of gen_s / (actors * wall_s), in [0, 1].

    Reloads and waiting for work (or for the trainer) count as idle. Example: 2 actors over a 10 s run that
    decoded minibatches of 3, 4 and 5 s -> 12 / 20 = 0.6. NaN without actors or time.
    """
    if actors <= 0 or wall_s <= 0:
        return float("nan")
    return min(1.0, float(np.sum(gen_times)) / (actors * wall_s))


def time_weighted_stats(trace: Sequence[tuple[float, float]], end: float) -> tuple[float, float]:
    """(mean, std) over time of a piecewise-constant signal given as (time, value) changes, up to `end`.

    Example: values 0, 4, 8, 0 set at t = 0, 1, 3, 4 with end 5 hold for 1, 2, 1, 1 s: mean 16 / 5 = 3.2,
    E[v^2] = (16 * 2 + 64) / 5 = 19.2, std = sqrt(19.2 - 3.2^2) = sqrt(8.96).
    """
    if not trace:
        return float("nan"), float("nan")
    times = np.asarray([t for t, _ in trace] + [max(end, trace[-1][0])], dtype=float)
    values = np.asarray([v for _, v in trace], dtype=float)
    weights = np.diff(times)
    if weights.sum() <= 0:
        return float(values.mean()), float(values.std())
    mean = float(np.average(values, weights=weights))
    variance = float(np.average((values - mean) ** 2, weights=weights))
    return mean, float(np.sqrt(max(variance, 0.0)))


def trend(values: Sequence[float]) -> float:
    """Spearman correlation of index vs value (NaN with fewer than 3 values or constant values)."""
    if len(values) < 3 or np.ptp(np.asarray(values, dtype=float)) == 0:
        return float("nan")
    from scipy import stats

    return float(stats.spearmanr(np.arange(len(values)), values).statistic)


@dataclass(slots=True)
class Window:
    """What arrived at the Training Queue during one iteration."""

    start: float
    tokens: int = 0
    prompts: int = 0
    minibatches: int = 0
    padding: list[float] = field(default_factory=list)
    depth_at_arrival: list[float] = field(default_factory=list)  # global batches
    gen_s: list[float] = field(default_factory=list)
    reload_s: list[float] = field(default_factory=list)
    intervals: dict[int, list[tuple[float, float]]] = field(default_factory=lambda: defaultdict(list))

    def add(self, out: MinibatchOutput, depth_batches: float) -> None:
        """Record one ingested minibatch and the queue depth (global batches) just before it arrived."""
        self.tokens += out.total_tokens
        self.prompts += out.num_prompts
        self.minibatches += 1
        self.padding.append(out.padding_rate)
        self.depth_at_arrival.append(depth_batches)
        self.gen_s.append(out.gen_s)
        self.reload_s.append(out.reload_s)
        self.intervals[out.actor].append((out.gen_start, out.gen_end))


def _mean(values: Sequence[float]) -> float:
    return float(np.mean(values)) if len(values) else float("nan")


def iteration_metrics(
    window: Window,
    end: float,
    *,
    queue_depth: int,
    n_samples: int,
    actor_ids: Sequence[int],
    prompts_by_gu: dict[int, int],
    prompts_by_actor: dict[int, int],
    lags: np.ndarray,
    paused: bool,
) -> dict[str, float]:
    """One iteration's metric dict.

    Args:
        window: arrivals since the previous iteration ended (window.start).
        end: time the iteration ended (trainer step completed), same clock as the outputs' gen times.
        queue_depth: Training Queue depth in prompts after the step's batch was taken.
        n_samples: responses per prompt.
        actor_ids: all generation actor indices (actors without work count as 0 % busy).
        prompts_by_gu, prompts_by_actor: cumulative prompts ingested per GU / actor.
        lags: (B,) policy lag in steps of each prompt of the trained batch.
        paused: whether backpressure was active at the end of the iteration.
    """

    duration = end - window.start
    busy = {a: busy_fraction(window.intervals.get(a, []), window.start, end) for a in actor_ids}
    lag_mean, lag_max = lag_stats(lags)
    metrics = {
        "runtime/iteration_time_s": duration,
        "runtime/tokens_per_s": window.tokens / duration if duration > 0 else 0.0,
        "runtime/generated_tokens": float(window.tokens),
        "runtime/ingested_prompts": float(window.prompts),
        "runtime/ingested_minibatches": float(window.minibatches),
        "runtime/queue_depth_prompts": float(queue_depth),
        "runtime/queue_depth_samples": float(queue_depth * n_samples),
        "runtime/depth_at_arrival_batches_mean": _mean(window.depth_at_arrival),
        "runtime/depth_at_arrival_batches_max": max(window.depth_at_arrival, default=float("nan")),
        "runtime/padding_rate_mean": _mean(window.padding),
        "runtime/padding_rate_max": max(window.padding, default=float("nan")),
        "runtime/generation_time_s_mean": _mean(window.gen_s),
        "runtime/reload_time_s_mean": _mean(window.reload_s),
        "runtime/actor_busy_fraction": _mean(list(busy.values())),
        "runtime/policy_lag_mean": lag_mean,
        "runtime/policy_lag_max": lag_max,
        "runtime/paused": float(paused),
    }
    metrics.update({f"runtime/actor_busy_fraction/actor{a}": v for a, v in busy.items()})
    metrics.update({f"runtime/prompts/gu{g}": float(c) for g, c in sorted(prompts_by_gu.items())})
    metrics.update({f"runtime/prompts/actor{a}": float(c) for a, c in sorted(prompts_by_actor.items())})
    return metrics


def summary_metrics(
    iteration_times: Sequence[float],
    depth_trace: Sequence[tuple[float, float]],
    depth_at_arrival: Sequence[float],
    gen_times: Sequence[float],
    padding: Sequence[float],
    prompts_by_actor: dict[int, int],
    *,
    n_samples: int,
    tokens: int,
    wall_s: float,
    end: float | None = None,
) -> dict[str, float]:
    """The run summary (Table 4(b) columns first).

    Args:
        iteration_times: seconds per iteration, in order (the first includes startup).
        depth_trace: (time, Training Queue depth in prompts) after every change; time on the clock of `end`.
        depth_at_arrival: depth (global batches) just before every arrival.
        gen_times: engine seconds per generated minibatch.
        padding: realized padding rate per minibatch.
        prompts_by_actor: cumulative prompts per actor.
        n_samples: responses per prompt.
        tokens: generated tokens ingested over the run.
        wall_s: seconds from the run start to the last step.
        end: time the run ended (closes the last depth interval); default: the last change.
    """
    times = np.asarray(iteration_times, dtype=float)
    depth = np.asarray([d for _, d in depth_trace], dtype=float) * n_samples
    close = end if end is not None else (depth_trace[-1][0] if depth_trace else 0.0)
    _, queue_std = time_weighted_stats([(t, d * n_samples) for t, d in depth_trace], close)
    counts = np.asarray(list(prompts_by_actor.values()), dtype=float)
    arrivals = np.asarray(depth_at_arrival, dtype=float)
    nan = float("nan")
    return {
        "runtime/mean_iteration_time_s": float(times.mean()) if times.size else nan,
        "runtime/mean_iteration_time_s_excl_first": float(times[1:].mean()) if times.size > 1 else nan,
        "runtime/iteration_time_trend": trend(times.tolist()),
        "runtime/queue_std_samples": queue_std,
        "runtime/queue_max_samples": float(depth.max()) if depth.size else nan,
        "runtime/generation_time_std_s": float(np.std(gen_times)) if len(gen_times) else nan,
        "runtime/first_iteration_time_s": float(times[0]) if times.size else nan,
        "runtime/iteration_time_std_s": float(times.std()) if times.size else nan,
        "runtime/generation_time_mean_s": float(np.mean(gen_times)) if len(gen_times) else nan,
        "runtime/padding_rate_mean": float(np.mean(padding)) if len(padding) else nan,
        "runtime/depth_at_arrival_batches_mean": float(arrivals.mean()) if arrivals.size else nan,
        "runtime/depth_at_arrival_batches_p95": float(np.percentile(arrivals, 95)) if arrivals.size else nan,
        "runtime/depth_at_arrival_batches_max": float(arrivals.max()) if arrivals.size else nan,
        "runtime/actor_prompt_cv": float(counts.std() / counts.mean()) if counts.size and counts.mean() else nan,
        "runtime/tokens_per_s": tokens / wall_s if wall_s > 0 else nan,
        "runtime/iterations": float(times.size),
        "runtime/wall_s": wall_s,
    }


def comparison_summary(
    records: Sequence[dict[str, Any]],
    step_times: Sequence[float],
    lags: tuple[float, int, float],
    reloads: tuple[float, float],
    *,
    actors: int,
    wall_s: float,
    sync: bool,
) -> dict[str, float]:
    """What a sync-vs-async comparison needs besides Table 4(b).

    Args:
        records: the run's minibatch records (`minibatch_record`: ``gen_s``).
        step_times: trainer step durations (s).
        lags: (sum, count, max) of the policy lag over every trained prompt.
        reloads: (count, seconds) of the weight reloads of every engine call, a minibatch's or a continuation's
            (the core's counters: a record's ``reload_s`` sums the reloads credited to its minibatch, so records
            cannot count them).
        actors: generation actors of the run.
        wall_s: seconds from the run start to the last step.
        sync: whether the run was synchronous (``runtime.mode: sync``).

    Returns:
        ``runtime/generation_utilization`` (see `generation_utilization`), ``policy_lag_mean|max``,
        ``train_step_mean_s``, ``reload_time_mean_s`` (per reload), ``reloads``, ``mode_sync`` (0 / 1).
    """
    reload_count, reload_s = reloads
    total, count, most = lags
    return {
        "runtime/generation_utilization": generation_utilization([r["gen_s"] for r in records], actors, wall_s),
        "runtime/policy_lag_mean": total / count if count else float("nan"),
        "runtime/policy_lag_max": most,
        "runtime/train_step_mean_s": _mean(step_times),
        "runtime/reload_time_mean_s": reload_s / reload_count if reload_count else float("nan"),
        "runtime/reloads": float(reload_count),
        "runtime/mode_sync": float(sync),
    }


def minibatch_record(
    out: MinibatchOutput, arrival: float, depth_batches: float, t0: float, plan_version: int = 1
) -> dict[str, Any]:
    """One ingested minibatch as a flat dict (`RunSummary.minibatches`); times in seconds since `t0`;
    `plan_version`: the schedule version that scheduled it (1 = the run's original plan)."""
    return {
        "task_id": out.task_id,
        "minibatch_id": out.minibatch_id,
        "plan_version": plan_version,
        "attempt": out.attempt,
        "gu": out.gu,
        "actor": out.actor,
        "policy_version": out.policy_version,
        "prompts": out.num_prompts,
        "tokens": out.total_tokens,
        "max_length": int(out.lengths.max(initial=0)),
        "padding_rate": out.padding_rate,
        "gen_start_s": out.gen_start - t0,
        "gen_s": out.gen_s,
        "reload_s": out.reload_s,
        "reload_error": out.reload_error,
        "arrival_s": arrival,
        "depth_at_arrival_batches": depth_batches,
        "responses": int(out.lengths.shape[0]),
        "split_responses": out.split_responses,
    }


def split_share(records: Sequence[dict[str, Any]]) -> float:
    """Share of the responses (over minibatch records) whose segments came from more than one policy version
    (partial rollouts; 0 without); NaN without responses. Records of older run logs without the columns count 0."""
    total = sum(int(r.get("responses", 0)) for r in records)
    return sum(int(r.get("split_responses", 0)) for r in records) / total if total else float("nan")


def grpo_summary(rows: Sequence[dict[str, float]], fraction: float = 0.2) -> dict[str, float]:
    """Summary of a GRPO run from its per-iteration metric dicts (``train/...`` from the GRPO trainer).

    Reward over the first and last `fraction` of iterations (at least one each), the measured policy lag
    (mean of the per-batch means, max of the maxima), the eq.-4 estimate d_off, the T_* means, and the
    duty cycle (estimate: mean per step; measured: cumulative at the last step). Names: ``grpo/...``.

    Example: rewards 0.1, 0.2, 0.3, 0.4, 0.5 -> first 20 % = 0.1, last 20 % = 0.5.
    """
    rows = [r for r in rows if "train/reward_mean" in r]
    k = max(1, round(fraction * len(rows)))

    def mean(key: str, part: Sequence[dict[str, float]] = rows) -> float:
        vals = [r[key] for r in part if key in r and np.isfinite(r[key])]
        return float(np.mean(vals)) if vals else float("nan")

    last = rows[-1] if rows else {}
    out = {
        "grpo/iterations": float(len(rows)),
        "grpo/reward_first_20pct": mean("train/reward_mean", rows[:k]),
        "grpo/reward_last_20pct": mean("train/reward_mean", rows[-k:]),
        "grpo/solved_first_20pct": mean("train/solved_fraction", rows[:k]),
        "grpo/solved_last_20pct": mean("train/solved_fraction", rows[-k:]),
        "grpo/lag_mean": mean("train/lag_mean"),
        "grpo/lag_max": float(max((r["train/lag_max"] for r in rows if "train/lag_max" in r), default=float("nan"))),
        "grpo/d_off_estimate_mean": mean("train/d_off_estimate_mean"),
        "grpo/q_arrival_batches_mean": mean("train/q_arrival_batches_mean"),
        "grpo/duty_cycle_estimate": mean("train/duty_cycle"),
        "grpo/duty_cycle_measured": float(last.get("train/duty_cycle_measured", float("nan"))),
        "grpo/mean_response_length": mean("train/mean_response_length"),
        "grpo/clip_fraction_mean": mean("train/clip_fraction"),
        "grpo/abs_log_ratio_mean": mean("train/abs_log_ratio_mean"),
        "grpo/nan_skipped_steps": float(last.get("train/nan_skipped_steps", 0.0)),
        "grpo/reward_errors_total": float(last.get("train/reward_errors_total", 0.0)),
    }
    out.update({f"grpo/T_{t}_s": mean(f"train/t_{t}_s") for t in ("save", "convert", "load", "gen", "train")})
    return out
