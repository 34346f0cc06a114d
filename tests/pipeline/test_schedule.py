"""schedule stage on 64 synthetic prompts with known, distinct predicted lengths (b = 4, kappa = 1, k = 3).
The schedule holds every prompt exactly once in minibatches of 4-5 cut from the length-sorted order; the reported
predicted D / P / CV / spread equal a recomputation from the written Parquet; balancing beats the sorted order;
with a calibration map and profiled true lengths it balances calibrated loads and runs the C0-C4 ablation on the
held-out prompts only, with cross-fitted calibrated loads (raw ones with `loads: raw`) that every condition sees,
mean and standard deviation over seeds that vary the prompts' order and the folds, and none without the held-out
split."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from asp.errors import UserError
from asp.io import write_json
from asp.pipeline import schedule
from asp.schedule import ScheduleSpec
from asp.schedule.ablation import FixedLoads, run_ablation
from asp.steps.paths import rebase
from asp.tracking import MlflowTracker, NullTracker, end_run

from .conftest import artifact_paths, make_params

N, B, KAPPA, K = 64, 4, 1, 3
IDS = [f"s{i:03d}" for i in range(N)]
# distinct, spread out (10 .. ~700 tokens), in a seeded random order
LENGTHS = np.random.default_rng(7).permutation(10.0 + 3.0 * np.arange(N) + np.arange(N) ** 2 / 8.0)
CALIBRATION = {"kind": "isotonic", "x": [0.0, 100.0, 1000.0], "y": [5.0, 50.0, 3000.0]}
SCHEDULE = {"b": B, "kappa": KAPPA, "k": K, "iterations": 2000, "ablation_seeds": 1}
PARAMS = make_params({"schedule": SCHEDULE})
CONDITIONS = ("C0", "C1", "C2", "C3", "C4")


def _inputs(root: Path) -> schedule.Paths:
    paths = rebase(schedule.Paths(), root)
    paths.predictions.parent.mkdir(parents=True)
    pd.DataFrame({"prompt_id": IDS, "predicted_length": LENGTHS}).to_parquet(paths.predictions, index=False)
    return paths


def _calibrate(x: np.ndarray) -> np.ndarray:
    return np.interp(x, CALIBRATION["x"], CALIBRATION["y"])


def _group_cv(minibatch_loads: np.ndarray) -> float:
    """CV of the loads of complete groups of K consecutive minibatches."""
    n = len(minibatch_loads) // K * K
    groups = minibatch_loads[:n].reshape(-1, K).sum(axis=1)
    return float(groups.std() / groups.mean())


def _check_layout(sched: pd.DataFrame) -> pd.DataFrame:
    """Every prompt once, minibatches of B..B+KAPPA cut from the sorted order, groups of K; per-minibatch frame."""
    assert sorted(sched["prompt_id"]) == IDS  # each prompt exactly once
    by_id = dict(zip(IDS, LENGTHS, strict=True))
    np.testing.assert_array_equal(sched["predicted_length"], sched["prompt_id"].map(by_id))
    assert sched["dispatch_rank"].is_monotonic_increasing  # rows are in dispatch order
    mb = sched.groupby("dispatch_rank").agg(
        size=("prompt_id", "size"),
        ids=("minibatch_id", "nunique"),
        minibatch_id=("minibatch_id", "first"),
        group_id=("group_id", "first"),
        load=("load_used", "sum"),
        lo=("predicted_length", "min"),
        hi=("predicted_length", "max"),
    )
    n_b = len(mb)
    assert mb.index.tolist() == list(range(n_b)) and (mb["ids"] == 1).all()
    assert mb["size"].between(B, B + KAPPA).all() and mb["size"].sum() == N
    assert sorted(mb["minibatch_id"]) == list(range(n_b))
    assert (mb["group_id"] == mb.index // K).all()
    by_rank = mb.sort_values("minibatch_id")  # minibatch_id = rank in length-sorted order: no overlap between them
    assert (by_rank["hi"].to_numpy()[:-1] < by_rank["lo"].to_numpy()[1:]).all()
    return mb


def test_raw_schedule_layout_metrics_and_tracking(tmp_path: Path, new_tracker: Callable[[str], MlflowTracker]) -> None:
    paths = _inputs(tmp_path)
    tracker = new_tracker("schedule")
    metrics = schedule.run(PARAMS, paths, tracker)
    end_run(tracker)

    sched = pd.read_parquet(paths.out_dir / "schedule.parquet")
    mb = _check_layout(sched)
    np.testing.assert_array_equal(sched["load_used"], sched["predicted_length"])  # no calibration: raw loads
    n_b = len(mb)
    assert metrics["schedule/prompts"] == N and metrics["schedule/minibatches"] == n_b
    assert metrics["schedule/groups"] == -(-n_b // K) and metrics["schedule/loads_calibrated"] == 0

    per_mb = sched.groupby("dispatch_rank")["load_used"]
    assert metrics["schedule/predicted_D"] == pytest.approx(per_mb.std(ddof=0).mean())
    assert metrics["schedule/predicted_P"] == pytest.approx((1 - per_mb.mean() / per_mb.max()).mean())
    full = n_b // K * K
    groups = mb["load"].to_numpy()[:full].reshape(-1, K).sum(axis=1)
    assert metrics["schedule/predicted_n_groups"] == n_b // K
    assert metrics["schedule/predicted_CV"] == pytest.approx(groups.std() / groups.mean())
    assert metrics["schedule/predicted_spread"] == pytest.approx(groups.max() / groups.min())
    sorted_cv = _group_cv(mb.sort_values("minibatch_id")["load"].to_numpy())
    assert metrics["schedule/predicted_CV"] < 0.25 * sorted_cv  # balancing evens out the groups' loads

    assert not any(k.startswith("schedule/ablation/") for k in metrics) and _header_only(paths.ablation_csv)
    assert json.loads(paths.metrics.read_text()) == pytest.approx(metrics)
    summary = json.loads((paths.out_dir / "summary.json").read_text())
    assert summary["n_prompts"] == N and summary["minibatch_size"]["min"] >= B
    assert summary["minibatch_size"]["max"] <= B + KAPPA

    run = tracker.client.get_run(tracker.run_id).data
    assert run.params["schedule.b"] == str(B) and run.params["schedule.k"] == str(K)
    assert run.metrics["schedule/predicted_CV"] == pytest.approx(metrics["schedule/predicted_CV"])
    assert {"schedule_summary.json", "plots"} <= artifact_paths(tracker) and paths.plot.is_file()


HELDOUT = IDS[16:]  # the ablation's prompts; IDS[:16] are profiled too, as prompts the predictor trained on


def _profiled_inputs(root: Path) -> schedule.Paths:
    """Predictions, the calibration map, profiled true lengths of every prompt (the 16 training-split ones far off
    the map, so that counting them would show) plus one prompt the predictions lack, and the held-out split
    (HELDOUT, plus one prompt without a profile row)."""
    paths = _inputs(root)
    write_json(CALIBRATION, paths.calibration)
    true = _calibrate(LENGTHS)
    true[:16] = 5000.0
    paths.profile.parent.mkdir(parents=True)
    pd.DataFrame({"prompt_id": [*IDS, "other"], "mean_length": [*true, 99.0]}).to_parquet(paths.profile, index=False)
    paths.heldout.parent.mkdir(parents=True)
    pd.DataFrame({"prompt_id": [*HELDOUT, "unprofiled"]}).to_parquet(paths.heldout, index=False)
    return paths


def _expected_table(loads: str, seeds: int = 1) -> pd.DataFrame:
    """The C0-C4 table of the held-out prompts, built here: cross-fitted calibrated loads (5 folds) or raw ones,
    every seed in its own order of the prompts; mean and standard deviation columns."""
    pred, true = LENGTHS[16:], _calibrate(LENGTHS[16:])
    spec = ScheduleSpec(b=B, kappa=KAPPA, k=K, iterations=2000, method="asp")
    res = run_ablation(true, pred, spec, seeds=range(seeds), loads="raw", cross_fit=5 if loads == "calibrated" else 0)
    return res.mean.join(res.sd.add_suffix("_sd"))[[c for m in ("D", "P", "CV", "spread") for c in (m, f"{m}_sd")]]


def test_calibrated_loads_and_ablation_on_heldout_prompts(
    tmp_path: Path, new_tracker: Callable[[str], MlflowTracker]
) -> None:
    paths = _profiled_inputs(tmp_path)
    tracker = new_tracker("schedule-calibrated")
    metrics = schedule.run(PARAMS, paths, tracker)
    end_run(tracker)

    sched = pd.read_parquet(paths.out_dir / "schedule.parquet")
    _check_layout(sched)  # the schedule itself covers every predicted prompt
    assert metrics["schedule/loads_calibrated"] == 1
    np.testing.assert_allclose(sched["load_used"], _calibrate(sched["predicted_length"].to_numpy()))

    assert metrics["schedule/ablation/split"] == "heldout" and metrics["schedule/ablation/prompts"] == len(HELDOUT)
    assert metrics["schedule/ablation/calibration_folds"] == 5 and metrics["schedule/ablation/seeds"] == 1
    assert 0.9 < metrics["schedule/ablation/loads_tau"] <= 1  # the cross-fitted loads all conditions saw
    assert "order" in metrics["schedule/ablation/seeds_vary"] and "folds" in metrics["schedule/ablation/seeds_vary"]
    table = pd.read_csv(paths.ablation_csv).set_index("condition")
    columns = ["D", "D_sd", "P", "P_sd", "CV", "CV_sd", "spread", "spread_sd"]
    assert table.index.tolist() == list(CONDITIONS) and table.columns.tolist() == columns
    assert (table.filter(like="_sd") == 0).all().all()  # one seed
    expected = _expected_table("calibrated")
    pd.testing.assert_frame_equal(table, expected, check_names=False, check_dtype=False, rtol=1e-5)
    for c in CONDITIONS:
        for m in table.columns:
            assert metrics[f"schedule/ablation/{c}/{m}"] == pytest.approx(table.loc[c, m], rel=1e-5)
    # near-perfect predictions: DP minibatches of sorted prompts pad far less than the original order, and the
    # balanced order (C4) evens out group loads far better than the sorted one (C2)
    assert metrics["schedule/ablation/C2/P"] < 0.5 * metrics["schedule/ablation/C0/P"]
    assert metrics["schedule/ablation/C4/CV"] < 0.5 * metrics["schedule/ablation/C2/CV"]
    assert f"tables/{paths.ablation_csv.name}" in artifact_paths(tracker, "tables")
    run = tracker.client.get_run(tracker.run_id).data
    assert run.tags["schedule.ablation.split"] == "heldout"
    assert run.metrics["schedule/ablation/prompts"] == len(HELDOUT)
    assert json.loads(paths.metrics.read_text())["schedule/ablation/split"] == "heldout"


def test_raw_loads_ablation_over_seeds_and_no_ablation_without_the_heldout_split(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    paths = _profiled_inputs(tmp_path)
    params = make_params({"schedule": {**SCHEDULE, "loads": "raw", "ablation_seeds": 2}})
    metrics = schedule.run(params, paths, NullTracker())
    assert metrics["schedule/loads_calibrated"] == 0 and metrics["schedule/ablation/calibration_folds"] == 0
    assert metrics["schedule/ablation/seeds"] == 2 and "folds" not in metrics["schedule/ablation/seeds_vary"]
    table = pd.read_csv(paths.ablation_csv).set_index("condition")
    pd.testing.assert_frame_equal(table, _expected_table("raw", 2), check_names=False, rtol=1e-5)
    assert table.loc["C0", "CV_sd"] > 0  # the seeds vary the prompts' order, so C0's minibatches

    paths.heldout.unlink()
    paths.ablation_csv.unlink()
    metrics = schedule.run(PARAMS, paths, NullTracker())
    assert not any(k.startswith("schedule/ablation/") for k in metrics) and _header_only(paths.ablation_csv)
    assert "heldout.parquet: missing, so no C0-C4 ablation" in capsys.readouterr().err


def test_too_few_heldout_prompts_still_write_the_declared_ablation_csv(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Fewer held-out prompts with lengths than two batch groups (e.g. your own lengths cover few of them): no
    ablation, one line saying so, and plots/schedule_ablation.csv (a DVC output) exists with its header only."""
    paths = _profiled_inputs(tmp_path)
    params = make_params({"schedule": {**SCHEDULE, "b": 8, "k": 4}})  # 2 * b * k = 64 > the held-out prompts
    metrics = schedule.run(params, paths, NullTracker())
    assert not any(k.startswith("schedule/ablation/") for k in metrics) and _header_only(paths.ablation_csv)
    assert "fewer than two batch groups" in capsys.readouterr().err


