"""Re-scheduling each new pass over the prompt set on history-aware loads (``runtime.history``).

At a pass boundary (every task of the pass issued, the next pass not created yet) the Control Unit core asks
`plan_next_pass` for the next pass's plan: each prompt's load is `asp.schedule.history.history_loads` of its
calibrated prediction (the plan's ``predicted``) and the realized lengths the run trained on so far
(`LengthHistory`, kept in the Database and so in the checkpoint), and the plan is the scheduler's own DP cut +
balanced groups (`asp.schedule.build_schedule` with the run's ``schedule:`` settings) on those loads. The core
installs it with a replan of the next passes (no pending task is touched), recorded like any replan, so a resumed
run replays it instead of recomputing it from a history that has moved on. The prompts in flight at the boundary
have no visit from the pass just issued yet; once they are trained (``catch_up``), the part of the new pass not
issued yet is planned again the same way (`plan_next_pass` on those prompts) and installed as a replan of the
pending tasks (`CATCH_UP_REASON`). The Ray Control Unit and the simulator both run it, through
`asp.control.core.ControlCore`.

`loads_used` and `pass_load_taus` report which knowledge the schedule ran on: per pass, the Kendall tau of the
loads its plan balanced (the calibrated predictions in the first pass, history-aware loads later) against the
realized mean lengths of the prompts trained in this session (``runtime/summary/load_tau/pass_<p>``).

Pure: no Ray, no config, no I/O. Tests: tests/control/test_history.py.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from asp.control.plan import WorkPlan
from asp.predictor.metrics import kendall_tau
from asp.schedule.history import HistoryEstimator, LengthHistory
from asp.schedule.schedule import build_schedule
from asp.schedule.spec import ScheduleSpec

if TYPE_CHECKING:
    from asp.control.database import Database
    from asp.control.messages import GlobalBatch

PASS_REASON = "pass"  # the `reason` of a replan that re-scheduled a new pass on history-aware loads
CATCH_UP_REASON = "catch_up"  # ... that re-scheduled the rest of a pass once the boundary's in-flight prompts trained


@dataclass(frozen=True, slots=True)
class HistorySettings:
    """History-aware re-scheduling (``runtime.history`` with the ``schedule:`` settings, built at the edge).

    Attributes:
        estimator: the shrinkage estimator's settings.
        spec: the scheduler's settings (``schedule:`` b, kappa, k, iterations, method).
        shuffle: shuffle whole batch groups after balancing (``schedule.shuffle_groups``).
        seed: base seed of the balancing (pass p uses seed + p).
        catch_up: once every prompt of the earlier passes is trained (those in flight at the boundary had only
            older visits then), schedule the part of the newest pass not issued yet again (`CATCH_UP_REASON`).
    """

    estimator: HistoryEstimator
    spec: ScheduleSpec
    shuffle: bool
    seed: int
    catch_up: bool


def plan_next_pass(
    prompt_ids: list[Any],
    prior: Mapping[Any, float],
    history: LengthHistory,
    version: int,
    settings: HistorySettings,
    pass_index: int,
) -> WorkPlan | None:
    """The plan of pass `pass_index` (0-based), or of the part of it not issued yet, on history-aware loads; None
    when there is nothing to go on (no prompt has a prediction or any history).

    Args:
        prompt_ids: the pass's prompts, or its pending ones (any order; the plan's order is the scheduler's).
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


def loads_used(db: Database, batch: GlobalBatch) -> list[tuple[int, float, float]]:
    """(pass, load its plan balanced, realized mean length) of each prompt of `batch` whose plan had a load."""
    lengths = np.asarray(batch.lengths, dtype=np.float64).reshape(batch.num_prompts, -1)
    out = []
    for pid, task_id, row in zip(batch.prompt_ids, batch.task_ids, lengths, strict=True):
        task = db.tasks.get(int(task_id))
        if task is None or row.size == 0:
            continue
        rest, full = db.plans[task.version]
        plan = rest if task.rest and rest is not None else full
        load = plan.predicted.get(pid)
        if load is not None:
            out.append((task.epoch, float(load), float(row.mean())))
    return out


def pass_load_taus(rows: Iterable[tuple[int, float, float]]) -> dict[str, float]:
    """``load_tau/pass_<p>`` (p 1-based): Kendall tau of the loads against the realized means of each pass's rows
    (NaN when a pass has fewer than 2 rows or constant values)."""
    by_pass: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for epoch, load, realized in rows:
        by_pass[epoch].append((load, realized))
    out = {}
    for epoch, pairs in sorted(by_pass.items()):
        arr = np.asarray(pairs, dtype=np.float64)
        out[f"load_tau/pass_{epoch + 1}"] = kendall_tau(arr[:, 0], arr[:, 1]) if len(pairs) >= 2 else float("nan")
    return out
