"""Annealing kernels behind `asp.schedule.balance` (no validation here: call the typed wrappers there).

* `splitmix64`: a small counter-based RNG, so results depend only on the seed (not on numba's global state).
* `paper_sa`: Algorithm 2 verbatim (uniform swap proposals, T_n = C / log(n + 2), O(1) objective update).
* `anneal_directed`: the default method's annealing, described below.

All kernels that share helpers live in this one file on purpose: numba's on-disk cache is invalidated per
source file, so a helper inlined from another file could leave a stale compiled kernel behind.

The default balancer's annealing: directed swap proposals over load-ranked minibatches.

State: `rank_gid[r]` = batch group of the minibatch with the r-th smallest load; group deviations
e_g = L_g - size_g * mean. A proposal picks a uniform rank r (group g) and u ~ U(0, 1], and looks for the
partner whose load is nearest to load[r] - u * e_g (a step of three gallop probes around r, then a value-bucket
table: O(1) expected), so every proposal tries to cancel part of g's deviation. Metropolis acceptance with
T_n = temperature * (SSE_n / G) * (1 - n / iterations): scaled to the current mean squared group deviation.

At large N_B the arrays leave the caches and each proposal would wait on a chain of ~6 memory misses, so the
kernel software-pipelines them: proposal n + 32 is drawn at step n, and its data (ranks, groups, deviations,
bucket slot, partner, partner group) are prefetched in stages over the next 32 steps. The values are re-read
when the proposal executes, so results do not depend on the pipelining (only speed does).

Run the checks: `.venv/bin/python -m pytest tests/schedule/test_balance.py tests/schedule/test_kernels.py -q`.
"""

from __future__ import annotations

import numba as nb
import numpy as np
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31, _S32, _S11 = np.uint64(30), np.uint64(27), np.uint64(31), np.uint64(32), np.uint64(11)
_MASK32 = np.uint64(0xFFFFFFFF)
_INV53 = 1.0 / 9007199254740992.0
# exp(-x) == 0.0 in float64 for x > 745.2, so such uphill moves are rejected without drawing U.
_EXP_ZERO = 746.0


@intrinsic
def prefetch(typingctx, arr, idx):  # pragma: no cover - compiled
    """Hint the CPU to fetch arr[idx] into cache (llvm.prefetch: read, high locality). No bounds check."""
    sig = types.void(arr, idx)

    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        ptr = cgutils.get_item_pointer(context, builder, signature.args[0], ary, [args[1]], wraparound=False)
        i8p, i32 = ir.IntType(8).as_pointer(), ir.IntType(32)
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]), "llvm.prefetch.p0"
        )
        builder.call(fn, [builder.bitcast(ptr, i8p), ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)])
        return context.get_dummy_value()

    return sig, codegen


@nb.njit(inline="always")
def splitmix64(state):  # pragma: no cover - compiled
    """Advance a splitmix64 state; return (new_state, 64 random bits)."""
    state = state + _GOLDEN
    z = state
    z = (z ^ (z >> _S30)) * _M1
    z = (z ^ (z >> _S27)) * _M2
    return state, z ^ (z >> _S31)


@nb.njit(inline="always")
def _below(bits32, n):  # pragma: no cover - compiled
    """Map 32 random bits to an int in [0, n) (multiply-shift; n < 2**32)."""
    return np.int64((bits32 * np.uint64(n)) >> _S32)


@nb.njit(inline="always")
def _unit(bits):  # pragma: no cover - compiled
    """Map 64 random bits to a float in [0, 1)."""
    return np.float64(bits >> _S11) * _INV53


