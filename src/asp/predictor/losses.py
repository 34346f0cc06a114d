"""Training losses for the length predictor (pure torch, no I/O).

The predictor outputs one score per prompt, meant as log(1 + mean response length). Three families:

* ``mse``: squared error on the log1p targets (anchors the scale, so predictions are lengths).
* ``pairwise``: RankNet logistic loss over every ordered pair in the batch with different targets.
* ``listwise``: ListNet top-one cross-entropy between softmax(targets) and softmax(predictions).
* ``listmle``: ListMLE, the Plackett-Luce likelihood of the batch's true order (longest first), as in vllm-ltr.
* ``margin``: pairwise hinge, mean of max(0, m - (s_i - s_j)) over pairs with target_i > target_j.

Ranking losses only fix the order (they are shift invariant), so ``mse+<ranking>`` mixes one of them with MSE
(``rank_weight`` weighs the ranking term).
Run the tests with ``.venv/bin/python -m pytest tests/predictor/test_losses.py -q``.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F

LossKind = Literal[
    "mse", "pairwise", "listwise", "listmle", "margin", "mse+pairwise", "mse+listwise", "mse+listmle", "mse+margin"
]
RANKING_LOSSES: tuple[str, ...] = ("pairwise", "listwise", "listmle", "margin")
LOSS_KINDS: tuple[str, ...] = ("mse", *RANKING_LOSSES, *(f"mse+{k}" for k in RANKING_LOSSES))
MARGIN = 0.1  # hinge margin of the ``margin`` loss, on the log1p scale (about 10 % longer)


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


def listmle_loss(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """ListMLE: negative Plackett-Luce log-likelihood of the true order (longest first), per prompt.

    With prompts sorted by target, descending (ties in batch order), the loss is
    sum_i [logsumexp(s_i, ..., s_n) - s_i] / n. Its minimum 0 is approached as the score gaps along the true
    order grow without bound, so mix it with MSE to keep the scale.

    Args:
        pred: [batch] scores.
        target: [batch] true values (only their order matters).

    Returns:
        Scalar tensor.
    """
    _check(pred, target)
    order = torch.argsort(target, descending=True, stable=True)
    s = pred[order]
    tail_lse = torch.logcumsumexp(s.flip(0), dim=0).flip(0)  # [b]: logsumexp(s_i..s_n)
    return (tail_lse - s).mean()


def margin_ranking_loss(pred: torch.Tensor, target: torch.Tensor, margin: float = MARGIN) -> torch.Tensor:
    """Pairwise hinge: mean of max(0, margin - (s_i - s_j)) over pairs with target_i > target_j.

    Args:
        pred: [batch] scores on the log1p scale.
        target: [batch] true values (only their order matters).
        margin: how far (log1p units) a longer prompt's score must exceed a shorter one's before a pair is free.

    Returns:
        Scalar tensor (zero, still depending on ``pred``, when no pair has an order).
    """
    _check(pred, target)
    diff = pred[:, None] - pred[None, :]
    longer = target[:, None] > target[None, :]
    if not bool(longer.any()):
        return pred.sum() * 0.0
    return F.relu(margin - diff[longer]).mean()


RANKING_FNS = {
    "pairwise": pairwise_ranking_loss,
    "listwise": listwise_loss,
    "listmle": listmle_loss,
    "margin": margin_ranking_loss,
}


def combined_loss(pred: torch.Tensor, target: torch.Tensor, kind: str, rank_weight: float) -> torch.Tensor:
    """The training objective selected by ``kind``.

    Args:
        pred: [batch] predicted log(1 + length).
        target: [batch] true log(1 + mean length).
        kind: one of ``LOSS_KINDS``; ``mse+pairwise`` = mse + rank_weight * pairwise (same for the other
            ranking losses).
        rank_weight: weight of the ranking term in the mixed kinds (ignored otherwise).

    Returns:
        Scalar tensor.
    """
    if kind == "mse":
        return mse_loss(pred, target)
    if kind in RANKING_FNS:
        return RANKING_FNS[kind](pred, target)
    rank = kind.removeprefix("mse+")
    if kind.startswith("mse+") and rank in RANKING_FNS:
        return mse_loss(pred, target) + rank_weight * RANKING_FNS[rank](pred, target)
    raise ValueError(f"unknown loss kind {kind!r}; choose one of {', '.join(LOSS_KINDS)}")
