"""Learning curve (`asp.trainers.learning`): evaluation steps and the interval rounded to checkpoints, the run's
elapsed iteration time per step (a retrained step counted once), area under the curve and best point by hand, kept
weights (hard links that outlive the trainer's pruning; a fresh run forgets them) and the curve store across a
reload (what a rerun after a kill sees). The stage-level curve across a kill: tests/pipeline/test_kill_points.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from asp.trainers.learning import (
    CurveStore,
    curve_interval,
    curve_summary,
    elapsed_by_step,
    eval_steps,
    keep_checkpointed,
    keep_weights,
    reset,
    weights_path,
)


def test_eval_steps_and_interval() -> None:
    assert eval_steps(40, 20) == [0, 20, 40]
    assert eval_steps(45, 20) == [0, 20, 40, 45]  # the last step always
    assert eval_steps(0, 20) == [0] and eval_steps(40, 0) == []
    assert curve_interval(20, 10) == 20 and curve_interval(20, 3) == 21 and curve_interval(0, 10) == 0
    assert curve_interval(5, 10) == 10


def test_elapsed_is_summed_iteration_time_with_a_retrained_step_counted_once() -> None:
    iterations = [
        {"step": 1, "runtime/iteration_time_s": 1.0},
        {"step": 2, "runtime/iteration_time_s": 2.0},
        {"step": 2, "runtime/iteration_time_s": 3.0},  # retrained after a resume: the last record counts
        {"step": 3, "runtime/iteration_time_s": 0.5},
    ]
    assert elapsed_by_step(iterations) == {0: 0.0, 1: 1.0, 2: 4.0, 3: 4.5}


def test_curve_summary_by_hand() -> None:
    points = [
        {"step": 0, "elapsed_s": 0.0, "reward": 0.5},
        {"step": 10, "elapsed_s": 30.0, "reward": 0.7},
        {"step": 20, "elapsed_s": 40.0, "reward": 0.6},
    ]
    out = curve_summary(points[::-1])  # any order
    # per step: (0.6 * 10 + 0.65 * 10) / 20; per second: (0.6 * 30 + 0.65 * 10) / 40
    assert out["auc_step"] == pytest.approx(0.625) and out["auc_time"] == pytest.approx((18 + 6.5) / 40)
    assert (out["best"], out["best_step"], out["final"], out["evaluations"]) == (0.7, 10.0, 0.6, 3)
    assert out["gain"] == pytest.approx(0.1)
    assert np.isnan(curve_summary(points[:1])["auc_step"]) and curve_summary([]) == {"evaluations": 0}


def _checkpoint(state: Path, step: int, payload: bytes) -> Path:
    directory = state / "trainer" / f"step-{step:08d}"
    directory.mkdir(parents=True)
    (directory / "model.safetensors").write_bytes(payload)
    return directory


def test_kept_weights_outlive_pruning_and_a_fresh_run_forgets_them(tmp_path: Path) -> None:
    import shutil

    a = _checkpoint(tmp_path, 20, b"step 20")
    assert keep_weights(tmp_path, 20) == weights_path(tmp_path, 20)
    assert keep_weights(tmp_path, 30) is None  # no checkpoint of that step
    shutil.rmtree(a)  # the trainer prunes it
    assert weights_path(tmp_path, 20).read_bytes() == b"step 20"
    _checkpoint(tmp_path, 40, b"step 40")
    _checkpoint(tmp_path, 50, b"step 50")
    assert keep_checkpointed(tmp_path, 20) == [40]  # 50 is not an evaluation step, 20 is kept already
    assert keep_checkpointed(tmp_path, 20) == []
    reset(tmp_path)
    assert not weights_path(tmp_path, 20).exists() and not weights_path(tmp_path, 40).exists()


def test_curve_store_survives_a_reload(tmp_path: Path) -> None:
    store = CurveStore(tmp_path)
    store.add({"step": 20, "elapsed_s": 3.0, "reward": 0.6, "reward_se": 0.1, "eval_s": 1.0})
    store.add({"step": 0, "elapsed_s": 0.0, "reward": 0.5, "reward_se": 0.1, "eval_s": 1.0})
    again = CurveStore(tmp_path)
    assert [p["step"] for p in again.ordered()] == [0, 20] and not again.logged
    again.mark_logged()
    assert CurveStore(tmp_path).logged
