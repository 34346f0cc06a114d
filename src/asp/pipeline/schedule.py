"""`schedule` stage: the length-aware rollout schedule of every training prompt.

Reads predictions (prompt_id, predicted_length[, calibrated_length]), the calibration map from `evaluate`
and, when present, the profiled true mean lengths and the held-out split. Builds DP minibatches (sizes in
[b, b + κ]) and balanced batch groups of k minibatches (paper §3.3-3.4), balancing calibrated expected loads by
default. Writes outputs/schedule/schedule.parquet (one row per prompt, in dispatch order) + summary.json, and
metrics/schedule.json.

The C0-C4 ablation (paper §5.3: realized dispersion, padding and group-load balance, measured on true lengths)
runs on the held-out prompts only (outputs/prompts/heldout.parquet), which the predictor never trained on. The
deployed calibration map was fitted on those same prompts, so with `schedule.loads: calibrated` the ablation
uses cross-fitted loads instead: each prompt's expected length comes from an isotonic map fitted on the other
folds (`asp.schedule.ablation.cross_fitted_loads`, as the evaluate stage scores it), and every condition (C1's
sort included) sees those same loads. Each of `schedule.ablation_seeds` seeds shuffles the prompts' order (C0),
draws the folds and seeds C3's shuffle and C4's annealing; the table has each metric's mean and standard deviation
over seeds. Metrics say so: `schedule/ablation/split` (heldout), `schedule/ablation/prompts`,
`schedule/ablation/calibration_folds` (0: raw loads), `schedule/ablation/loads_tau` (Kendall tau of the loads
the conditions saw), `schedule/ablation/seeds` and the tag `schedule/ablation/seeds_vary`.

Run: `asp stage schedule` (what `dvc repro schedule` calls).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from asp.config import Params
from asp.errors import UserError
from asp.io import atomic_path, write_json, write_parquet
from asp.plots import save_figure
from asp.plots.schedule import plot_schedule
from asp.predictor.calibration import CALIBRATION_FOLDS
from asp.schedule import schedule_metrics, schedule_summary, schedule_to_frame
from asp.schedule.ablation import METRICS, run_ablation
from asp.steps.loaders import load_calibration
from asp.steps.paths import SchedulePaths as Paths
from asp.steps.scheduling import schedule_predictions, schedule_spec
from asp.tracking import Tracker

if TYPE_CHECKING:
    from asp.predictor.calibration import CalibrationMap
    from asp.schedule import Schedule


def load_inputs(paths: Paths) -> tuple[pd.DataFrame, Any, pd.DataFrame | None]:
    """Predictions, the calibration map (None if absent) and the held-out prompts' profiled mean lengths (None
    unless both the profile and the held-out split are there)."""
    if not paths.predictions.is_file():
        raise UserError(f"{paths.predictions}: missing. Run the predict stage first (`dvc repro predict`).")
    preds = pd.read_parquet(paths.predictions)
    for col in ("prompt_id", "predicted_length"):
        if col not in preds.columns:
            raise UserError(f"{paths.predictions}: no '{col}' column; expected prompt_id, predicted_length.")
    calibration = load_calibration(paths.calibration)
    if not paths.profile.is_file():
        return preds, calibration, None
    if not paths.heldout.is_file():
        print(
            f"[schedule] {paths.heldout}: missing, so no C0-C4 ablation (it runs on held-out prompts only).",
            file=sys.stderr,
        )
        return preds, calibration, None
    heldout = pd.read_parquet(paths.heldout, columns=["prompt_id"])
    true = pd.read_parquet(paths.profile, columns=["prompt_id", "mean_length"])
    return preds, calibration, true[true["prompt_id"].isin(heldout["prompt_id"])]


def ablation_folds(pred: np.ndarray, calibration: Any, loads: str) -> int:
    """Cross-fitting folds of the held-out ablation's loads: `CALIBRATION_FOLDS` (at most n) when the schedule
    balances calibrated loads, 0 (raw predictions) with `loads: raw` or without a calibration map."""
    if calibration is None or loads == "raw":
        return 0
    return min(CALIBRATION_FOLDS, pred.size)


def heldout_ablation(
    preds: pd.DataFrame, true: pd.DataFrame, params: Params, calibration: Any
) -> tuple[pd.DataFrame, dict[str, Any]]:
    """C0-C4 on the held-out prompts (true = profiled mean lengths, predictions from the predictor).

    Every condition sees the same loads (`asp.schedule.ablation.run_ablation`): the cross-fitted calibrated
    lengths (or the raw predictions with `loads: raw`); each of the `schedule.ablation_seeds` seeds presents the
    prompts in its own random order (C0), draws its own cross-fitting folds and seeds C3's shuffle and C4's
    annealing. Returns the table (mean and standard deviation over seeds per condition; empty when there are fewer
    than two batch groups' worth of prompts) and its metrics.
    """
    schedule_params = params.schedule
    joined = preds.merge(true, on="prompt_id", how="inner")
    if len(joined) < 2 * schedule_params.b * schedule_params.k:
        print(
            f"[schedule] {len(joined)} held-out prompts with profiled lengths: fewer than two batch groups "
            f"(2 * b * k = {2 * schedule_params.b * schedule_params.k}), so no C0-C4 ablation; raise "
            "prepare.heldout_prompts.",
            file=sys.stderr,
        )
        return pd.DataFrame(), {}
    pred = joined["predicted_length"].to_numpy(np.float64)
    true_lengths = joined["mean_length"].to_numpy(np.float64)
    folds = ablation_folds(pred, calibration, schedule_params.loads)
    result = run_ablation(
        true_lengths,
        pred,
        schedule_spec(schedule_params),
        seeds=[params.common.seed + i for i in range(schedule_params.ablation_seeds)],
        loads="raw",  # with folds > 0 the loads are cross-fitted instead
        cross_fit=folds,
        order="shuffled",
    )
    table = result.mean.join(result.sd.add_suffix("_sd"))[[c for m in METRICS for c in (m, f"{m}_sd")]]
    flat: dict[str, Any] = {
        f"schedule/ablation/{c}/{m}": float(v) for c, row in table.iterrows() for m, v in row.items()
    }
    flat.update(
        {
            "schedule/ablation/split": "heldout",
            "schedule/ablation/prompts": len(joined),
            "schedule/ablation/calibration_folds": folds,
            "schedule/ablation/seeds": len(result.seeds),
            "schedule/ablation/loads_tau": result.loads_tau,
            "schedule/ablation/seeds_vary": result.varies,
        }
    )
    return table, flat


def build(preds: pd.DataFrame, calibration: CalibrationMap | None, params: Params, paths: Paths) -> Schedule:
    """The `Schedule` of every predicted prompt: DP minibatches in balanced batch groups, in dispatch order."""
    try:
        return schedule_predictions(params, preds, calibration, condition="C4")
    except ValueError as exc:
        raise UserError(f"{paths.predictions}: cannot build a schedule: {exc}") from None


def predicted_metrics(sched: Any, loads_calibrated: bool) -> dict[str, Any]:
    """Padding and group-load balance the predictions promise, and the schedule's sizes."""
    balanced = np.empty_like(sched.loads)
    balanced[sched.positions] = sched.loads  # back to input order, as schedule_metrics expects
    predicted = schedule_metrics(balanced, sched)
    metrics: dict[str, Any] = {f"schedule/predicted_{k}": float(v) for k, v in predicted.items()}
    metrics.update(
        {
            "schedule/prompts": sched.n_prompts,
            "schedule/minibatches": sched.n_minibatches,
            "schedule/groups": sched.n_groups,
            "schedule/loads_calibrated": int(loads_calibrated),
        }
    )
    return metrics


def save_schedule(sched: Any, summary: dict[str, Any], out_dir: Path) -> None:
    """schedule.parquet (one row per prompt, in dispatch order) and summary.json, replaced together."""
    with atomic_path(out_dir) as out:
        out.mkdir(parents=True)
        write_parquet(schedule_to_frame(sched), out / "schedule.parquet")
        write_json(summary, out / "summary.json")


def save_ablation(table: pd.DataFrame, path: Path, tracker: Tracker) -> None:
    """The C0-C4 table as CSV (one row per condition), logged under tables/. Without an ablation (no held-out
    lengths, or fewer than two batch groups of them) the file holds the header only: it is a declared DVC output,
    so it must exist for `dvc repro` to go on."""
    if table.empty:
        columns = ["condition", *(c for m in METRICS for c in (m, f"{m}_sd"))]
        with atomic_path(path) as tmp:
            pd.DataFrame(columns=columns).to_csv(tmp, index=False)
        return
    with atomic_path(path) as tmp:
        table.rename_axis("condition").reset_index().to_csv(tmp, index=False, float_format="%.6g")
    tracker.log_artifact(path, "tables")


def run(params: Params, paths: Paths, tracker: Tracker) -> dict[str, Any]:
    """Build and save the schedule; report predicted and realized metrics and the C0-C4 table."""
    schedule_params, seed = params.schedule, params.common.seed
    preds, calibration, true = load_inputs(paths)
    sched = build(preds, calibration, params, paths)
    summary = schedule_summary(sched)
    metrics = predicted_metrics(sched, calibration is not None and schedule_params.loads == "calibrated")
    table = pd.DataFrame()
    if true is not None:
        table, flat = heldout_ablation(preds, true, params, calibration)
        metrics.update(flat)
    save_schedule(sched, summary, paths.out_dir)
    write_json(metrics, paths.metrics)
    save_ablation(table, paths.ablation_csv, tracker)
    save_figure(plot_schedule(sched), paths.plot, tracker)
    tracker.log_params({"schedule": schedule_params.model_dump(), "common.seed": seed})
    tracker.log_metrics({k: v for k, v in metrics.items() if isinstance(v, int | float)})
    tracker.set_tags({k.replace("/", "."): v for k, v in metrics.items() if isinstance(v, str)})
    tracker.log_dict(summary, "schedule_summary.json")
    return metrics
