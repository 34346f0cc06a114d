"""Schedule these predictions: `build_schedule` (or a C0-C3 ablation condition) with the ``schedule:`` params,
written once for the schedule stage, the rebuilt conditions of launch and simulate, and re-profiling.

`schedule_predictions(params, preds, calibration, condition)` is the one place that turns params into the
scheduler's arguments (b, kappa, k, iterations, method, the seed, calibrated or raw loads, group shuffling);
`load_plan` is the launch's work plan of `runtime.condition` (the schedule stage's file for C4, rebuilt for C0-C3).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from asp.config import Params, ScheduleParams
from asp.errors import UserError
from asp.runtime import WorkPlan
from asp.schedule import ScheduleSpec, build_schedule, condition_schedule
from asp.steps.loaders import load_calibration
from asp.steps.paths import LaunchPaths

if TYPE_CHECKING:
    from asp.predictor.calibration import CalibrationMap
    from asp.schedule import Schedule


def schedule_spec(schedule: ScheduleParams) -> ScheduleSpec:
    """The scheduler's `ScheduleSpec` (b, kappa, k, iterations, method) from the ``schedule:`` params."""
    return ScheduleSpec(
        b=schedule.b, kappa=schedule.kappa, k=schedule.k, iterations=schedule.iterations, method=schedule.method
    )


def schedule_predictions(
    params: Params, preds: pd.DataFrame, calibration: CalibrationMap | None, condition: str
) -> Schedule:
    """The `Schedule` of `preds`' prompts (columns prompt_id, predicted_length) under the ``schedule:`` params.

    C4 (the schedule stage's): DP minibatches in balanced, shuffled (`schedule.shuffle_groups`) batch groups;
    C0-C3: the ablation's conditions (`asp.schedule.condition_schedule`). Loads are `schedule.loads` with a
    `calibration` map, raw without one.

    Raises:
        ValueError: the scheduler's, naming the argument (e.g. too few prompts for b).
    """
    sched = params.schedule
    ids, predicted = preds["prompt_id"].to_numpy(), preds["predicted_length"].to_numpy(np.float64)
    common = {
        **schedule_spec(sched).kwargs(),
        "seed": params.common.seed,
        "calibration": calibration,
        "loads": sched.loads if calibration is not None else "raw",
    }
    if condition == "C4":
        return build_schedule(ids, predicted, **common, shuffle=sched.shuffle_groups)
    return condition_schedule(ids, predicted, condition, **common)


def load_plan(params: Params, paths: LaunchPaths) -> WorkPlan:
    """The work plan of `runtime.condition`: the schedule stage's output for C4, rebuilt from the predictions (and
    the calibration map, when there is one) for C0-C3."""
    cond = params.runtime.condition
    if cond == "C4":
        if not paths.schedule.is_file():
            raise UserError(f"{paths.schedule}: missing. Run the schedule stage first (`dvc repro schedule`).")
        return WorkPlan.from_frame(pd.read_parquet(paths.schedule))
    if not paths.predictions.is_file():
        raise UserError(f"{paths.predictions}: missing. Run the predict stage first (`dvc repro predict`).")
    preds = pd.read_parquet(paths.predictions)
    return WorkPlan.from_schedule(schedule_predictions(params, preds, load_calibration(paths.calibration), cond))
