"""Schedule metrics (paper F.6.2 definitions) on hand-worked cases."""

from __future__ import annotations

import numpy as np
import pytest

from asp.schedule import kendall_tau, schedule_metrics


def test_hand_worked_metrics() -> None:
    lengths = np.array([2.0, 4.0, 6.0, 6.0, 1.0, 3.0, 8.0, 8.0])
    mbs = [[0, 1], [2, 3], [4, 5], [6, 7]]
    m = schedule_metrics(lengths, mbs, k=2)
    # std: [2,4] -> 1, [6,6] -> 0, [1,3] -> 1, [8,8] -> 0  => D = 0.5
    assert m["D"] == pytest.approx(0.5)
    # padding 1 - mean/max: 1 - 3/4, 0, 1 - 2/3, 0  => P = (0.25 + 1/3) / 4
    assert m["P"] == pytest.approx((0.25 + 1 / 3) / 4)
    # groups of 2 minibatches: 6 + 12 = 18 and 4 + 16 = 20 => CV = 1 / 19, spread = 20 / 18
    assert m["CV"] == pytest.approx(1 / 19)
    assert m["spread"] == pytest.approx(20 / 18)
    assert (m["n_minibatches"], m["n_groups"], m["mean_group_load"]) == (4, 2, 19.0)


def test_partial_group_is_left_out() -> None:
    lengths = np.array([5.0, 5.0, 5.0, 5.0, 100.0])
    m = schedule_metrics(lengths, [[0], [1], [2], [3], [4]], k=2)  # groups {5,5} {5,5} and partial {100}
    assert (m["CV"], m["spread"], m["n_groups"]) == (0.0, 1.0, 2)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="k is required"):
        schedule_metrics([1.0, 2.0], [[0, 1]])
    with pytest.raises(ValueError, match="indices must lie"):
        schedule_metrics([1.0, 2.0], [[0, 2]], k=1)
    with pytest.raises(ValueError, match="non-empty"):
        schedule_metrics([1.0, 2.0], [[0], []], k=1)
    with pytest.raises(ValueError, match="NaN"):
        schedule_metrics([1.0, np.nan], [[0, 1]], k=1)


def test_kendall_tau() -> None:
    assert kendall_tau([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert kendall_tau([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # 6 pairs: (1,2) concordant, (1,3) concordant, (2,3) discordant, ... tau-a = (5 - 1) / 6
    assert kendall_tau([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(4 / 6)
    with pytest.raises(ValueError, match="same length"):
        kendall_tau([1, 2], [1, 2, 3])


def test_kendall_tau_is_the_predictors() -> None:
    """One implementation: the scheduler re-exports the predictor's tau (and isotonic fit)."""
    from asp.predictor import calibration, metrics
    from asp.schedule import fit_isotonic

    assert kendall_tau is metrics.kendall_tau and fit_isotonic is calibration.fit_isotonic
