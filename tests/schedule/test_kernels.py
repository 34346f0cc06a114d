"""Numba helper kernels: exact stable argsort and the annealer's partner look-up, against numpy."""

from __future__ import annotations

import numba as nb
import numpy as np

from asp.schedule import anneal, kernels


@nb.njit
def _below(loads, r, t):  # pragma: no cover - compiled
    start, lo, scale = anneal.value_buckets(loads)
    return anneal._partner_below(loads, start, lo, scale, r, t)


@nb.njit
def _above(loads, r, t):  # pragma: no cover - compiled
    start, lo, scale = anneal.value_buckets(loads)
    return anneal._partner_above(loads, start, lo, scale, r, t)


def test_stable_argsort_equals_numpy_stable() -> None:
    rng = np.random.default_rng(0)
    cases = [
        rng.random(1000),
        rng.integers(0, 5, 3000).astype(float),  # heavy ties: order among equals must be by index
        np.sort(rng.random(500)),  # already sorted: identity
        np.sort(rng.random(500))[::-1].copy(),
        np.concatenate([rng.random(2000), [1e12]]),  # outlier: one huge bucket, falls back to mergesort
        np.full(50, 7.0),
        np.array([3.0]),
    ]
    for x in cases:
        np.testing.assert_array_equal(kernels.stable_argsort(x), np.argsort(x, kind="stable"))


def test_partner_lookup_matches_searchsorted() -> None:
    """Below: largest rank < r with load <= t (else 0); above: smallest rank > r with load >= t (else last)."""
    rng = np.random.default_rng(1)
    for trial in range(3000):
        n = int(rng.integers(2, 300))
        if trial % 2:
            loads = np.sort(rng.integers(1, int(rng.integers(2, 40)), n)).astype(float)
        else:
            loads = np.sort(rng.lognormal(0, 2, n))
        r = int(rng.integers(0, n))
        scale = float(rng.choice([0.001, 0.1, 1.0, 1.5]))
        if r > 0 and loads[r] > loads[0]:
            t = loads[r] - rng.random() * (loads[r] - loads[0]) * scale
            want = min(max(np.searchsorted(loads, t, side="right") - 1, 0), r - 1)
            assert min(_below(loads, r, t), r - 1) == want
        if r < n - 1 and loads[r] < loads[-1]:
            t = loads[r] + rng.random() * (loads[-1] - loads[r]) * scale
            want = max(min(np.searchsorted(loads, t, side="left"), n - 1), r + 1)
            assert max(_above(loads, r, t), r + 1) == want


def test_splitmix_is_deterministic_and_spreads_bits() -> None:
    @nb.njit
    def draws(seed, n):  # pragma: no cover - compiled
        out = np.empty(n, dtype=np.uint64)
        state = np.uint64(seed)
        for i in range(n):
            state, out[i] = anneal.splitmix64(state)
        return out

    a, b = draws(1, 1000), draws(1, 1000)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, draws(2, 1000))
    top = (a >> np.uint64(63)).astype(int)
    assert 400 < top.sum() < 600  # the top bit is set about half the time


def test_bucket_order_is_a_permutation_sorted_up_to_one_bucket() -> None:
    rng = np.random.default_rng(5)
    for n, per in [(1000, 4), (777, 1), (50, 16), (1, 4)]:
        x = rng.lognormal(0, 1, n)
        out = np.empty(n, dtype=np.int32)
        kernels.bucket_order(x, np.zeros(n + 1, dtype=np.int32), out, per)
        assert sorted(out.tolist()) == list(range(n))
        width = (x.max() - x.min()) / max(n // per, 1)
        y = x[out]
        assert (np.maximum.accumulate(y) - y).max() <= width + 1e-12


def test_partial_group_placement_matches_brute_force() -> None:
    """Both starts (snake, LPT rounds) give the partial group G_full = n // k the r = n % k load ranks nearest the
    quantiles (j + 0.5) / r, and every complete group exactly k ranks."""
    rng = np.random.default_rng(7)
    for _ in range(400):
        n_items, k = int(rng.integers(2, 200)), int(rng.integers(1, 12))
        if n_items <= k:
            continue
        n_full, rest = divmod(n_items, k)
        want = [min(int((j + 0.5) * n_items / rest), n_items - 1) for j in range(rest)]
        assert len(set(want)) == rest and kernels.partial_ranks(n_items, rest).tolist() == want
        loads = np.sort(rng.lognormal(0, 1, n_items))
        for start in (
            lambda gid, n=n_items, k=k: kernels.snake_groups(n, k, gid),
            lambda gid, x=loads, k=k: kernels.lpt_rounds_groups(x, k, gid),
        ):
            gid = np.full(n_items, 99, dtype=np.int32)
            start(gid)
            assert np.flatnonzero(gid == n_full).tolist() == want
            assert np.bincount(gid, minlength=n_full + 1).tolist() == [k] * n_full + [rest]