@nb.njit(cache=True, nogil=True)
def paper_sa(pos_loads, perm, k, iterations, c, seed):  # pragma: no cover - compiled
    """Algorithm 2 in place on `perm` (item at each position) and `pos_loads` (load at each position).

    Objective V = (1/G) sum_g (L_g - M)^2 with G = ceil(N/k) and M = total / G, as in the paper.
    Returns the number of accepted swaps.
    """
    n_items = perm.shape[0]
    n_groups = (n_items + k - 1) // k
    group = np.zeros(n_groups)
    for p in range(n_items):
        group[p // k] += pos_loads[p]
    state = splitmix64(np.uint64(seed))[1]
    accepted = 0
    for it in range(iterations):
        state, z = splitmix64(state)
        i = _below(z >> _S32, n_items)
        j = _below(z & _MASK32, n_items - 1)
        if j >= i:
            j += 1
        gi, gj = i // k, j // k
        d = pos_loads[j] - pos_loads[i]
        if gi != gj:
            dv = 2.0 * d * (group[gi] - group[gj] + d) / n_groups  # V(sigma') - V(sigma)
            if dv > 0.0:
                temp = c / np.log(it + 2.0)
                if dv > _EXP_ZERO * temp:
                    continue
                state, z = splitmix64(state)
                if _unit(z) >= np.exp(-dv / temp):
                    continue
            group[gi] += d
            group[gj] -= d
        pos_loads[i], pos_loads[j] = pos_loads[j], pos_loads[i]
        perm[i], perm[j] = perm[j], perm[i]
        accepted += 1
    return accepted


PIPE = 32  # proposals in flight (power of two)
PIPELINE_MIN_ITEMS = 1 << 16  # below this everything is in cache and prefetching only costs


@nb.njit(cache=True, nogil=True)
def value_buckets(sorted_loads):  # pragma: no cover - compiled
    """Bucket table for O(1) rank look-ups: start[q] = first rank whose load falls in bucket >= q.

    Buckets split [min, max] into N equal widths; returns (start (N + 1,), lo, scale).
    """
    n = sorted_loads.shape[0]
    lo = sorted_loads[0]
    span = sorted_loads[n - 1] - lo
    scale = n / span if span > 0.0 else 0.0
    start = np.empty(n + 1, dtype=np.int32)  # callers keep N < 2**31 (group ids are int32 too)
    cur = 0
    for r in range(n):
        q = min(np.int64((sorted_loads[r] - lo) * scale), n - 1)
        while cur <= q:
            start[cur] = r
            cur += 1
    while cur <= n:
        start[cur] = n
        cur += 1
    return start, lo, scale


@nb.njit(inline="always")
def _bucket(lo, scale, n, t):  # pragma: no cover - compiled
    return min(np.int64(max(t - lo, 0.0) * scale), n - 1)


@nb.njit(inline="always")
def _last_le(loads, a, e, t):  # pragma: no cover - compiled
    """Given loads[a] <= t < loads[e] (a < e), return the last index in [a, e) with load <= t."""
    while e - a > 1:
        mid = (a + e) >> 1
        if loads[mid] > t:
            e = mid
        else:
            a = mid
    return a


@nb.njit(inline="always")
def _first_ge(loads, a, e, t):  # pragma: no cover - compiled
    """Given loads[a] < t <= loads[e] (a < e), return the first index in (a, e] with load >= t."""
    while e - a > 1:
        mid = (a + e) >> 1
        if loads[mid] < t:
            a = mid
        else:
            e = mid
    return e


@nb.njit(inline="always")
def _partner_below(loads, start, lo, scale, r, t):  # pragma: no cover - compiled
    """Largest rank < r with load <= t (0 if none): probes r-1, r-2, r-4, else the bucket table."""
    hi, step = r, 1
    for _ in range(3):
        cand = r - step
        if cand <= 0:
            return 0 if loads[0] > t else _last_le(loads, 0, hi, t)
        if loads[cand] <= t:
            return _last_le(loads, cand, hi, t)
        hi = cand
        step <<= 1
    if t < lo:
        return 0
    q = _bucket(lo, scale, loads.shape[0], t)
    a, e = start[q], min(start[q + 1], hi)
    if a >= e or loads[a] > t:
        return max(a - 1, 0)
    return _last_le(loads, a, e, t)


@nb.njit(inline="always")
def _partner_above(loads, start, lo, scale, r, t):  # pragma: no cover - compiled
    """Smallest rank > r with load >= t (the last rank if none): probes r+1, r+2, r+4, else the bucket table."""
    last = loads.shape[0] - 1
    low, step = r, 1
    for _ in range(3):
        cand = r + step
        if cand >= last:
            return last if loads[last] < t else _first_ge(loads, low, last, t)
        if loads[cand] >= t:
            return _first_ge(loads, low, cand, t)
        low = cand
        step <<= 1
    if t > loads[last]:
        return last
    q = _bucket(lo, scale, loads.shape[0], t)
    a, e = max(start[q], low + 1), start[q + 1]
    if a >= e or loads[e - 1] < t:
        return min(e, last)
    if loads[a] >= t:
        return a
    return _first_ge(loads, a, e - 1, t)


@nb.njit(inline="always")
def _prefetch_stages(it, ring_z, ring_a, sorted_loads, rank_gid, dev, start, lo, scale):  # pragma: no cover
    """Warm the caches for the proposals executed at it + 32 (just drawn), +24, +16, +8 and +4."""
    n = sorted_loads.shape[0]
    mask = PIPE - 1
    r = _below(ring_z[it & mask] >> _S32, n)  # S0: rank data of the newest proposal
    prefetch(sorted_loads, r)
    prefetch(rank_gid, r)
    r = _below(ring_z[(it + 24) & mask] >> _S32, n)  # S1: its group's deviation
    prefetch(dev, rank_gid[r])
    slot = (it + 16) & mask  # S2: the bucket of its partner target
    z = ring_z[slot]
    r = _below(z >> _S32, n)
    u = np.float64((z & _MASK32) + np.uint64(1)) * (1.0 / 4294967296.0)
    q = _bucket(lo, scale, n, sorted_loads[r] - u * dev[rank_gid[r]])
    ring_a[slot] = q
    prefetch(start, q)
    slot = (it + 8) & mask  # S3: the partner candidate
    a = min(start[ring_a[slot]], n - 1)
    ring_a[slot] = a
    prefetch(sorted_loads, a)
    prefetch(rank_gid, a)
    prefetch(dev, rank_gid[ring_a[(it + 4) & mask]])  # S4: the partner's group deviation


@nb.njit(cache=True, nogil=True)
def anneal_directed(sorted_loads, rank_gid, group_size, iterations, temperature, seed):  # pragma: no cover
    """Anneal the group id of each load rank in place (see the module docstring); returns accepted swaps.

    Args:
        sorted_loads: (N,) float64 loads in ascending order.
        rank_gid: (N,) int32 group of each rank (modified in place).
        group_size: (G,) int64 minibatches per group.
        iterations: proposals.
        temperature: multiple of the current mean squared group deviation (0: pure descent).
        seed: RNG seed.
    """
    n_items = sorted_loads.shape[0]
    n_groups = group_size.shape[0]
    mean = sorted_loads.sum() / n_items
    dev = np.zeros(n_groups)
    for r in range(n_items):
        dev[rank_gid[r]] += sorted_loads[r]
    for g in range(n_groups):
        dev[g] -= group_size[g] * mean
    start, lo, scale = value_buckets(sorted_loads)
    state = splitmix64(np.uint64(seed) ^ np.uint64(0x5EED))[1]
    ring_z = np.empty(PIPE, dtype=np.uint64)
    ring_a = np.zeros(PIPE, dtype=np.int64)
    for s in range(PIPE):
        state, ring_z[s] = splitmix64(state)
    pipelined = n_items >= PIPELINE_MIN_ITEMS
    resum, sse, accepted = 8 * n_groups, 0.0, 0
    for it in range(iterations):
        if temperature > 0.0 and it % resum == 0:
            sse = 0.0
            for g in range(n_groups):
                sse += dev[g] * dev[g]
        z = ring_z[it & (PIPE - 1)]
        state, ring_z[it & (PIPE - 1)] = splitmix64(state)
        if pipelined:
            _prefetch_stages(it, ring_z, ring_a, sorted_loads, rank_gid, dev, start, lo, scale)
        r = _below(z >> _S32, n_items)
        ga = rank_gid[r]
        ea = dev[ga]
        t = sorted_loads[r] - (np.float64((z & _MASK32) + np.uint64(1)) * (1.0 / 4294967296.0)) * ea
        if ea > 0.0:
            if r == 0:
                continue
            r2 = min(_partner_below(sorted_loads, start, lo, scale, r, t), r - 1)
        else:
            if r == n_items - 1:
                continue
            r2 = max(_partner_above(sorted_loads, start, lo, scale, r, t), r + 1)
        gb = rank_gid[r2]
        if ga == gb:
            continue
        d = sorted_loads[r2] - sorted_loads[r]
        delta = 2.0 * d * (ea - dev[gb] + d)
        if delta > 0.0:
            temp = temperature * (sse / n_groups) * (1.0 - it / iterations)
            if not delta <= _EXP_ZERO * temp:
                continue
            state, z = splitmix64(state)
            if _unit(z) >= np.exp(-delta / temp):
                continue
        dev[ga] += d
        dev[gb] -= d
        sse += delta
        rank_gid[r], rank_gid[r2] = gb, ga
        accepted += 1
    return accepted
