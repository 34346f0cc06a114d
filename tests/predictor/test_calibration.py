"""Calibration map: hand-worked isotonic fit, monotone on random data, JSON round trip."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from asp.predictor.calibration import CalibrationMap, fit_calibration, fit_isotonic


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
