"""Training losses for the length predictor (pure torch, no I/O).

The predictor outputs one score per prompt, meant as log(1 + mean response length). Three families:

* ``mse``: squared error on the log1p targets (anchors the scale, so predictions are lengths).
* ``pairwise``: RankNet logistic loss over every ordered pair in the batch with different targets.
* ``listwise``: ListNet top-one cross-entropy between softmax(targets) and softmax(predictions).

Ranking losses only fix the order (they are shift invariant), so ``mse+pairwise`` / ``mse+listwise`` mix them
with MSE. Run the tests with ``.venv/bin/python -m pytest tests/predictor/test_losses.py -q``.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F

LossKind = Literal["mse", "pairwise", "listwise", "mse+pairwise", "mse+listwise"]
LOSS_KINDS: tuple[str, ...] = ("mse", "pairwise", "listwise", "mse+pairwise", "mse+listwise")


def _check(pred: torch.Tensor, target: torch.Tensor) -> None:
    if pred.ndim != 1 or pred.shape != target.shape:
        raise ValueError(
            f"pred and target must both have shape [batch]; got {tuple(pred.shape)} and {tuple(target.shape)}"
        )
    if pred.numel() == 0:
        raise ValueError("loss of an empty batch is undefined; pass at least one prompt")


def mse_loss(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean squared error on the log1p scale.

    Args:
        pred: [batch] predicted log(1 + length).
        target: [batch] true log(1 + mean length).

    Returns:
        Scalar tensor.
    """
    _check(pred, target)
    return F.mse_loss(pred, target.to(pred.dtype))


def pairwise_ranking_loss(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """RankNet loss: mean of log(1 + exp(-(s_i - s_j))) over pairs with target_i > target_j.

    Pairs with equal targets carry no order and are skipped. A batch without any such pair gives a zero
    loss that still depends on ``pred`` (so ``backward`` works).

    Args:
        pred: [batch] scores (any monotone transform of length).
        target: [batch] true values (only their order matters).

    Returns:
        Scalar tensor.
    """
    _check(pred, target)
    diff = pred[:, None] - pred[None, :]  # [b, b]: s_i - s_j
    longer = target[:, None] > target[None, :]  # [b, b]: i should rank above j
    if not bool(longer.any()):
        return pred.sum() * 0.0
    return F.softplus(-diff[longer]).mean()


def listwise_loss(pred: torch.Tensor, target: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """ListNet top-one loss: cross-entropy -sum_i p_i log q_i with p = softmax(target / T), q = softmax(pred).

    Its minimum is the entropy of p (not zero); it is reached when pred = target / T + constant.

    Args:
        pred: [batch] scores.
        target: [batch] true log1p lengths.
        temperature: divides the targets before the softmax; smaller values focus on the longest prompts.

    Returns:
        Scalar tensor.
    """
    _check(pred, target)
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    p_true = torch.softmax(target.to(pred.dtype) / temperature, dim=0)
    return -(p_true * torch.log_softmax(pred, dim=0)).sum()


def combined_loss(pred: torch.Tensor, target: torch.Tensor, kind: str, rank_weight: float = 1.0) -> torch.Tensor:
    """The training objective selected by ``kind``.

    Args:
        pred: [batch] predicted log(1 + length).
        target: [batch] true log(1 + mean length).
        kind: one of ``LOSS_KINDS``; ``mse+pairwise`` = mse + rank_weight * pairwise (same for listwise).
        rank_weight: weight of the ranking term in the mixed kinds (ignored otherwise).

    Returns:
        Scalar tensor.
    """
    if kind == "mse":
        return mse_loss(pred, target)
    if kind == "pairwise":
        return pairwise_ranking_loss(pred, target)
    if kind == "listwise":
        return listwise_loss(pred, target)
    if kind == "mse+pairwise":
        return mse_loss(pred, target) + rank_weight * pairwise_ranking_loss(pred, target)
    if kind == "mse+listwise":
        return mse_loss(pred, target) + rank_weight * listwise_loss(pred, target)
    raise ValueError(f"unknown loss kind {kind!r}; choose one of {', '.join(LOSS_KINDS)}")
