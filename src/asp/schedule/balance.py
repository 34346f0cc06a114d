"""Step 3 of ASP: balanced batch-group ordering (paper §3.4, Algorithm 2, appendix E.3).

`balance_groups(loads, k, ...)` returns a dispatch permutation of the N_B minibatches such that every run of
k consecutive minibatches (a batch group) carries about the same load. Methods:

* "asp" (default): round-wise LPT start (minibatches largest-first in rounds of one per group, each round
  dealt to the currently lightest groups first) followed by annealing whose swap proposals aim at cancelling
  part of a group's deviation, with a temperature scaled to the current mean squared group deviation
  (anneal.anneal_directed). Within a group minibatches are dispatched largest-first.
* "paper_sa": Algorithm 2 exactly: start from the given order, uniform random swaps, T_n = C / log(n + 2).
* "kk": Karmarkar-Karp largest differencing with equal group sizes (as verl's seqlen balancing), no annealing.
* "lpt": the default's start alone; "snake": the snake deal the paper suggests (round 0 left to right,
  round 1 right to left, ...), alone.

Groups: G = ceil(N_B / k). If k does not divide N_B the last group is partial; "asp", "kk", "lpt" and "snake"
keep it last and give it a proportional share (r minibatches spread over the load quantiles), "paper_sa" uses
the paper's objective with one target M = total / G for every group. `shuffle=True` permutes whole complete
groups afterwards (the paper's training-randomness option); each group stays intact.

Run the checks: `.venv/bin/python -m pytest tests/schedule/test_balance.py -q`.
"""

from __future__ import annotations

import heapq

import numpy as np

from asp.schedule import anneal, kernels
from asp.schedule.spec import METHODS
from asp.schedule.validate import as_choice, as_int, as_lengths


def group_loads(dispatch_loads: np.ndarray, k: int) -> np.ndarray:
    """Sum loads over consecutive runs of k (the last run may be shorter).

    Args:
        dispatch_loads: (N_B,) loads in dispatch order.
        k: minibatches per group.

    Returns:
        float64 (ceil(N_B / k),) group loads.
    """
    loads = np.asarray(dispatch_loads, dtype=np.float64)
    return np.add.reduceat(loads, np.arange(0, loads.shape[0], k)) if loads.size else np.zeros(0)


def shuffle_groups(perm: np.ndarray, k: int, seed: int) -> np.ndarray:
    """Permute whole complete groups of k consecutive entries; a trailing partial group stays last.

    Args:
        perm: (N_B,) dispatch permutation.
        k: group size.
        seed: RNG seed (numpy default_rng).

    Returns:
        (N_B,) int64 permutation with every group's members contiguous and in their original order.
    """
    perm = np.asarray(perm, dtype=np.int64)
    n_full = perm.shape[0] // k
    order = np.random.default_rng([seed, 0x6A]).permutation(n_full)
    head = perm[: n_full * k].reshape(n_full, k)[order].reshape(-1)
    return np.concatenate([head, perm[n_full * k :]])


