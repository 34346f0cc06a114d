"""ASP's offline rollout scheduler (paper §3.3-3.4, appendix E): a library, a CLI and the `schedule` stage core.

    from asp.schedule import build_schedule, schedule_metrics
    sched = build_schedule(prompt_ids, predicted_lengths, b=32, kappa=2, k=6, calibration=cal_map)
    schedule_metrics(true_lengths, sched)      # {"D", "P", "CV", "spread", ...} on true lengths

Building blocks: `build_minibatches` (Algorithm 1 DP), `balance_groups` (Algorithm 2 and the faster default),
`ablation` / `sweep` (C0-C4 and the controlled-tau protocol), `plot_schedule` (Figure 7). See
docs/scheduler.md for the full API, policies and benchmark numbers.
"""

from asp.schedule.ablation import (
    CONDITIONS,
    PAPER_TAUS,
    SweepResult,
    ablation,
    fit_isotonic,
    perturb_predictions,
    sweep,
    synthetic_lengths,
)
from asp.schedule.balance import METHODS, balance_groups, group_loads, shuffle_groups
from asp.schedule.conditions import CONDITION_NAMES, condition_schedule
from asp.schedule.dp import build_minibatches, fixed_minibatches, is_feasible, utilization
from asp.schedule.metrics import kendall_tau, schedule_metrics
from asp.schedule.schedule import (
    Schedule,
    build_schedule,
    resolve_calibration,
    schedule_from_frame,
    schedule_summary,
    schedule_to_frame,
)

__all__ = [
    "CONDITION_NAMES",
    "condition_schedule",
    "CONDITIONS",
    "METHODS",
    "PAPER_TAUS",
    "Schedule",
    "SweepResult",
    "ablation",
    "balance_groups",
    "build_minibatches",
    "build_schedule",
    "fit_isotonic",
    "fixed_minibatches",
    "group_loads",
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
