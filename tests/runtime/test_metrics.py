"""Metric helpers with hand-worked values."""

from __future__ import annotations

import math

import numpy as np
import pytest

from asp.control.metrics import Window, time_weighted_stats
from asp.runtime import busy_fraction, iteration_metrics, summary_metrics, trend

from .helpers import output


def test_busy_fraction_clips_to_window():
    # (0, 1) and (2, 5) inside [0.5, 3.0]: 0.5 + 1.0 = 1.5 of 2.5 s
    assert busy_fraction([(0.0, 1.0), (2.0, 5.0)], 0.5, 3.0) == pytest.approx(0.6)
    assert busy_fraction([], 0.0, 1.0) == 0.0 and busy_fraction([(0, 1)], 1.0, 1.0) == 0.0


def test_trend_is_spearman_of_index_vs_value():
    assert trend([1.0, 2.0, 3.0, 5.0]) == pytest.approx(1.0)
    # values 10, 4, 5, 6 have ranks 4, 1, 2, 3; d = 3, -1, -1, -1; rho = 1 - 6 * 12 / (4 * 15) = -0.2
    assert trend([10.0, 4.0, 5.0, 6.0]) == pytest.approx(-0.2)
    assert math.isnan(trend([1.0, 2.0])) and math.isnan(trend([3.0, 3.0, 3.0]))


def test_time_weighted_stats():
    # 0, 4, 8, 0 from t = 0, 1, 3, 4 to 5: held 1, 2, 1, 1 s; mean (8 + 8) / 5 = 3.2;
    # E[v^2] = (16 * 2 + 64) / 5 = 19.2; variance 19.2 - 10.24 = 8.96
    mean, std = time_weighted_stats([(0.0, 0), (1.0, 4), (3.0, 8), (4.0, 0)], 5.0)
    assert mean == pytest.approx(3.2) and std == pytest.approx(math.sqrt(8.96))
    assert all(math.isnan(v) for v in time_weighted_stats([], 1.0))


def test_summary_has_table_4b_columns():
    s = summary_metrics(
        [10.0, 4.0, 5.0, 6.0],
        [(0.0, 0), (1.0, 2), (3.0, 4), (4.0, 0)],
        [0.0, 0.5],
        [1.0, 3.0],
        [0.2, 0.4],
        {0: 6, 1: 2},
        n_samples=2,
        tokens=100,
        wall_s=25.0,
        end=5.0,
    )
    assert s["runtime/mean_iteration_time_s"] == pytest.approx(6.25)
    assert s["runtime/mean_iteration_time_s_excl_first"] == pytest.approx(5.0)
    assert s["runtime/iteration_time_trend"] == pytest.approx(-0.2)
    # depth in samples 0, 4, 8, 0 held for 1, 2, 1, 1 s: see test_time_weighted_stats
    assert s["runtime/queue_std_samples"] == pytest.approx(math.sqrt(8.96))
    assert s["runtime/queue_max_samples"] == 8
    assert s["runtime/generation_time_std_s"] == pytest.approx(1.0)  # std of 1, 3
    assert s["runtime/actor_prompt_cv"] == pytest.approx(0.5)  # counts 6, 2: std 2 / mean 4
    assert s["runtime/tokens_per_s"] == pytest.approx(4.0)


def test_iteration_metrics_from_a_window():
    w = Window(start=0.0)
    out = output(0, ["a", "b"], [2, 4, 6, 8])  # gen interval (0, 1) on actor 0, 20 tokens
    w.add(out, depth_batches=0.5)
    m = iteration_metrics(
        w,
        2.0,
        queue_depth=3,
        n_samples=2,
        actor_ids=[0, 1],
        prompts_by_gu={0: 2},
        prompts_by_actor={0: 2, 1: 0},
        lags=np.array([0.0, 2.0]),
        paused=False,
    )
    assert m["runtime/iteration_time_s"] == 2.0 and m["runtime/tokens_per_s"] == 10.0
    assert m["runtime/padding_rate_mean"] == pytest.approx(0.375)
    assert m["runtime/queue_depth_samples"] == 6.0 and m["runtime/depth_at_arrival_batches_mean"] == 0.5
    assert m["runtime/actor_busy_fraction/actor0"] == 0.5 and m["runtime/actor_busy_fraction"] == 0.25
    assert m["runtime/policy_lag_mean"] == 1.0 and m["runtime/policy_lag_max"] == 2.0
    assert m["runtime/prompts/actor1"] == 0.0
    assert all(k.startswith("runtime/") for k in m)
