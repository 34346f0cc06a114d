"""Re-scheduling each new pass over the prompt set on history-aware loads (``schedule.history``).

At a pass boundary (every task of the pass issued, the next pass not created yet) the Control Unit core asks
`plan_next_pass` for the next pass's plan: each prompt's load is `asp.schedule.history.history_loads` of its
calibrated prediction (the plan's ``predicted``) and the realized lengths the run trained on so far
(`LengthHistory`, kept in the Database and so in the checkpoint), and the plan is the scheduler's own DP cut +
balanced groups (`asp.schedule.build_schedule` with the run's ``schedule:`` settings) on those loads. The core
installs it with a replan of the next passes (no pending task is touched), recorded like any replan, so a resumed
run replays it instead of recomputing it from a history that has moved on. The Ray Control Unit and the simulator
both run it, through `asp.control.core.ControlCore`.

Pure: no Ray, no config, no I/O. Tests: tests/control/test_history.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from asp.control.plan import WorkPlan
from asp.schedule.history import HistoryEstimator, LengthHistory
from asp.schedule.schedule import build_schedule
from asp.schedule.spec import ScheduleSpec

PASS_REASON = "pass"  # the `reason` of a replan that re-scheduled a new pass on history-aware loads


@dataclass(frozen=True, slots=True)
class HistorySettings:
    """History-aware re-scheduling (``schedule.history``; built at the edge from the params).

    Attributes:
        estimator: the shrinkage estimator's settings.
        spec: the scheduler's settings (``schedule:`` b, kappa, k, iterations, method).
        shuffle: shuffle whole batch groups after balancing (``schedule.shuffle_groups``).
        seed: base seed of the balancing (pass p uses seed + p).
    """

    estimator: HistoryEstimator
    spec: ScheduleSpec
    shuffle: bool
    seed: int


def plan_next_pass(
    prompt_ids: list[Any],
    prior: Mapping[Any, float],
    history: LengthHistory,
    version: int,
    settings: HistorySettings,
    pass_index: int,
) -> WorkPlan | None:
    """The plan of pass `pass_index` (0-based) on history-aware loads; None when there is nothing to go on (no
    prompt has a prediction or any history).

    Args:
        prompt_ids: the pass's prompts (any order; the plan's order is the scheduler's).
        prior: prompt id -> calibrated prediction (tokens); a prompt without one uses the mean of the others.
        history: the run's realized lengths so far.
        version: the current policy version (ages of the visits are counted from it).
        settings: estimator, scheduler settings and seed.
        pass_index: the pass being created (its balancing seed is ``seed + pass_index``).

    Returns:
        The `WorkPlan` (its ``predicted`` = the loads used), or None.
    """
    if not prompt_ids or (not prior and not len(history)):
        return None
    known = [float(prior[p]) for p in prompt_ids if p in prior]
    fill = float(np.mean(known)) if known else 1.0
    base = np.array([float(prior.get(p, fill)) for p in prompt_ids], dtype=np.float64)
    if not known:  # no prediction at all: history alone, the mean observed length elsewhere
        observed = [m for p in prompt_ids for _, _, m in history.visits.get(p, ())[-1:]]
        base[:] = max(float(np.mean(observed)), 1.0) if observed else 1.0
    loads = np.maximum(history.loads(prompt_ids, base, version, settings.estimator), 1e-6)
    schedule = build_schedule(
        np.asarray(prompt_ids),
        loads,
        **settings.spec.kwargs(),
        seed=settings.seed + pass_index,
        loads="raw",
        shuffle=settings.shuffle,
    )
    return WorkPlan.from_schedule(schedule)
