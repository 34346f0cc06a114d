"""Calibration map: hand-worked isotonic fit, monotone on random data, JSON round trip; hand-worked cross-fitting."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from asp.predictor.calibration import (
    CalibrationMap,
    calibration_folds,
    cross_fit_calibration,
    fit_calibration,
    fit_isotonic,
)


def test_isotonic_by_hand() -> None:
    # true 10, 30, 20, 40 at predicted 1..4: the violating pair (30, 20) pools to 25 -> knots y = 10, 25, 25, 40
    cal = fit_calibration(np.array([1, 2, 3, 4.0]), np.array([10, 30, 20, 40.0]))
    # between knots linear, outside flat: f(0)=10, f(1.5)=17.5, f(2.5)=25, f(3.5)=32.5, f(9)=40
    np.testing.assert_allclose(cal(np.array([0, 1.5, 2.5, 3.5, 9.0])), [10, 17.5, 25, 32.5, 40])


def test_fit_isotonic_knots_by_hand() -> None:
    # as in test_isotonic_by_hand, as knot arrays: the violating pair (30, 20) pools to 25
    x, y = fit_isotonic(np.array([1, 2, 3, 4.0]), np.array([10, 30, 20, 40.0]))
    np.testing.assert_allclose(x, [1, 2, 3, 4])
    np.testing.assert_allclose(y, [10, 25, 25, 40])
    # duplicate predictions are averaged first: x = 1, 2, 2, 3 with y = 10, 40, 20, 50 -> y = 10, 30, 50 at 1, 2, 3
    x, y = fit_isotonic(np.array([1, 2, 2, 3.0]), np.array([10, 40, 20, 50.0]))
    np.testing.assert_allclose(x, [1, 2, 3])
    np.testing.assert_allclose(y, [10, 30, 50])
    cal = fit_calibration(np.array([1, 2, 2, 3.0]), np.array([10, 40, 20, 50.0]))
    assert cal.x == (1.0, 2.0, 3.0) and cal.y == (10.0, 30.0, 50.0)  # fit_calibration is fit_isotonic's knots


def test_monotone_on_noisy_data() -> None:
    rng = np.random.default_rng(0)
    pred = rng.uniform(10, 500, size=300)
    true = pred * rng.lognormal(0, 0.5, size=300)
    cal = fit_calibration(pred, true)
    grid = np.linspace(0, 600, 2001)
    assert np.all(np.diff(cal(grid)) >= 0)
    assert np.all(np.diff(cal.y) >= 0)
    # calibrated values stay within the range of the true lengths
    assert cal(grid).min() >= true.min() - 1e-9 and cal(grid).max() <= true.max() + 1e-9


def test_round_trip_json() -> None:
    cal = fit_calibration(np.array([1, 2, 3, 4.0]), np.array([10, 30, 20, 40.0]))
    again = CalibrationMap.from_dict(json.loads(json.dumps(cal.to_dict())))
    assert again == cal
    x = np.array([0.5, 2.2, 3.9])
    np.testing.assert_array_equal(again(x), cal(x))


def test_constant_predictions_give_constant_map() -> None:
    cal = fit_calibration(np.array([5, 5, 5.0]), np.array([1, 2, 6.0]))
    np.testing.assert_allclose(cal(np.array([0, 5, 10.0])), [3, 3, 3])


def test_invalid_maps_and_inputs() -> None:
    with pytest.raises(ValueError, match="non-decreasing"):
        CalibrationMap(x=(1.0, 2.0), y=(5.0, 4.0))
    with pytest.raises(ValueError, match="strictly increasing"):
        CalibrationMap(x=(2.0, 1.0), y=(1.0, 2.0))
    with pytest.raises(ValueError, match="'x' and 'y'"):
        CalibrationMap.from_dict({"x": [1.0]})
    with pytest.raises(ValueError, match="finite"):
        fit_calibration(np.array([1, math.nan]), np.array([1, 2.0]))
    with pytest.raises(ValueError, match="non-empty"):
        fit_calibration(np.array([]), np.array([]))
    with pytest.raises(ValueError, match="NaN"):
        CalibrationMap(x=(1.0,), y=(2.0,))(np.array([math.nan]))


def test_cross_fit_by_hand() -> None:
    pred = np.array([1, 2, 3, 4, 5, 6.0])
    true = np.array([10, 30, 20, 20, 50, 45.0])
    # folds interleave by predicted rank: fold 0 = predicted 1, 3, 5; fold 1 = predicted 2, 4, 6
    np.testing.assert_array_equal(calibration_folds(pred, 2), [0, 1, 0, 1, 0, 1])
    # fold 0 scored by the fit on fold 1 (x 2, 4, 6; y 30, 20, 45 -> the violating 30, 20 pool to 25: y 25, 25, 45):
    #   f(1) = 25 (flat below), f(3) = 25, f(5) = 35 (halfway 25 -> 45)
    # fold 1 scored by the fit on fold 0 (x 1, 3, 5; y 10, 20, 50, already monotone):
    #   f(2) = 15, f(4) = 35, f(6) = 50 (flat above)
    oof = cross_fit_calibration(pred, true, folds=2)
    np.testing.assert_allclose(oof, [25, 15, 25, 35, 35, 50])
    # out-of-fold MAE = (15 + 15 + 5 + 15 + 15 + 5) / 6 = 70 / 6; the map fitted on all six and scored on them
    # (y 10, 23.3, 23.3, 23.3, 47.5, 47.5) has MAE (0 + 6.67 + 3.33 + 3.33 + 2.5 + 2.5) / 6 = 3.06: optimistic
    assert np.abs(oof - true).mean() == pytest.approx(70 / 6)
    assert np.abs(fit_calibration(pred, true)(pred) - true).mean() == pytest.approx(55 / 18)


def test_cross_fit_follows_the_prompts_not_their_positions() -> None:
    pred = np.array([1, 2, 3, 4, 5, 6.0])
    true = np.array([10, 30, 20, 20, 50, 45.0])
    perm = np.array([4, 0, 5, 2, 1, 3])
    np.testing.assert_allclose(cross_fit_calibration(pred[perm], true[perm], folds=2), [35, 25, 50, 25, 15, 35])
    # leave-one-out (K = n) on a monotone relation recovers the interior points exactly, flat at the ends
    line = np.array([0.0, 1.0, 2.0, 3.0])
    np.testing.assert_allclose(cross_fit_calibration(line, 10 * line, folds=4), [10, 10, 20, 20])


def test_cross_fit_rejects_bad_folds() -> None:
    x = np.arange(4.0)
    for folds in (1, 5, True, 2.0):
        with pytest.raises(ValueError, match="folds must be an integer"):
            cross_fit_calibration(x, x, folds=folds)
    with pytest.raises(ValueError, match="equal length"):
        cross_fit_calibration(x, x[:3], folds=2)
