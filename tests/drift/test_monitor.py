"""The drift monitor on hand-worked windows: tau of ordered / reversed windows, the bias (load ratio) and the median
ratio, padding,
group-load CVs, the length trend (paper F.7's statistic) and the monitor's window cadence and reset."""

from __future__ import annotations

import doctest
import math

import numpy as np
import pytest

from asp.drift import monitor
from asp.drift.monitor import DriftMonitor, MinibatchObservation, length_trend, window_stats


def _obs(
    pred: list[float], real: list[list[float]], version: int = 0, group: int | None = None
) -> MinibatchObservation:
    return MinibatchObservation(list(range(len(pred))), np.array(pred), np.array(real), version, group_id=group)


def test_tau_of_ordered_and_reversed_windows() -> None:
    ordered = _obs([100, 200, 300, 400], [[90, 110], [190, 230], [280, 300], [500, 420]])  # means 100 210 290 460
    assert window_stats([ordered])["tau"] == pytest.approx(1.0)
    reversed_ = _obs([400, 300, 200, 100], [[90, 110], [190, 230], [280, 300], [500, 420]])
    assert window_stats([reversed_])["tau"] == pytest.approx(-1.0)
    assert math.isnan(window_stats([_obs([5, 5], [[1], [2]])])["tau"])  # constant predictions: no order


def test_bias_is_the_load_ratio_and_padding_the_mean_over_minibatches() -> None:
    # realized means 110, 180, 600 (sum 890) over predictions 100, 200, 400 (sum 700): load ratio 890 / 700;
    # per-prompt ratios 1.1, 0.9, 1.5 -> median 1.1
    a = _obs([100, 200, 400], [[100, 120], [180, 180], [600, 600]])
    stats = window_stats([a])
    assert stats["bias"] == pytest.approx(890 / 700) and stats["median_ratio"] == pytest.approx(1.1)
    # samples 100 120 180 180 600 600: mean 296.67, max 600 -> padding 1 - 296.67 / 600
    assert stats["padding_rate"] == pytest.approx(1 - (1780 / 6) / 600)
    assert stats["mean_length"] == pytest.approx(1780 / 6)
    b = _obs([10], [[10, 30]])  # padding 1 - 20 / 30 = 1/3
    both = window_stats([a, b])
    assert both["padding_rate"] == pytest.approx((1 - (1780 / 6) / 600 + 1 / 3) / 2)
    assert both["prompts"] == 4 and both["minibatches"] == 2
    assert both["mean_length"] == pytest.approx((1780 + 40) / 8)  # per sample, not per minibatch


def test_group_load_cv_realized_and_scheduled() -> None:
    # realized loads: group 0 = 100 + 200 = 300, group 1 = 300 + 300 = 600 -> mean 450, std 150, CV 1/3;
    # scheduled: every minibatch planned at 225 -> both groups 450, CV 0; group 2 has one minibatch: partial, left out
    window = [_obs([225], [[100]], group=0), _obs([225], [[200]], group=0)]
    window += [_obs([225], [[300]], group=1), _obs([225], [[300]], group=1), _obs([225], [[900]], group=2)]
    stats = window_stats(window)
    assert stats["group_load_cv_realized"] == pytest.approx(1 / 3)
    assert stats["group_load_cv_scheduled"] == pytest.approx(0.0)
    assert stats["groups"] == 2
    assert math.isnan(window_stats(window[:2])["group_load_cv_realized"])  # one complete group: no CV
    assert math.isnan(window_stats([_obs([1], [[1]])])["group_load_cv_realized"])  # no group ids


def test_flat_realized_is_reshaped_and_bad_input_named() -> None:
    obs = MinibatchObservation(["a", "b"], np.array([10.0, 20.0]), np.array([1, 2, 3, 4, 5, 6]), 3)
    assert obs.realized.shape == (2, 3) and obs.realized_mean.tolist() == [2.0, 5.0]  # sample s -> prompt s // 3
    with pytest.raises(ValueError, match="predicted has 1 values for 2 prompt ids"):
        MinibatchObservation(["a", "b"], np.array([10.0]), np.ones((2, 2)), 0)
    with pytest.raises(ValueError, match="realized must be"):
        MinibatchObservation(["a", "b"], np.array([10.0, 20.0]), np.ones(5), 0)
    with pytest.raises(ValueError, match="> 0"):
        MinibatchObservation(["a"], np.array([0.0]), np.ones((1, 2)), 0)


def test_length_trend_hand_worked() -> None:
    # versions 1..5, means 100 102 101 103 104: x - 3 = (-2 -1 0 1 2), y - 102 = (-2 0 -1 1 2)
    # slope = 9 / 10 = 0.9 tokens per version; R^2 = 0.9^2 * 10 / 10 = 0.81; relative slope 0.9 / 102
    slope, rel, r2 = length_trend({1: 100.0, 2: 102.0, 3: 101.0, 4: 103.0, 5: 104.0})
    assert (slope, r2) == pytest.approx((0.9, 0.81)) and rel == pytest.approx(0.9 / 102)
    assert length_trend({0: 1.0, 7: 8.0, 3: 4.0})[2] == pytest.approx(1.0)  # a perfect line, any key order
    assert length_trend({0: 5.0, 1: 5.0, 2: 5.0}) == (0.0, 0.0, 0.0)  # flat: no trend explained
    assert all(math.isnan(v) for v in length_trend({0: 1.0, 1: 2.0}))  # two points always fit
    assert all(math.isnan(v) for v in length_trend({v: 1.0 + v for v in range(5)}, min_versions=6))
    assert doctest.testmod(monitor).failed == 0


def test_monitor_emits_every_window_with_cumulative_and_trend() -> None:
    mon = DriftMonitor(window=2)
    first = _obs([100, 200], [[100, 100], [200, 200]], version=0)
    assert mon.add(first) is None
    out = mon.add(_obs([300, 400], [[330, 330], [440, 440]], version=1))
    assert out is not None and out["drift/window_index"] == 0 and out["drift/prompts_window"] == 4
    assert out["drift/tau_window"] == pytest.approx(1.0) and out["drift/tau_cumulative"] == pytest.approx(1.0)
    assert out["drift/bias_window"] == pytest.approx(1070 / 1000)  # (100 + 200 + 330 + 440) / (100 + ... + 400)
    assert out["drift/median_ratio"] == pytest.approx(1.05)  # ratios 1, 1, 1.1, 1.1
    assert math.isnan(out["drift/length_trend_r2"]) and out["drift/versions"] == 2  # too few versions for a trend
    for v in range(2, 12):  # versions 2..11 at 100 + v tokens: a perfect line over 12 versions
        mon.add(_obs([100], [[100 + v]], version=v))
    assert mon.mean_length_by_version()[0] == 150  # (100 + 100 + 200 + 200) / 4
    assert mon.add(_obs([100], [[112]], version=12)) is None  # 13 minibatches: 6 windows emitted, the 13th pending
    out = mon.add(_obs([100], [[113]], version=13))
    assert out is not None and out["drift/window_index"] == 6
    slope, rel, r2 = length_trend(mon.mean_length_by_version())
    assert out["drift/length_trend_slope"] == pytest.approx(slope)
    assert out["drift/length_trend_change"] == pytest.approx(rel * 13)  # versions 0..13
    mon.reset()
    assert mon.mean_length_by_version() == {} and mon.windows_emitted == 7
    with pytest.raises(ValueError, match="window"):
        DriftMonitor(window=0)
