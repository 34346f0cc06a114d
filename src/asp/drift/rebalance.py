"""Re-balance scheduled minibatches on new loads: the `recalibrate` drift action's scheduling step (docs/drift.md).

When the calibration map is refitted during a run, the minibatches that are still pending keep their prompts
(the DP cut them on predicted order, which a monotone recalibration does not change) but their loads change,
so the batch groups are rebuilt: `rebalance(minibatches, loads, k)` sums each minibatch's per-prompt loads,
orders the minibatches with `asp.schedule.balance.balance_groups` (the scheduler's own balancing, same method,
iterations and seed semantics) and returns them in dispatch order with their group ids (group g = dispatch
positions g*k .. g*k+k-1, the last one possibly partial), ready for `WorkPlan.from_lists`.

Pure numpy (+ the scheduler's numba kernels), no I/O. Run the tests:
`.venv/bin/python -m pytest tests/drift/test_rebalance.py -q`.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence

import numpy as np

from asp.schedule.balance import balance_groups, shuffle_groups

UNBALANCED = "sorted"  # keep the given order (re-grouping only), as `build_schedule`'s method "sorted"


def minibatch_loads(minibatches: Sequence[Sequence[Hashable]], loads: Mapping[Hashable, float]) -> np.ndarray:
    """(N_B,) float64 sum of the per-prompt `loads` of each minibatch.

    Raises:
        ValueError: a minibatch is empty or a prompt has no load (names the first one).
    """
    out = np.empty(len(minibatches), dtype=np.float64)
    for p, mb in enumerate(minibatches):
        if len(mb) == 0:
            raise ValueError(f"minibatch {p} is empty")
        missing = next((pid for pid in mb if pid not in loads), None)
        if missing is not None:
            raise ValueError(f"prompt {missing!r} of minibatch {p} has no load")
        out[p] = sum(float(loads[pid]) for pid in mb)
    return out


def rebalance(
    minibatches: Sequence[Sequence[Hashable]],
    loads: Mapping[Hashable, float],
    k: int,
    *,
    method: str,
    seed: int,
    shuffle: bool = True,
    iterations: int,
) -> tuple[list[list[Hashable]], list[int]]:
    """Re-group and re-order minibatches so that batch groups of `k` carry balanced `loads`.

    Args:
        minibatches: N_B lists of prompt ids (e.g. the pending minibatches, in their current dispatch order).
        loads: prompt id -> load (expected tokens per response, e.g. the refitted calibrated length), > 0.
        k: minibatches per batch group (`schedule.k`).
        method: a `balance_groups` method ("asp", "paper_sa", "kk", "lpt", "snake"), or "sorted" to keep the
            given order and only re-number the groups.
        seed: balancing / shuffle seed (the result is a deterministic function of the arguments).
        shuffle: permute whole complete groups afterwards (`schedule.shuffle_groups`).
        iterations: annealing proposals ("asp", "paper_sa").

    Returns:
        (minibatches in the new dispatch order, each the same prompt list as given; (N_B,) group ids
        ``position // k``).

    Raises:
        ValueError: no minibatches, an empty minibatch, a prompt without a load, loads not finite and > 0,
            or bad balancing arguments (from `balance_groups`).

    Example:
        >>> mbs, groups = rebalance([["a"], ["b"], ["c"], ["d"]], {"a": 1, "b": 2, "c": 3, "d": 4}, 2,
        ...                         method="asp", seed=0, shuffle=False, iterations=1000)
        >>> mbs, groups  # groups {d, a} and {c, b}: 5 and 5
        ([['d'], ['a'], ['c'], ['b']], [0, 0, 1, 1])
    """
    if len(minibatches) == 0:
        raise ValueError("rebalance needs at least one minibatch")
    per_mb = minibatch_loads(minibatches, loads)
    if method == UNBALANCED:
        perm = np.arange(per_mb.size, dtype=np.int64)
        perm = shuffle_groups(perm, k, seed) if shuffle else perm
    else:
        perm = balance_groups(per_mb, k, iterations=iterations, seed=seed, method=method, shuffle=shuffle)
    ordered = [list(minibatches[int(i)]) for i in perm]
    return ordered, [p // k for p in range(len(ordered))]
