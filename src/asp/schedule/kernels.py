"""Numba kernels behind `asp.schedule.balance` (no validation here: call the typed wrappers in balance.py).

* `stable_argsort`: exact stable argsort in O(n) for typical inputs (bucket scatter by value, then a tiny
  sort inside each bucket); already-sorted input costs one pass.
* `lpt_rounds_groups` (the default method's start), `snake_groups` (the paper's suggested snake deal) and
  `perm_from_groups` (group assignment -> dispatch order); both starts place a trailing partial group with
  `place_partial_group` (its ranks: `partial_ranks`, also used by the "kk" method).
* The annealers (`paper_sa`, `anneal_directed`) and their RNG live in `anneal.py`.
"""

from __future__ import annotations

import numba as nb
import numpy as np


@nb.njit(cache=True, nogil=True)
def is_sorted(x):  # pragma: no cover - compiled
    """Whether x is non-decreasing."""
    for i in range(1, x.shape[0]):  # noqa: SIM110 - numba cannot compile all(<generator>)
        if x[i] < x[i - 1]:
            return False
    return True


@nb.njit(cache=True, nogil=True)
def stable_argsort(x):  # pragma: no cover - compiled
    """Stable ascending argsort of a finite float64 array (int64 indices)."""
    n = x.shape[0]
    out = np.arange(n)
    if is_sorted(x):
        return out
    lo, hi = x.min(), x.max()
    scale = n / (hi - lo)
    key = np.empty(n, dtype=np.int64)
    start = np.zeros(n + 1, dtype=np.int64)
    for i in range(n):
        q = min(np.int64((x[i] - lo) * scale), n - 1)
        key[i] = q
        start[q + 1] += 1
    for q in range(n):
        start[q + 1] += start[q]
    fill = start.copy()
    for i in range(n):
        out[fill[key[i]]] = i
        fill[key[i]] += 1
    for q in range(n):
        a, e = start[q], start[q + 1]
        if e - a <= 1:
            continue
        if e - a <= 32:
            for t in range(a + 1, e):  # insertion sort; strict < keeps equal values in index order
                cur = out[t]
                u = t - 1
                while u >= a and x[out[u]] > x[cur]:
                    out[u + 1] = out[u]
                    u -= 1
                out[u + 1] = cur
        else:
            sub = out[a:e].copy()
            out[a:e] = sub[np.argsort(x[sub], kind="mergesort")]
    return out


@nb.njit(cache=True, nogil=True)
def partial_ranks(n_items, rest):  # pragma: no cover - compiled
    """The `rest` load ranks (of n_items, ascending) nearest the quantiles (j + 0.5) / rest, j = 0..rest-1:
    a trailing partial group of `rest` minibatches gets this proportional share of small and large loads.

    Returns:
        int64 (rest,) increasing ranks in [0, n_items); distinct when rest <= n_items.
    """
    out = np.empty(rest, dtype=np.int64)
    for j in range(rest):
        out[j] = min(np.int64((j + 0.5) * n_items / rest), n_items - 1)
    return out


@nb.njit(cache=True, nogil=True)
def place_partial_group(n_items, k, rank_gid):  # pragma: no cover - compiled
    """Start of a group assignment: every load rank unassigned (-1) except the partial group's.

    With G_full = n_items // k complete groups and r = n_items % k, the `partial_ranks` go to group G_full (the
    last one, dispatched last). Returns G_full.
    """
    n_full = n_items // k
    rank_gid[:n_items] = -1
    for r in partial_ranks(n_items, n_items - n_full * k):
        rank_gid[r] = n_full
    return n_full


@nb.njit(cache=True, nogil=True)
def snake_groups(n_items, k, rank_gid):  # pragma: no cover - compiled
    """Stratified start: write the group id of each load rank into rank_gid (ranks ascending by load).

    The partial group (if any) is placed by `place_partial_group`; the other ranks are dealt largest-first in
    snake order (round 0 left to right, round 1 right to left, ...), one per group per round.
    """
    n_full = place_partial_group(n_items, k, rank_gid)
    t = 0
    for r in range(n_items - 1, -1, -1):
        if rank_gid[r] != -1:
            continue
        rnd, slot = t // n_full, t % n_full
        rank_gid[r] = slot if rnd % 2 == 0 else n_full - 1 - slot
        t += 1


@nb.njit(cache=True, nogil=True)
def bucket_order(x, counts, out, per):  # pragma: no cover - compiled
    """Approximate ascending order of x written into `out`: a counting sort on len(x) / per equal-width value
    buckets (inputs in one bucket stay in index order). O(n); `counts` needs len(x) // per + 1 slots.
    """
    n = x.shape[0]
    n_buckets = max(n // per, 1)
    lo, hi = x.min(), x.max()
    scale = n_buckets / (hi - lo) if hi > lo else 0.0
    counts[: n_buckets + 1] = 0
    for i in range(n):
        counts[min(np.int64((x[i] - lo) * scale), n_buckets - 1) + 1] += 1
    for q in range(n_buckets):
        counts[q + 1] += counts[q]
    for i in range(n):
        q = min(np.int64((x[i] - lo) * scale), n_buckets - 1)
        out[counts[q]] = i
        counts[q] += 1


@nb.njit(cache=True, nogil=True)
def lpt_rounds_groups(sorted_loads, k, rank_gid):  # pragma: no cover - compiled
    """Round-wise LPT start: like `snake_groups`, but each round of G_full minibatches (largest first) is
    dealt to the groups in ascending order of their current load. The order is a bucket order (about 4 loads
    per bucket, O(G) per round): as good a start as an exact sort here, and faster (docs/benchmarks.md,
    "Design notes measured once").
    """
    n_items = sorted_loads.shape[0]
    n_full = place_partial_group(n_items, k, rank_gid)
    sums = np.zeros(n_full)
    order = np.arange(n_full).astype(np.int32)
    counts = np.zeros(n_full + 1, dtype=np.int32)
    t = 0
    for r in range(n_items - 1, -1, -1):
        if rank_gid[r] != -1:
            continue
        slot = t % n_full
        if slot == 0 and t > 0:
            bucket_order(sums, counts, order, 4)
        rank_gid[r] = order[slot]
        sums[order[slot]] += sorted_loads[r]
        t += 1


@nb.njit(cache=True, nogil=True)
def perm_from_groups(order, rank_gid, k):  # pragma: no cover - compiled
    """Dispatch permutation from group ids by load rank: group g fills positions g*k.., largest load first."""
    n_items = order.shape[0]
    fill = np.zeros((n_items + k - 1) // k, dtype=np.int64)
    perm = np.empty(n_items, dtype=np.int64)
    for r in range(n_items - 1, -1, -1):
        g = rank_gid[r]
        perm[g * k + fill[g]] = order[r]
        fill[g] += 1
    return perm
