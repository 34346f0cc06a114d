"""Step 2 of ASP: length-homogeneous minibatches by dynamic programming (paper §3.3, Algorithm 1).

Given sorted predicted lengths l[0] <= ... <= l[n-1], choose endpoints 0 = x0 < x1 < ... < x_NB = n with every
size x_{i+1} - x_i in [b, b + kappa] that maximise the summed utilisation

    R_i = (S[x_{i+1}] - S[x_i]) / ((x_{i+1} - x_i) * l[x_{i+1} - 1]),   S = prefix sums of l,

exactly as Algorithm 1 (strict ">" with j ascending, so ties keep the largest last minibatch). O(kappa * n)
time. Memory layout: the prefix sums and dp values live in a ring buffer of the last b + kappa + 1 states
(they are never read further back), so the kernel streams `l` once and writes only a uint8 backpointer per
state (the chosen size minus b); its speed against the target: docs/scheduler.md.

Infeasible n. When n cannot be written as a sum of sizes in [b, b + kappa] (e.g. n = 5, b = 4, kappa = 0, or
n < b), the default policy `on_infeasible="short"` allows exactly one minibatch of size in [1, b - 1]; the DP
places it where it maximises the same objective (one extra layer of states, O(b * n)). `is_feasible` tells
the caller in advance and `infeasible_message` says which b and kappa would work; `on_infeasible="error"`
raises a ValueError with that message instead.

Run the checks: `.venv/bin/python -m pytest tests/schedule/test_dp.py -q`.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from asp.schedule.validate import as_choice, as_int, as_lengths


@nb.njit(cache=True, nogil=True)
def _dp_kernel(lengths, b, kappa, back, none):  # pragma: no cover - compiled
    """Algorithm 1 with ring-buffered S and dp; back[i] = size - b of the last minibatch ending at i."""
    n = lengths.shape[0]
    width = 1
    while width < b + kappa + 1:
        width <<= 1
    mask = width - 1
    ring_s = np.zeros(width)
    ring_dp = np.full(width, -np.inf)
    ring_dp[0] = 0.0
    smax = b + kappa
    s = 0.0
    for i in range(1, n + 1):
        last = lengths[i - 1]
        s += last
        best = -np.inf
        choice = none
        if i >= b:
            lo = i - smax if i > smax else 0
            for j in range(lo, i - b + 1):
                v = ring_dp[j & mask] + (s - ring_s[j & mask]) / ((i - j) * last)
                if v > best:
                    best = v
                    choice = i - j - b
        ring_s[i & mask] = s
        ring_dp[i & mask] = best
        back[i] = choice
    return ring_dp[n & mask]


@nb.njit(cache=True, nogil=True)
def _dp_short_kernel(lengths, b, kappa, size0, size1):  # pragma: no cover - compiled
    """Two-layer DP: layer 1 has used its one short minibatch (size in [1, b-1]), layer 0 has not.

    size0[i] = size of the last minibatch of the best layer-0 path to i (0: unreachable); size1[i] = same for
    layer 1, negative when that last minibatch is the short one (the path before it is in layer 0).
    """
    n = lengths.shape[0]
    pre = np.zeros(n + 1)
    for i in range(n):
        pre[i + 1] = pre[i] + lengths[i]
    dp0 = np.full(n + 1, -np.inf)
    dp1 = np.full(n + 1, -np.inf)
    dp0[0] = 0.0
    for i in range(1, n + 1):
        last = lengths[i - 1]
        lo = i - (b + kappa) if i > b + kappa else 0
        for j in range(lo, i):
            size = i - j
            r = (pre[i] - pre[j]) / (size * last)
            if size >= b:
                if dp0[j] + r > dp0[i]:
                    dp0[i] = dp0[j] + r
                    size0[i] = size
                if dp1[j] + r > dp1[i]:
                    dp1[i] = dp1[j] + r
                    size1[i] = size
            elif dp0[j] + r > dp1[i]:
                dp1[i] = dp0[j] + r
                size1[i] = -size
    return dp1[n]


def is_feasible(n: int, b: int, kappa: int) -> bool:
    """Whether n prompts can be split into minibatches whose sizes all lie in [b, b + kappa].

    True iff some count m has m * b <= n <= m * (b + kappa), i.e. ceil(n / (b + kappa)) <= floor(n / b).
    """
    n = as_int(n, "n", minimum=0)
    b = as_int(b, "b", minimum=1)
    kappa = as_int(kappa, "kappa", minimum=0)
    return n >= 1 and -(-n // (b + kappa)) <= n // b


def infeasible_message(n: int, b: int, kappa: int) -> str:
    """Why n prompts cannot be cut into minibatches of b..b+kappa prompts, and the nearest b / kappa that can.

    Example:
        >>> infeasible_message(10, 16, 2).split(": ")[0]
        '10 prompts cannot form minibatches of 16-18 prompts (b = 16, kappa = 2)'
        >>> infeasible_message(10, 16, 2).split(": ")[1]
        'use b <= 10 (fewer prompts than b)'
        >>> infeasible_message(37, 16, 2).split(": ")[1].split(" (")[0]  # 37 = 18 + 19, or 12 + 12 + 13
        'use b = 12 or kappa = 3'
    """
    sizes = f"{b}-{b + kappa}" if kappa else f"{b}"
    head = f"{n} prompts cannot form minibatches of {sizes} prompts (b = {b}, kappa = {kappa})"
    if n < b:
        return f"{head}: use b <= {n} (fewer prompts than b)"
    best_b = next(c for c in range(b - 1, 0, -1) if is_feasible(n, c, kappa))  # c = 1 always works
    best_kappa = -(-n // (n // b)) - b  # n // b minibatches of at most ceil(n / (n // b)) prompts
    return (
        f"{head}: use b = {best_b} or kappa = {best_kappa} (the largest b below {b} that works with kappa = {kappa}, "
        f"the smallest kappa that works with b = {b})"
    )


@nb.njit(cache=True, nogil=True)
def _backtrack_uniform(back, n, b):  # pragma: no cover - compiled
    """Endpoints from the size backpointers of `_dp_kernel` (two passes: count, then fill)."""
    count = 0
    i = n
    while i > 0:
        i -= np.int64(back[i]) + b
        count += 1
    ends = np.empty(count + 1, dtype=np.int64)
    ends[count] = n
    i = n
    for m in range(count - 1, -1, -1):
        i -= np.int64(back[i]) + b
        ends[m] = i
    return ends


def _backtrack_short(size0: np.ndarray, size1: np.ndarray, n: int) -> np.ndarray:
    """Endpoints from the two-layer backpointers of `_dp_short_kernel` (rare path; plain Python is fine)."""
    points, i, layer = [n], n, 1
    while i > 0:
        step = int(size1[i]) if layer == 1 else int(size0[i])
        if step < 0:
            step, layer = -step, 0
        i -= step
        points.append(i)
    return np.asarray(points[::-1], dtype=np.int64)


def build_minibatches(sorted_lengths: object, b: int, kappa: int, *, on_infeasible: str = "short") -> np.ndarray:
    """Split sorted predicted lengths into length-homogeneous minibatches (Algorithm 1).

    Args:
        sorted_lengths: (n,) predicted lengths in tokens, non-decreasing, finite and > 0.
        b: base minibatch size (prompts), >= 1.
        kappa: allowed extra size, >= 0; sizes lie in [b, b + kappa].
        on_infeasible: "short" (default) lets exactly one minibatch have size in [1, b - 1] when n cannot be
            split into sizes in [b, b + kappa] (including n < b); "error" raises ValueError instead.

    Returns:
        int64 endpoints of shape (N_B + 1,): 0 = x0 < x1 < ... < x_NB = n; minibatch i is
        sorted_lengths[x_i : x_{i+1}].

    Raises:
        ValueError: empty, NaN, inf, <= 0 or unsorted lengths; b < 1; kappa < 0; infeasible n with "error".

    Example:
        >>> build_minibatches([1, 1, 2, 9, 9], b=2, kappa=1).tolist()  # R = 2/2 + 20/27 beats 4/6 + 18/18
        [0, 2, 5]
    """
    b = as_int(b, "b", minimum=1)
    kappa = as_int(kappa, "kappa", minimum=0)
    as_choice(on_infeasible, "on_infeasible", ("short", "error"))
    lengths = as_lengths(sorted_lengths, "sorted_lengths", need_sorted=True)
    n = lengths.shape[0]
    if is_feasible(n, b, kappa):
        dtype = np.uint8 if kappa < 255 else np.uint32
        none = np.iinfo(dtype).max
        back = np.empty(n + 1, dtype=dtype)
        _dp_kernel(lengths, b, kappa, back, dtype(none))
        return _backtrack_uniform(back, n, b)
    if on_infeasible == "error":
        raise ValueError(f'{infeasible_message(n, b, kappa)}; or use on_infeasible="short" (one smaller minibatch)')
    size0 = np.zeros(n + 1, dtype=np.int32)
    size1 = np.zeros(n + 1, dtype=np.int32)
    _dp_short_kernel(lengths, b, kappa, size0, size1)
    return _backtrack_short(size0, size1, n)


def fixed_minibatches(n: int, b: int) -> np.ndarray:
    """Endpoints of fixed-size minibatches of b prompts (the last one holds the n mod b remainder, if any).

    Example:
        >>> fixed_minibatches(7, 3).tolist()
        [0, 3, 6, 7]
    """
    n = as_int(n, "n", minimum=1)
    b = as_int(b, "b", minimum=1)
    return np.unique(np.append(np.arange(0, n, b, dtype=np.int64), n))


def utilization(sorted_lengths: object, endpoints: np.ndarray) -> np.ndarray:
    """Predicted utilisation R_i of each minibatch (Eq. 1): mean length / max length, using the last element.

    Args:
        sorted_lengths: (n,) non-decreasing lengths.
        endpoints: (N_B + 1,) endpoints as returned by `build_minibatches`.

    Returns:
        float64 (N_B,) utilisations in (0, 1]; the predicted padding rate is 1 - mean.
    """
    lengths = as_lengths(sorted_lengths, "sorted_lengths", need_sorted=True)
    ends = np.asarray(endpoints, dtype=np.int64)
    prefix = np.concatenate(([0.0], np.cumsum(lengths)))
    sizes = np.diff(ends)
    return (prefix[ends[1:]] - prefix[ends[:-1]]) / (sizes * lengths[ends[1:] - 1])
