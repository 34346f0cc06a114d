"""GRPO policy loss: clipped importance ratio against the behaviour policy, optional KL to a reference, and
token- or sequence-level aggregation that stays exact under gradient accumulation. Pure torch.

Per response token j of a sample with advantage A (all tokens of a sample share it)::

    r_j   = exp(log pi_theta(y_j) - log pi_behaviour(y_j))            (behaviour = the engine's log-probs)
    pg_j  = -min(r_j * A, clip(r_j, 1 - clip_low, 1 + clip_high) * A)
    kl_j  = exp(ref_j - logp_j) - (ref_j - logp_j) - 1                 (k3 estimator of KL(pi_theta || ref))
    l_j   = pg_j + kl_coef * kl_j

Aggregation (``aggregation``):

* ``"token"``: sum of l_j over every response token of the global batch / number of those tokens (DAPO);
* ``"sequence"``: per sample the mean of its l_j, then the mean over the samples (original GRPO).

The denominator is always the *global* batch's (`loss_denominator`), and each micro-batch contributes its
partial sum divided by it, so summing micro-batch gradients gives exactly the full-batch gradient.

Run the tests with ``python -m pytest tests/rl -q``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

# runtime.grpo.loss_aggregation is typed with these choices (tests/test_config.py checks they agree)
AGGREGATIONS = ("token", "sequence")


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Log-probability of each target token under ``softmax(logits / temperature)``.

    The engines' default ``processed_logprobs`` are ``log_softmax(logits / T)`` (top_p = 1), so the trainer
    scores tokens with the same temperature; ``temperature <= 0`` (greedy) scores with T = 1.

    Args:
        logits: (R, L, V) float logits.
        targets: (R, L) int64 token ids.
        temperature: sampling temperature of the behaviour policy.

    Returns:
        (R, L) float32 log-probs.
    """
    t = temperature if temperature > 0 else 1.0
    scaled = logits.float() / t if t != 1.0 else logits.float()
    return torch.log_softmax(scaled, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k3 estimator of KL(pi || ref) per token: ``exp(ref - logp) - (ref - logp) - 1`` (>= 0, unbiased).

    Example: logp = log 0.5, ref = log 0.25 -> d = log 0.5 = -0.693: 0.5 + 0.693 - 1 = 0.193.
    """
    d = ref_logp - logp
    return torch.exp(d) - d - 1.0


def clipped_policy_loss(
    logp: torch.Tensor, behaviour_logp: torch.Tensor, advantages: torch.Tensor, clip_low: float, clip_high: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token clipped surrogate loss.

    Args:
        logp: (R, L) log-probs under the policy being trained (with grad).
        behaviour_logp: (R, L) log-probs the engine sampled with.
        advantages: (R,) or (R, L) advantages.
        clip_low, clip_high: ratio clipped to [1 - clip_low, 1 + clip_high].

    Returns:
        (loss, ratio, clipped): (R, L) per-token loss, ratio and a bool mask of tokens where the clipped
        branch is the active one (no gradient flows there).

    Example: ratio 1.5, A = +1, clip 0.2 -> min(1.5, 1.2) = 1.2 -> loss -1.2 (clipped);
    ratio 1.5, A = -1 -> min(-1.5, -1.2) = -1.5 -> loss 1.5 (not clipped).
    """
    adv = advantages.unsqueeze(-1) if advantages.dim() == 1 else advantages
    ratio = torch.exp(logp - behaviour_logp)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * adv
    return -torch.minimum(unclipped, clipped), ratio, clipped < unclipped


def loss_denominator(lengths: np.ndarray, aggregation: str) -> float:
    """The global batch's normalizer: response tokens (``"token"``) or samples with >= 1 token (``"sequence"``).

    Example: lengths [3, 1, 0] -> token: 4, sequence: 2.
    """
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {aggregation!r}")
    lengths = np.asarray(lengths)
    value = lengths.sum() if aggregation == "token" else (lengths > 0).sum()
    return float(max(value, 1))


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, aggregation: str, denominator: float) -> torch.Tensor:
    """Partial sum of a micro-batch's per-token values, divided by the global `denominator`.

    Args:
        per_token: (R, L) values; mask: (R, L) 1.0 on response tokens, 0.0 elsewhere.
        aggregation: ``"token"`` (sum of tokens) or ``"sequence"`` (sum over rows of the row's token mean).
        denominator: `loss_denominator` of the whole global batch.

    Example: rows [1, 3] (2 tokens) and [2] (1 token): token = (1 + 3 + 2) / 3 = 2.0,
    sequence = (2 + 2) / 2 = 2.0; rows [1, 3] and [5]: token 3.0, sequence (2 + 5) / 2 = 3.5.
    """
    masked = per_token * mask
    if aggregation == "token":
        return masked.sum() / denominator
    if aggregation == "sequence":
        counts = mask.sum(dim=-1)
        rows = masked.sum(dim=-1) / counts.clamp(min=1.0)
        return rows[counts > 0].sum() / denominator
    raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {aggregation!r}")


@dataclass(slots=True)
class LossParts:
    """One micro-batch's loss (already divided by the global denominator) and token sums for metrics.

    Attributes:
        loss: scalar to backpropagate.
        pg_sum, kl_sum, ratio_sum, clipped_sum, abs_logratio_sum: sums over the micro-batch's response tokens.
        ratio_max: largest ratio; tokens: response tokens.
    """

    loss: torch.Tensor
    pg_sum: float
    kl_sum: float
    ratio_sum: float
    ratio_max: float
    clipped_sum: float
    abs_logratio_sum: float
    tokens: float


def grpo_loss(
    logp: torch.Tensor,
    behaviour_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float,
    clip_high: float,
    aggregation: str,
    denominator: float,
    kl_coef: float,
    ref_logp: torch.Tensor | None = None,
) -> LossParts:
    """GRPO loss of one micro-batch (see the module docstring).

    Args:
        logp, behaviour_logp: (R, L) log-probs (policy with grad, engine's behaviour).
        advantages: (R,) per-sample advantages.
        mask: (R, L) float, 1.0 on response tokens.
        clip_low, clip_high: ratio clip range [1 - clip_low, 1 + clip_high].
        aggregation, denominator: see `aggregate` / `loss_denominator`.
        kl_coef: weight of the k3 KL term (0 disables it; then `ref_logp` may be None).
        ref_logp: (R, L) reference-policy log-probs.
    """
    pg, ratio, clipped = clipped_policy_loss(logp, behaviour_logp, advantages, clip_low, clip_high)
    per_token = pg
    kl_sum = 0.0
    if kl_coef > 0:
        if ref_logp is None:
            raise ValueError("kl_coef > 0 needs ref_logp")
        kl = kl_k3(logp, ref_logp)
        per_token = pg + kl_coef * kl
        kl_sum = float((kl.detach() * mask).sum())
    loss = aggregate(per_token, mask, aggregation, denominator)
    with torch.no_grad():
        on = mask > 0
        return LossParts(
            loss=loss,
            pg_sum=float((pg * mask).sum()),
            kl_sum=kl_sum,
            ratio_sum=float((ratio * mask).sum()),
            ratio_max=float(ratio[on].max()) if on.any() else 1.0,
            clipped_sum=float((clipped & on).sum()),
            abs_logratio_sum=float(((logp - behaviour_logp).abs() * mask).sum()),
            tokens=float(mask.sum()),
        )