def _header_only(path: Path) -> bool:
    """The ablation CSV exists with the full table's columns and no row."""
    table = pd.read_csv(path)
    columns = ["condition", "D", "D_sd", "P", "P_sd", "CV", "CV_sd", "spread", "spread_sd"]
    return table.empty and table.columns.tolist() == columns


def test_fixed_loads_refuse_other_predictions() -> None:
    loads = FixedLoads(np.array([1.0, 2.0]), np.array([10.0, 20.0]))
    np.testing.assert_array_equal(loads(np.array([1.0, 2.0])), [10.0, 20.0])
    with pytest.raises(ValueError, match="other predictions"):
        loads(np.array([2.0, 1.0]))


def test_bad_predictions_are_clear_errors_and_write_nothing(tmp_path: Path) -> None:
    paths = rebase(schedule.Paths(), tmp_path)
    with pytest.raises(UserError, match=r"predictions\.parquet: missing\. Run the predict stage first"):
        schedule.run(PARAMS, paths, NullTracker())
    paths.predictions.parent.mkdir(parents=True)
    pd.DataFrame({"prompt_id": IDS, "length": LENGTHS}).to_parquet(paths.predictions, index=False)
    with pytest.raises(UserError, match="no 'predicted_length' column"):
        schedule.run(PARAMS, paths, NullTracker())
    pd.DataFrame({"prompt_id": IDS[:2] * 2, "predicted_length": LENGTHS[:4]}).to_parquet(paths.predictions)
    with pytest.raises(UserError, match="cannot build a schedule: prompt_ids must be unique"):
        schedule.run(PARAMS, paths, NullTracker())
    assert not paths.out_dir.exists() and not paths.metrics.exists()