def _group_sizes(n_items: int, k: int) -> np.ndarray:
    sizes = np.full(-(-n_items // k), k, dtype=np.int64)
    if n_items % k:
        sizes[-1] = n_items % k
    return sizes


def _asp(loads: np.ndarray, k: int, iterations: int, seed: int, temperature: float, method: str) -> np.ndarray:
    n_items = loads.shape[0]
    order = kernels.stable_argsort(loads)
    sorted_loads = loads if order[-1] == n_items - 1 and kernels.is_sorted(loads) else loads[order]
    rank_gid = np.empty(n_items, dtype=np.int32)
    if method == "snake":
        kernels.snake_groups(n_items, k, rank_gid)
    else:
        kernels.lpt_rounds_groups(sorted_loads, k, rank_gid)
    sizes = _group_sizes(n_items, k)
    if method == "asp" and iterations > 0:
        anneal.anneal_directed(sorted_loads, rank_gid, sizes, iterations, temperature, seed)
    return kernels.perm_from_groups(order, rank_gid, k)


def _kk(loads: np.ndarray, k: int) -> np.ndarray:
    """Equal-size Karmarkar-Karp: k sorted chunks of G_full minibatches become k states, merged by spread."""
    n_items = loads.shape[0]
    n_full, rest = divmod(n_items, k)
    order = kernels.stable_argsort(loads)
    partial = kernels.partial_ranks(n_items, rest)
    keep = np.ones(n_items, dtype=bool)
    keep[partial] = False
    items = order[keep]
    heap = []
    for c in range(k):
        members = items[c * n_full : (c + 1) * n_full]
        sums = loads[members]
        heap.append((-(sums.max() - sums.min()), c, sums, members[:, None]))
    heapq.heapify(heap)
    tie = k
    while len(heap) > 1:
        _, _, s1, m1 = heapq.heappop(heap)
        _, _, s2, m2 = heapq.heappop(heap)
        o1, o2 = np.argsort(-s1, kind="stable"), np.argsort(s2, kind="stable")
        sums, members = s1[o1] + s2[o2], np.hstack([m1[o1], m2[o2]])
        heapq.heappush(heap, (-(sums.max() - sums.min()), tie, sums, members))
        tie += 1
    members = heap[0][3]
    members = np.take_along_axis(members, np.argsort(-loads[members], axis=1, kind="stable"), axis=1)
    tail = order[partial][::-1]
    return np.concatenate([members.reshape(-1), tail]).astype(np.int64)


def balance_groups(
    loads: object,
    k: int,
    *,
    iterations: int,
    seed: int,
    method: str,
    c: float = 1.0,
    temperature: float = 1.0,
    shuffle: bool = False,
) -> np.ndarray:
    """Order minibatches so that consecutive groups of k carry balanced load.

    Args:
        loads: (N_B,) load of each minibatch (e.g. summed expected lengths, tokens), finite and > 0.
        k: minibatches per batch group, >= 1.
        iterations: annealing proposals for "asp" and "paper_sa" (ignored by the others; no default: the
            `schedule.iterations` params, or `PAPER_SPEC.iterations`).
        seed: RNG seed; the result is a deterministic function of the arguments.
        method: "asp" (default), "paper_sa", "kk", "lpt" or "snake" (see the module docstring).
        c: Algorithm 2's temperature constant C (paper_sa only; the paper uses 1).
        temperature: "asp" temperature as a multiple of the current mean squared group deviation (cooled
            linearly to 0 over the iterations; 0 gives pure descent).
        shuffle: permute whole complete groups afterwards (seeded), keeping each group intact.

    Returns:
        int64 (N_B,) permutation: entry p is the index (into `loads`) of the minibatch dispatched p-th.

    Raises:
        ValueError: empty/NaN/inf/<= 0 loads, k < 1, iterations < 0, seed < 0, unknown method, c or
            temperature negative or not finite.

    Example:
        >>> balance_groups([1, 2, 3, 4], k=2, iterations=1000, seed=0, method="asp").tolist()  # {4, 1} and {3, 2}
        [3, 0, 2, 1]
    """
    values = as_lengths(loads, "loads")
    k = as_int(k, "k", minimum=1)
    iterations = as_int(iterations, "iterations", minimum=0)
    seed = as_int(seed, "seed", minimum=0)
    as_choice(method, "method", METHODS)
    for name, val in (("c", c), ("temperature", temperature)):
        if not np.isfinite(val) or val < 0:
            raise ValueError(f"{name} must be finite and >= 0, got {val!r}")
    n_items = values.shape[0]
    if n_items >= 2**31 - 1:
        raise ValueError(f"loads has {n_items} minibatches; at most 2**31 - 2 are supported")
    if n_items <= k:  # one group: nothing to balance
        perm = np.arange(n_items, dtype=np.int64)
    elif method == "paper_sa":
        perm = np.arange(n_items, dtype=np.int64)
        anneal.paper_sa(values.copy(), perm, k, iterations, float(c), seed)
    elif method == "kk":
        perm = _kk(values, k)
    else:
        perm = _asp(values, k, iterations, seed, float(temperature), method)
    return shuffle_groups(perm, k, seed) if shuffle else perm
