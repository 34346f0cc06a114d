"""Balanced batch-group ordering: Algorithm 2 transcription, default method, determinism, group shuffle."""

from __future__ import annotations

import math

import numpy as np
import pytest

from asp.schedule import balance_groups, group_loads, shuffle_groups

MASK = (1 << 64) - 1


def splitmix(state: int) -> tuple[int, int]:
    state = (state + 0x9E3779B97F4A7C15) & MASK
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return state, z ^ (z >> 31)


def variance(pos_loads: list[float], k: int) -> float:
    """V(sigma) = (1/G) sum_g (L_g - M)^2 with G = ceil(N/k), M = total / G (paper appendix E.3)."""
    groups = [sum(pos_loads[g : g + k]) for g in range(0, len(pos_loads), k)]
    m = sum(groups) / len(groups)
    return sum((x - m) ** 2 for x in groups) / len(groups)


def algorithm_2(loads: np.ndarray, k: int, iterations: int, c: float, seed: int) -> np.ndarray:
    """Algorithm 2 line by line, recomputing V from scratch; same random stream as the kernel.

    The kernel skips drawing U when exp(-dV/T) underflows to 0 (U < 0 is impossible), so this does too.
    """
    n = loads.size
    perm, pos = list(range(n)), [float(x) for x in loads]
    state = splitmix(seed)[1]
    for it in range(iterations):
        state, z = splitmix(state)
        i = ((z >> 32) * n) >> 32
        j = ((z & 0xFFFFFFFF) * (n - 1)) >> 32
        j += j >= i
        new = pos.copy()
        new[i], new[j] = new[j], new[i]
        dv = variance(new, k) - variance(pos, k)
        if dv > 1e-9:
            temp = c / math.log(it + 2)
            p = math.exp(-dv / temp)
            if p == 0.0:
                continue
            state, z = splitmix(state)
            if (z >> 11) / 2.0**53 >= p:
                continue
        pos = new
        perm[i], perm[j] = perm[j], perm[i]
    return np.array(perm)


@pytest.mark.parametrize(("n", "k", "c"), [(24, 4, 5.0), (23, 5, 1.0), (30, 3, 50.0), (12, 12, 1.0)])
def test_paper_sa_is_algorithm_2(n: int, k: int, c: float) -> None:
    # small integer loads and C >= 1 keep dV / T moderate, so the Metropolis branch is exercised
    loads = np.random.default_rng(n).integers(1, 10, n).astype(float)
    got = balance_groups(loads, k, iterations=600, seed=3, method="paper_sa", c=c)
    if n <= k:
        np.testing.assert_array_equal(got, np.arange(n))  # one group: nothing to do
    else:
        np.testing.assert_array_equal(got, algorithm_2(loads, k, 600, c, 3))


def cv(loads: np.ndarray, perm: np.ndarray, k: int) -> float:
    g = group_loads(loads[perm], k)[: loads.size // k]
    return float(g.std() / g.mean())


@pytest.mark.parametrize("method", ["asp", "paper_sa", "kk", "lpt", "snake"])
@pytest.mark.parametrize(("n", "k"), [(1, 1), (5, 10), (10, 10), (11, 10), (100, 1), (997, 6), (1200, 6)])
def test_every_method_returns_a_permutation(method: str, n: int, k: int) -> None:
    loads = np.random.default_rng(n).lognormal(10, 0.5, n)
    perm = balance_groups(loads, k, iterations=5000, seed=1, method=method)
    assert perm.dtype == np.int64 and sorted(perm.tolist()) == list(range(n))


def test_deterministic_per_seed() -> None:
    loads = np.random.default_rng(0).lognormal(10, 0.6, 1203)
    for method in ("asp", "paper_sa"):
        a = balance_groups(loads, 6, iterations=20_000, seed=5, method=method)
        np.testing.assert_array_equal(a, balance_groups(loads, 6, iterations=20_000, seed=5, method=method))
        assert not np.array_equal(a, balance_groups(loads, 6, iterations=20_000, seed=6, method=method))


def test_snake_balances_a_linear_ramp_exactly() -> None:
    # loads 1..20, k = 2: snake pairs i with 21 - i, so every group weighs 21
    loads = np.arange(1, 21, dtype=float)
    perm = balance_groups(loads, 2, iterations=0, method="snake", seed=0)
    assert set(group_loads(loads[perm], 2).tolist()) == {21.0}
    assert (loads[perm][0::2] > loads[perm][1::2]).all()  # largest minibatch first within a group


def test_default_beats_paper_sa_at_equal_iterations() -> None:
    rng = np.random.default_rng(2)  # clipped at 8,192 as in Table 6 (unclipped outliers make any order lose)
    for raw in (rng.lognormal(8, 1, 5000), (rng.pareto(1.5, 5000) + 1) * 800):
        loads = np.sort(np.minimum(raw, 8192))
        before = cv(loads, np.arange(loads.size), 10)
        asp = cv(loads, balance_groups(loads, 10, iterations=100_000, seed=0, method="asp"), 10)
        sa = cv(loads, balance_groups(loads, 10, iterations=100_000, seed=0, method="paper_sa"), 10)
        kk = cv(loads, balance_groups(loads, 10, iterations=0, method="kk", seed=0), 10)
        assert asp < sa / 5 and sa < before / 5 and kk < before / 5


def test_partial_group_stays_last_with_a_fair_share() -> None:
    loads = np.random.default_rng(3).lognormal(10, 0.8, 1203)  # 200 groups of 6 + one of 3
    for method in ("asp", "kk", "lpt", "snake"):
        perm = balance_groups(loads, 6, iterations=50_000, method=method, seed=0)
        tail = loads[perm[-3:]].sum()
        assert tail == pytest.approx(3 * loads.mean(), rel=0.2)


def test_group_shuffle_keeps_groups_intact() -> None:
    loads = np.random.default_rng(4).lognormal(10, 0.5, 64)  # 10 groups of 6 + a partial group of 4
    base = balance_groups(loads, 6, iterations=10_000, seed=9, method="asp")
    shuffled = balance_groups(loads, 6, iterations=10_000, seed=9, shuffle=True, method="asp")
    assert not np.array_equal(base, shuffled)

    def groups(p):
        return [tuple(p[g : g + 6]) for g in range(0, 60, 6)]

    assert sorted(groups(base)) == sorted(groups(shuffled))  # same groups, same internal order
    np.testing.assert_array_equal(base[60:], shuffled[60:])  # the partial group stays last
    np.testing.assert_array_equal(shuffle_groups(base, 6, 1), shuffle_groups(base, 6, 1))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"loads": [1.0, np.nan], "k": 2}, "NaN"),
        ({"loads": [1.0, -1.0], "k": 2}, "zero or negative"),
        ({"loads": [], "k": 2}, "empty"),
        ({"loads": [1.0], "k": 0}, "k must be >= 1"),
        ({"loads": [1.0], "k": 1, "iterations": -1}, "iterations must be >= 0"),
        ({"loads": [1.0], "k": 1, "method": "magic"}, "method must be one of"),
        ({"loads": [1.0], "k": 1, "c": float("nan")}, "c must be finite"),
        ({"loads": [1.0], "k": 1, "seed": -2}, "seed must be >= 0"),
    ],
)
def test_bad_input(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        balance_groups(**{"iterations": 1000, "seed": 0, "method": "asp", **kwargs})
