"""GRPO group-normalized advantages (Shao et al. 2024): each response is scored against the other responses
to the same prompt. Pure numpy.

For the n rewards r_1..r_n of one prompt, ``A_i = (r_i - mean(r)) / (std(r) + eps)`` with the unbiased
(n - 1) standard deviation, as TRL and verl compute it; ``scale="none"`` keeps ``r_i - mean(r)``
(Dr. GRPO). A group whose rewards are all equal carries no signal: its advantages are exactly 0.

Run the tests with ``python -m pytest tests/rl -q``.
"""

from __future__ import annotations

import numpy as np

ADVANTAGE_SCALES = ("std", "none")  # the config types runtime.grpo.advantage_scale with these (tests/test_config.py)


def group_advantages(rewards: np.ndarray, n: int, *, scale: str = "std", eps: float = 1e-6) -> np.ndarray:
    """Group-normalized advantages.

    Args:
        rewards: (S,) float rewards, S = B * n; sample s belongs to prompt ``s // n``.
        n: responses per prompt (group size).
        scale: ``"std"`` divides by the group's unbiased standard deviation + eps; ``"none"`` only centres.
        eps: added to the standard deviation.

    Returns:
        (S,) float64 advantages (0 for groups of one response or with equal rewards).

    Raises:
        ValueError: S not a multiple of n, n < 1, non-finite rewards or an unknown `scale`.

    Example: rewards [1, 0, 0, 1] with n = 4: mean 0.5, unbiased std sqrt(4 * 0.25 / 3) = 0.5774,
    advantages [0.866, -0.866, -0.866, 0.866].
    """
    if scale not in ADVANTAGE_SCALES:
        raise ValueError(f"scale must be one of {ADVANTAGE_SCALES}, got {scale!r}")
    r = np.asarray(rewards, dtype=np.float64)
    if n < 1 or r.ndim != 1 or r.size % n:
        raise ValueError(f"need 1-D rewards whose size ({r.size}) is a multiple of n = {n} >= 1")
    if not np.isfinite(r).all():
        raise ValueError("rewards must be finite (a failed reward should be 0, not NaN)")
    groups = r.reshape(-1, n)
    centred = groups - groups.mean(axis=1, keepdims=True)
    if scale == "std" and n > 1:
        std = groups.std(axis=1, ddof=1, keepdims=True)
        centred = np.where(std > 0, centred / (std + eps), 0.0)
    elif n == 1:
        centred = np.zeros_like(centred)
    return centred.reshape(-1)


def zero_signal_groups(rewards: np.ndarray, n: int) -> int:
    """Number of prompts whose n rewards are all equal (their advantages are 0).

    Example: rewards [1, 1, 0, 1] with n = 2 -> prompt 0 equal, prompt 1 not -> 1.
    """
    groups = np.asarray(rewards, dtype=np.float64).reshape(-1, n)
    return int((np.ptp(groups, axis=1) == 0).sum())
