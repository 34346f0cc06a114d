"""Schedule quality metrics on (true or predicted) lengths, as defined in paper appendix F.6.2.

For minibatches I_1..I_NB in dispatch order and lengths l:

* dispersion D = mean_j std{l_i : i in I_j}            (tokens; population std)
* padding P   = mean_j (1 - mean_j / max_j)            (fraction of decode slots wasted)
* group load L_g = sum of l over the k consecutive minibatches of group g; CV = std(L) / mean(L) and
  spread = max(L) / min(L), over complete groups only (a trailing partial group of N_B mod k minibatches is
  left out: its load is not comparable).

Run the checks: `.venv/bin/python -m pytest tests/schedule/test_metrics.py -q`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from asp.schedule.validate import as_int, as_lengths


def _flatten(minibatches: Sequence[np.ndarray] | Any) -> tuple[np.ndarray, np.ndarray]:
    """(positions, offsets) from a Schedule or a sequence of index arrays in dispatch order."""
    if hasattr(minibatches, "positions") and hasattr(minibatches, "offsets"):
        return np.asarray(minibatches.positions, dtype=np.int64), np.asarray(minibatches.offsets, dtype=np.int64)
    parts = [np.asarray(m, dtype=np.int64).reshape(-1) for m in minibatches]
    if not parts or any(p.size == 0 for p in parts):
        raise ValueError("minibatches must be a non-empty sequence of non-empty index arrays")
    sizes = np.array([p.size for p in parts], dtype=np.int64)
    return np.concatenate(parts), np.concatenate(([0], np.cumsum(sizes)))


def group_stats(group_load: np.ndarray) -> tuple[float, float]:
    """(CV, spread) of group loads; (0.0, 1.0) when there are fewer than two groups."""
    if group_load.size < 2:
        return 0.0, 1.0
    return float(group_load.std() / group_load.mean()), float(group_load.max() / group_load.min())


def schedule_metrics(lengths: object, schedule_or_minibatches: Any, k: int | None = None) -> dict[str, float]:
    """Dispersion, padding rate and batch-group balance of a schedule, measured on `lengths`.

    Args:
        lengths: (n,) lengths indexed like the prompts given to `build_schedule` (true lengths for realized
            metrics, predicted or calibrated ones for predicted metrics); finite, > 0.
        schedule_or_minibatches: a `Schedule` or a sequence of index arrays into `lengths`, in dispatch order.
        k: minibatches per batch group; defaults to the schedule's k.

    Returns:
        dict with D (tokens), P (fraction), CV, spread, n_minibatches, n_groups (complete groups used),
        mean_group_load (tokens).

    Raises:
        ValueError: bad lengths, k < 1, indices out of range.

    Example:
        >>> m = schedule_metrics([1, 3, 2, 2], [[0, 1], [2, 3]], k=1)  # D = (1 + 0) / 2, P = (1/3 + 0) / 2
        >>> (m["D"], round(m["P"], 4), m["CV"], m["spread"])  # groups of 1: loads 4 and 4
        (0.5, 0.1667, 0.0, 1.0)
    """
    values = as_lengths(lengths, "lengths")
    if k is None:
        k = getattr(schedule_or_minibatches, "k", None)
        if k is None:
            raise ValueError("k is required when passing minibatches rather than a Schedule")
    k = as_int(k, "k", minimum=1)
    positions, offsets = _flatten(schedule_or_minibatches)
    if positions.min() < 0 or positions.max() >= values.size:
        raise ValueError(f"minibatch indices must lie in [0, {values.size}); got {positions.min()}..{positions.max()}")
    return dispatch_metrics(values[positions], offsets, k)


def dispatch_metrics(x: np.ndarray, offsets: np.ndarray, k: int) -> dict[str, float]:
    """`schedule_metrics` on lengths already in dispatch order.

    Args:
        x: (n,) float64 lengths in dispatch order (minibatch after minibatch).
        offsets: (N_B + 1,) int64 minibatch boundaries into x.
        k: minibatches per group.

    Returns:
        The same dict as `schedule_metrics`.
    """
    starts, sizes = offsets[:-1], np.diff(offsets)
    sums = np.add.reduceat(x, starts)
    means = sums / sizes
    centred = x - np.repeat(means, sizes)
    var = np.add.reduceat(centred * centred, starts) / sizes
    maxima = np.maximum.reduceat(x, starts)
    n_full = sizes.size // k
    groups = sums[: n_full * k].reshape(n_full, k).sum(axis=1) if n_full else np.zeros(0)
    cv, spread = group_stats(groups)
    return {
        "D": float(np.sqrt(var).mean()),
        "P": float((1.0 - means / maxima).mean()),
        "CV": cv,
        "spread": spread,
        "n_minibatches": int(sizes.size),
        "n_groups": int(n_full),
        "mean_group_load": float(groups.mean()) if n_full else float("nan"),
    }
