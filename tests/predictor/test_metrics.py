"""Ranking metrics against values worked out by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from asp.predictor.metrics import bucket_errors, kendall_tau, pairwise_accuracy, ranking_metrics


def test_ranking_metrics_by_hand() -> None:
    # true order 10 < 20 < 30 < 40 = items 0, 1, 3, 2; pred order 0, 1, 2, 3 -> one discordant pair (2, 3) of 6
    # tau = (5 - 1) / 6 = 0.6667; spearman: rank diffs 0, 0, 1, 1 -> 1 - 6 * 2 / (4 * 15) = 0.8
    # MAE = (9 + 18 + 37 + 26) / 4 = 22.5; pairwise accuracy 5 / 6
    m = ranking_metrics(np.array([1, 2, 3, 4.0]), np.array([10, 20, 40, 30.0]))
    assert m["kendall_tau"] == pytest.approx(2 / 3)
    assert m["spearman"] == pytest.approx(0.8)
    assert m["mae_tokens"] == pytest.approx(22.5)
    assert m["pairwise_accuracy"] == pytest.approx(5 / 6)
    assert m["n"] == 4


def test_pairwise_accuracy_ties() -> None:
    # a tie in pred counts one half: pairs (0,1) tie -> 0.5, (0,2), (1,2) right -> 2.5 / 3
    assert pairwise_accuracy(np.array([1, 1, 2.0]), np.array([1, 2, 3.0])) == pytest.approx(2.5 / 3)
    # pairs tied in true are skipped: only (0,2), (1,2) count, both right -> 1.0
    assert pairwise_accuracy(np.array([1, 2, 3.0]), np.array([1, 1, 2.0])) == pytest.approx(1.0)
    # chunking does not change the answer
    rng = np.random.default_rng(0)
    p, t = rng.normal(size=50), rng.integers(0, 5, size=50).astype(float)
    assert pairwise_accuracy(p, t, chunk=7) == pytest.approx(pairwise_accuracy(p, t, chunk=1000))


def test_pairwise_accuracy_matches_tau_without_ties() -> None:
    # without ties, accuracy = (1 + tau) / 2
    rng = np.random.default_rng(1)
    p, t = rng.normal(size=40), rng.normal(size=40)
    m = ranking_metrics(p, t)
    assert m["pairwise_accuracy"] == pytest.approx((1 + m["kendall_tau"]) / 2)


def test_undefined_and_bad_inputs() -> None:
    with pytest.raises(ValueError, match="all 3 true lengths are equal"):
        ranking_metrics(np.array([1, 2, 3.0]), np.array([5, 5, 5.0]))
    with pytest.raises(ValueError, match="all 3 predicted lengths are equal"):
        ranking_metrics(np.array([4, 4, 4.0]), np.array([1, 2, 3.0]))
    with pytest.raises(ValueError, match="NaN"):
        ranking_metrics(np.array([1, math.nan, 3.0]), np.array([1, 2, 3.0]))
    with pytest.raises(ValueError, match="true contains 1 NaN"):
        ranking_metrics(np.array([1, 2, 3.0]), np.array([1, 2, math.nan]))
    with pytest.raises(ValueError, match="same length"):
        ranking_metrics(np.array([1, 2.0]), np.array([1, 2, 3.0]))
    with pytest.raises(ValueError, match="at least 2"):
        ranking_metrics(np.array([1.0]), np.array([1.0]))


def test_kendall_tau_by_hand_and_undefined_cases() -> None:
    # tau-b with a tie in pred: pairs of [1, 1, 2] vs [1, 2, 3]: (0,1) tied in pred, (0,2), (1,2) concordant
    # tau-b = (2 - 0) / sqrt((3 - 1) * 3) = 2 / sqrt(6)
    assert kendall_tau(np.array([1, 1, 2.0]), np.array([1, 2, 3.0])) == pytest.approx(2 / math.sqrt(6))
    assert kendall_tau([4, 3, 2, 1], [1, 2, 3, 4]) == pytest.approx(-1.0)
    # undefined: NaN instead of an error (the training loop's early stopping keeps going)
    assert math.isnan(kendall_tau(np.array([5, 5, 5.0]), np.array([1, 2, 3.0])))
    assert math.isnan(kendall_tau(np.array([1, 2, 3.0]), np.array([7, 7, 7.0])))
    assert math.isnan(kendall_tau(np.array([1.0]), np.array([2.0])))
    with pytest.raises(ValueError, match="same length"):
        kendall_tau(np.array([1, 2.0]), np.array([1, 2, 3.0]))
    with pytest.raises(ValueError, match="NaN"):
        kendall_tau(np.array([1, math.nan]), np.array([1, 2.0]))


def test_bucket_errors_by_hand() -> None:
    # true 12 -> [0, 16): err -2; true 20 -> [16, 64): err +10, mape 10/20; true 90 -> [64, inf]: err +10
    b = bucket_errors(np.array([10, 30, 100.0]), np.array([12, 20, 90.0]), [0, 16, 64, math.inf])
    assert [x["count"] for x in b] == [1, 1, 1]
    assert [x["mae_tokens"] for x in b] == [2.0, 10.0, 10.0]
    assert [x["bias_tokens"] for x in b] == [-2.0, 10.0, 10.0]
    assert b[1]["mape"] == pytest.approx(0.5)
    # the last bucket includes its upper edge; an empty bucket has None errors
    b = bucket_errors(np.array([1, 2.0]), np.array([5, 10.0]), [0, 3, 6, 10])
    assert [x["count"] for x in b] == [0, 1, 1]
    assert b[0]["mae_tokens"] is None
    with pytest.raises(ValueError, match="strictly increasing"):
        bucket_errors(np.array([1, 2.0]), np.array([5, 10.0]), [0, 10, 5])


def test_sample_baselines_hand_worked():
    from asp.predictor.metrics import sample_baselines

    # history: first half [1], [5], [2] ranks second half [3], [7], [4] -> tau 1; probe: the same here
    out = sample_baselines([np.array([1, 3]), np.array([5, 7]), np.array([2, 4]), np.array([9])])
    assert out == {"history_tau": 1.0, "probe_tau": 1.0, "prompts": 3.0}  # the one-sample prompt is skipped
    # four samples: history = means of [0:2] vs [2:4]; probe = sample 0 vs mean of [1:4]
    rows = [np.array([1, 9, 4, 4]), np.array([6, 2, 1, 1]), np.array([3, 3, 8, 8])]
    out = sample_baselines(rows)
    # history: (5, 4, 3) vs (4, 1, 8): pairs (0,1) +, (0,2) -, (1,2) - -> -1/3; probe: (1, 6, 3) vs (17/3, 4/3, 19/3):
    # (0,1) -, (0,2) +, (1,2) - -> -1/3
    assert out["history_tau"] == pytest.approx(-1 / 3) and out["probe_tau"] == pytest.approx(-1 / 3)
    assert np.isnan(sample_baselines([np.array([1, 2])])["history_tau"])
