"""Monotone calibration of predicted lengths to expected true lengths (pure numpy/sklearn, no I/O).

The predictor's order is what it is good at; its scale can be off (ranking losses do not fix it at all).
``fit_calibration`` fits isotonic regression of the true mean length on the predicted length over held-out
prompts, and ``CalibrationMap`` applies it: piecewise-linear between knots, flat outside them, never
decreasing. The scheduler calls the map on predicted lengths to get expected loads. ``fit_isotonic`` is the
fit alone, as knot arrays (the project's one isotonic fit; the scheduler's sweep uses it too).
``cross_fit_calibration`` scores the fit out of sample: each prompt's calibrated length comes from a map fitted
on the other folds (K-fold cross-fitting), so an error measured on it is not the fit's in-sample optimism.
sklearn is imported only when fitting.
Run the tests with ``.venv/bin/python -m pytest tests/predictor/test_calibration.py -q``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

CALIBRATION_FOLDS = 5  # folds of `cross_fit_calibration` in the evaluate and schedule stages


@dataclass(frozen=True)
class CalibrationMap:
    """Piecewise-linear non-decreasing map from predicted to expected true length (tokens).

    Attributes:
        x: knots on the predicted-length axis, strictly increasing.
        y: values at the knots, non-decreasing.
    """

    x: tuple[float, ...]
    y: tuple[float, ...]

    def __post_init__(self) -> None:
        x = np.asarray(self.x, dtype=np.float64)
        y = np.asarray(self.y, dtype=np.float64)
        if x.ndim != 1 or x.shape != y.shape or x.size == 0:
            raise ValueError(f"calibration map needs equally many x and y knots (>= 1); got {x.size} and {y.size}")
        if not (np.all(np.isfinite(x)) and np.all(np.isfinite(y))):
            raise ValueError("calibration knots must be finite numbers")
        if np.any(np.diff(x) <= 0):
            raise ValueError("calibration x knots must be strictly increasing")
        if np.any(np.diff(y) < 0):
            raise ValueError("calibration y knots must be non-decreasing (the map must be monotone)")
        object.__setattr__(self, "x", tuple(float(v) for v in x))
        object.__setattr__(self, "y", tuple(float(v) for v in y))

    def __call__(self, values: np.ndarray) -> np.ndarray:
        """Map predicted lengths [n] to expected true lengths [n] (float64, flat beyond the end knots)."""
        v = np.asarray(values, dtype=np.float64)
        if np.any(np.isnan(v)):
            raise ValueError("cannot calibrate NaN predicted lengths")
        return np.interp(v, np.asarray(self.x), np.asarray(self.y))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form: ``{"kind": "isotonic", "x": [...], "y": [...]}``."""
        return {"kind": "isotonic", "x": list(self.x), "y": list(self.y)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CalibrationMap:
        """Inverse of ``to_dict``; raises ValueError naming what is missing or wrong."""
        if not isinstance(data, dict) or "x" not in data or "y" not in data:
            keys = sorted(data) if isinstance(data, dict) else type(data).__name__
            raise ValueError(f"calibration map needs keys 'x' and 'y', got {keys}")
        return cls(x=tuple(data["x"]), y=tuple(data["y"]))


def fit_isotonic(predicted: np.ndarray, true: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Isotonic regression of true on predicted lengths, as knots of a piecewise-linear non-decreasing map.

    Args:
        predicted: [n] predicted lengths in tokens.
        true: [n] measured mean lengths in tokens, same prompts.

    Returns:
        (x, y) float64 knots: x strictly increasing (sklearn's ``X_thresholds_``), y non-decreasing.

    Raises:
        ValueError: empty input, mismatched shapes or NaN/inf values.
    """
    from sklearn.isotonic import IsotonicRegression  # ~2 s to import: only when fitting

    p = np.asarray(predicted, dtype=np.float64)
    t = np.asarray(true, dtype=np.float64)
    if p.ndim != 1 or p.shape != t.shape or p.size == 0:
        raise ValueError(f"predicted and true must be non-empty 1-D arrays of equal length; got {p.shape}, {t.shape}")
    if not (np.all(np.isfinite(p)) and np.all(np.isfinite(t))):
        raise ValueError("predicted and true lengths must be finite (found NaN or inf)")
    iso = IsotonicRegression(increasing=True, out_of_bounds="clip").fit(p, t)
    x = np.asarray(iso.X_thresholds_, dtype=np.float64)
    y = np.asarray(iso.y_thresholds_, dtype=np.float64)
    keep = np.concatenate(([True], np.diff(x) > 0))  # defensive: knots must be strictly increasing
    return x[keep], np.maximum.accumulate(y[keep])  # guard float round-off


def fit_calibration(predicted: np.ndarray, true: np.ndarray) -> CalibrationMap:
    """Fit isotonic regression of true on predicted lengths (`fit_isotonic`) as a `CalibrationMap`.

    Args:
        predicted: [n] predicted lengths in tokens (held-out prompts).
        true: [n] measured mean lengths in tokens, same prompts.

    Returns:
        The fitted map.

    Raises:
        ValueError: empty input, mismatched shapes or NaN/inf values.
    """
    x, y = fit_isotonic(predicted, true)
    return CalibrationMap(x=tuple(x), y=tuple(y))


def calibration_folds(predicted: np.ndarray, folds: int) -> np.ndarray:
    """Fold of each prompt: rank r in (predicted, index) order goes to fold r mod `folds`.

    Interleaving by predicted rank gives every fold's complement knots over the whole prediction range, so
    cross-fitted maps rarely extrapolate flat beyond their end knots; no randomness, so no seed.

    Args:
        predicted: [n] predicted lengths.
        folds: number of folds, 2 <= folds <= n.

    Returns:
        int64 [n] fold index in 0..folds-1 per prompt (input order).
    """
    p = np.asarray(predicted, dtype=np.float64)
    if isinstance(folds, bool) or not isinstance(folds, int | np.integer) or not 2 <= folds <= p.size:
        raise ValueError(f"folds must be an integer in [2, n = {p.size}], got {folds!r}")
    fold = np.empty(p.size, dtype=np.int64)
    fold[np.argsort(p, kind="stable")] = np.arange(p.size) % folds
    return fold


def cross_fit_calibration(predicted: np.ndarray, true: np.ndarray, folds: int = CALIBRATION_FOLDS) -> np.ndarray:
    """Out-of-fold calibrated lengths: each prompt mapped by an isotonic fit on the other folds' prompts.

    K-fold cross-fitting (folds from `calibration_folds`): for each fold f, `fit_calibration` on the prompts
    outside f, applied to the predictions of the prompts in f. The mean absolute error of the result against
    `true` scores calibration on prompts the map was not fitted on (a map fitted on all n and scored on the
    same n is optimistic: isotonic regression averages each prompt's own true length into its value).

    Args:
        predicted: [n] predicted lengths in tokens.
        true: [n] measured mean lengths in tokens, same prompts.
        folds: number of folds K, 2 <= K <= n (K = n is leave-one-out).

    Returns:
        float64 [n] out-of-fold calibrated lengths (input order).

    Raises:
        ValueError: bad `folds`, empty input, mismatched shapes or NaN/inf values.
    """
    p = np.asarray(predicted, dtype=np.float64)
    t = np.asarray(true, dtype=np.float64)
    if p.ndim != 1 or p.shape != t.shape:
        raise ValueError(f"predicted and true must be 1-D arrays of equal length; got {p.shape}, {t.shape}")
    fold = calibration_folds(p, folds)
    out = np.empty_like(p)
    for f in range(folds):
        held = fold == f
        out[held] = fit_calibration(p[~held], t[~held])(p[held])
    return out
