"""ASP's offline rollout scheduler (paper §3.3-3.4, appendix E): a library, a CLI and the `schedule` stage core.

    from asp.schedule import PAPER_SPEC, ScheduleSpec, build_schedule, schedule_metrics
    spec = PAPER_SPEC                 # or ScheduleSpec(b=, kappa=, k=, iterations=, method=): no defaults
    sched = build_schedule(prompt_ids, predicted_lengths, **spec.kwargs(), calibration=cal_map)
    schedule_metrics(true_lengths, sched)      # {"D", "P", "CV", "spread", ...} on true lengths

Building blocks: `build_minibatches` (Algorithm 1 DP), `balance_groups` (Algorithm 2 and the faster default),
`ablation` / `sweep` (C0-C4 and the controlled-tau protocol, both taking a `ScheduleSpec`). `kendall_tau` and
`fit_isotonic` are the predictor's (`asp.predictor.metrics`, `asp.predictor.calibration`), re-exported here.
See docs/scheduler.md for the full API, policies and benchmark numbers.
"""

from asp.predictor.calibration import fit_isotonic
from asp.predictor.metrics import kendall_tau
from asp.schedule.ablation import CONDITIONS, SweepResult, ablation, perturb_predictions, sweep, synthetic_lengths
from asp.schedule.balance import balance_groups, group_loads, shuffle_groups
from asp.schedule.conditions import CONDITION_NAMES, condition_schedule
from asp.schedule.dp import build_minibatches, fixed_minibatches, infeasible_message, is_feasible, utilization
from asp.schedule.metrics import schedule_metrics
from asp.schedule.schedule import (
    Schedule,
    build_schedule,
    resolve_calibration,
    schedule_from_frame,
    schedule_summary,
    schedule_to_frame,
)
from asp.schedule.spec import BUILD_METHODS, METHODS, PAPER_SPEC, PAPER_TAUS, ScheduleSpec

__all__ = [
    "BUILD_METHODS",
    "CONDITION_NAMES",
    "CONDITIONS",
    "METHODS",
    "PAPER_SPEC",
    "PAPER_TAUS",
    "Schedule",
    "ScheduleSpec",
    "SweepResult",
    "ablation",
    "balance_groups",
    "build_minibatches",
    "build_schedule",
    "condition_schedule",
    "fit_isotonic",
    "fixed_minibatches",
    "group_loads",
    "infeasible_message",
    "is_feasible",
    "kendall_tau",
    "perturb_predictions",
    "resolve_calibration",
    "schedule_from_frame",
    "schedule_metrics",
    "schedule_summary",
    "schedule_to_frame",
    "shuffle_groups",
    "sweep",
    "synthetic_lengths",
    "utilization",
]
