"""Losses against values worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch

from asp.predictor.losses import (
    LOSS_KINDS,
    combined_loss,
    listmle_loss,
    listwise_loss,
    margin_ranking_loss,
    mse_loss,
    pairwise_ranking_loss,
)


def t(*v: float) -> torch.Tensor:
    return torch.tensor(v, dtype=torch.float32)


def test_mse_by_hand() -> None:
    # errors 1 and -2 -> (1 + 4) / 2 = 2.5
    assert mse_loss(t(1, 2), t(0, 4)).item() == pytest.approx(2.5)


def test_pairwise_single_pair() -> None:
    # target_0 > target_1, s_0 - s_1 = 1 -> log(1 + e^-1) = 0.313262
    assert pairwise_ranking_loss(t(1, 0), t(2, 1)).item() == pytest.approx(math.log1p(math.exp(-1)), abs=1e-6)
    # the wrong order costs more: s_0 - s_1 = -1 -> log(1 + e) = 1.313262
    assert pairwise_ranking_loss(t(0, 1), t(2, 1)).item() == pytest.approx(math.log1p(math.e), abs=1e-6)


def test_pairwise_skips_ties() -> None:
    # pred [0, 0, 1], target [1, 2, 2]: ordered pairs (1 over 0): diff 0 -> ln 2; (2 over 0): diff 1 -> 0.313262;
    # items 1 and 2 tie in target and are skipped -> mean (0.693147 + 0.313262) / 2 = 0.503204
    assert pairwise_ranking_loss(t(0, 0, 1), t(1, 2, 2)).item() == pytest.approx(0.503204, abs=1e-5)


def test_pairwise_no_pairs_is_zero_with_grad() -> None:
    pred = t(0.3, -1.0).requires_grad_()
    loss = pairwise_ranking_loss(pred, t(2, 2))
    loss.backward()
    assert loss.item() == 0.0
    assert pred.grad is not None and torch.all(pred.grad == 0)


def test_pairwise_gradient_raises_longer_prompt() -> None:
    pred = t(0, 0).requires_grad_()
    pairwise_ranking_loss(pred, t(1, 5)).backward()
    assert pred.grad[1] < 0 < pred.grad[0]  # descending the loss raises s_1 (the longer one) and lowers s_0


def test_listwise_by_hand() -> None:
    # p_true = softmax([0, ln 3]) = [1/4, 3/4]; q = softmax([0, 0]) = [1/2, 1/2] -> CE = ln 2 = 0.693147
    assert listwise_loss(t(0, 0), t(0, math.log(3))).item() == pytest.approx(math.log(2), abs=1e-6)
    # q = p_true -> CE = entropy = 0.25 ln 4 + 0.75 ln(4/3) = 0.346574 + 0.215762 = 0.562335
    assert listwise_loss(t(0, math.log(3)), t(0, math.log(3))).item() == pytest.approx(0.562335, abs=1e-6)
    # shift invariant
    assert listwise_loss(t(5, 5 + math.log(3)), t(0, math.log(3))).item() == pytest.approx(0.562335, abs=1e-6)


def test_combined_kinds() -> None:
    pred, target = t(1, 0), t(2, 1)
    # mse: errors -1, -1 -> 1.0; pairwise 0.313262; mse + 0.5 * pairwise = 1.156631
    assert combined_loss(pred, target, "mse", rank_weight=1.0).item() == pytest.approx(1.0)
    assert combined_loss(pred, target, "pairwise", rank_weight=1.0).item() == pytest.approx(0.313262, abs=1e-6)
    assert combined_loss(pred, target, "mse+pairwise", rank_weight=0.5).item() == pytest.approx(1.156631, abs=1e-6)
    expected = 1.0 + 2.0 * listwise_loss(pred, target).item()
    assert combined_loss(pred, target, "mse+listwise", rank_weight=2.0).item() == pytest.approx(expected)
    with pytest.raises(ValueError, match="unknown loss kind 'huber'"):
        combined_loss(pred, target, "huber", rank_weight=1.0)


def test_listmle_by_hand() -> None:
    # true order (longest first): item 1 (target 5), item 0 (3), item 2 (1); scores in that order s = [2, 0, 1]
    # -> [lse(2, 0, 1) - 2 + lse(0, 1) - 0 + lse(1) - 1] / 3 = [0.407606 + 1.313262 + 0] / 3 = 0.573623
    assert listmle_loss(t(0, 2, 1), t(3, 5, 1)).item() == pytest.approx(0.573623, abs=1e-5)
    # two items in the right order with gap d: log(1 + e^-d) / 2 -> d = 0 gives ln 2 / 2
    assert listmle_loss(t(0, 0), t(1, 2)).item() == pytest.approx(math.log(2) / 2, abs=1e-6)
    # shift invariant, and the right order costs less than the wrong one
    assert listmle_loss(t(3, 5, 4), t(3, 5, 1)).item() == pytest.approx(0.573623, abs=1e-5)
    assert listmle_loss(t(1, 0), t(2, 1)).item() < listmle_loss(t(0, 1), t(2, 1)).item()


def test_margin_by_hand() -> None:
    # one ordered pair (0 over 1): gap 0.04 < margin 0.1 -> 0.06; gap 0.5 -> 0; wrong order gap -1 -> 1.1
    assert margin_ranking_loss(t(0.04, 0), t(2, 1)).item() == pytest.approx(0.06, abs=1e-6)
    assert margin_ranking_loss(t(0.5, 0), t(2, 1)).item() == 0.0
    assert margin_ranking_loss(t(0, 1), t(2, 1)).item() == pytest.approx(1.1, abs=1e-6)
    pred = t(0.3, -1.0).requires_grad_()  # tied targets: no pair, zero loss that still backpropagates
    margin_ranking_loss(pred, t(2, 2)).backward()
    assert pred.grad is not None and torch.all(pred.grad == 0)


def test_every_mixed_kind_is_mse_plus_its_ranking_loss() -> None:
    pred, target = t(0.2, 1.0, -0.3), t(1, 3, 2)
    mse = mse_loss(pred, target).item()
    for kind in LOSS_KINDS:
        if kind.startswith("mse+"):
            rank = combined_loss(pred, target, kind.removeprefix("mse+"), rank_weight=1.0).item()
            assert combined_loss(pred, target, kind, rank_weight=0.5).item() == pytest.approx(mse + 0.5 * rank)


def test_shape_errors() -> None:
    with pytest.raises(ValueError, match="shape"):
        mse_loss(t(1, 2), t(1))
    with pytest.raises(ValueError, match="empty"):
        pairwise_ranking_loss(t(), t())
