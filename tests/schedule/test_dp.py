"""Algorithm 1 (length-homogeneous minibatches): brute force, hand-worked cases, infeasible n, bad input."""

from __future__ import annotations

import re

import numpy as np
import pytest

from asp.schedule import build_minibatches, fixed_minibatches, infeasible_message, is_feasible, utilization


def objective(lengths: np.ndarray, ends: np.ndarray) -> float:
    """Sum of R_i = mean / last length of each minibatch (Eq. 1), computed directly."""
    return sum(lengths[a:e].sum() / ((e - a) * lengths[e - 1]) for a, e in zip(ends[:-1], ends[1:], strict=True))


def compositions(n: int, lo: int, hi: int, short: bool) -> list[list[int]]:
    """All ordered size lists summing to n with sizes in [lo, hi]; with `short`, exactly one size in [1, lo-1]."""
    out: list[list[int]] = []

    def rec(rest: int, acc: list[int], used: bool) -> None:
        if rest == 0:
            if used or not short:
                out.append(acc.copy())
            return
        sizes = list(range(lo, hi + 1)) + (list(range(1, lo)) if short and not used else [])
        for s in sizes:
            if s <= rest:
                acc.append(s)
                rec(rest - s, acc, used or s < lo)
                acc.pop()

    rec(n, [], False)
    return out


def brute_force(lengths: np.ndarray, b: int, kappa: int) -> float:
    n = lengths.size
    short = not is_feasible(n, b, kappa)
    best = -np.inf
    for sizes in compositions(n, b, b + kappa, short):
        best = max(best, objective(lengths, np.concatenate(([0], np.cumsum(sizes)))))
    return best


def test_dp_matches_brute_force_on_random_small_cases() -> None:
    rng = np.random.default_rng(12345)
    checked = infeasible = 0
    for _ in range(400):
        b = int(rng.integers(1, 6))
        kappa = int(rng.integers(0, 4))
        n = int(rng.integers(1, 11 if b == 1 else 17))
        high = int(rng.choice([3, 20, 1000]))  # small ranges create many ties
        lengths = np.sort(rng.integers(1, high, n)).astype(float)
        ends = build_minibatches(lengths, b, kappa)
        sizes = np.diff(ends)
        assert ends[0] == 0 and ends[-1] == n and (sizes > 0).all()
        if is_feasible(n, b, kappa):
            assert ((sizes >= b) & (sizes <= b + kappa)).all()
        else:  # policy: exactly one short minibatch
            infeasible += 1
            assert (sizes < b).sum() == 1 and (sizes <= b + kappa).all()
        assert objective(lengths, ends) == pytest.approx(brute_force(lengths, b, kappa), rel=1e-12)
        checked += 1
    assert checked == 400 and infeasible > 20


def reference_algorithm_1(lengths: np.ndarray, b: int, kappa: int) -> np.ndarray:
    """Algorithm 1 transcribed line by line with full S, dp and prev arrays (feasible n only)."""
    n = lengths.size
    s = np.concatenate(([0.0], np.cumsum(lengths)))
    dp = np.full(n + 1, -np.inf)
    dp[0] = 0.0
    prev = np.full(n + 1, -1)
    for i in range(1, n + 1):
        for j in range(max(0, i - (b + kappa)), i - b + 1):
            r = (s[i] - s[j]) / ((i - j) * lengths[i - 1])
            if dp[j] + r > dp[i]:
                dp[i], prev[i] = dp[j] + r, j
    ends = [n]
    while ends[-1] > 0:
        ends.append(prev[ends[-1]])
    return np.array(ends[::-1])


def test_dp_equals_line_by_line_algorithm_1_including_tie_breaks() -> None:
    rng = np.random.default_rng(7)
    for n, b, kappa in [(3000, 32, 2), (2001, 8, 3), (500, 1, 4), (777, 5, 0)]:
        lengths = np.sort(np.minimum(rng.lognormal(8, 0.7, n).round(), 8192))
        if is_feasible(n, b, kappa):
            np.testing.assert_array_equal(
                build_minibatches(lengths, b, kappa), reference_algorithm_1(lengths, b, kappa)
            )


def test_hand_worked_cases() -> None:
    # [1,1 | 2,9,9]: R = 2/2 + 20/27 = 1.741 beats [1,1,2 | 9,9]: 4/6 + 1 = 1.667
    assert build_minibatches([1, 1, 2, 9, 9], 2, 1).tolist() == [0, 2, 5]
    # n = 5, b = 4, kappa = 0 is infeasible: [1 | 2,3,4,5] = 1 + 14/20 = 1.7 beats [1,2,3,4 | 5] = 10/16 + 1
    assert build_minibatches([1, 2, 3, 4, 5], 4, 0).tolist() == [0, 1, 5]
    assert build_minibatches([5, 6, 7], 4, 0).tolist() == [0, 3]  # n < b: one short minibatch
    assert build_minibatches([3.0], 1, 0).tolist() == [0, 1]
    # equal lengths: every R = 1, so the DP prefers more minibatches (size b)
    assert np.diff(build_minibatches(np.ones(12), 3, 2)).tolist() == [3, 3, 3, 3]


def test_infeasible_error_policy_and_feasibility() -> None:
    with pytest.raises(ValueError, match=r"^5 prompts cannot form minibatches of 4 prompts .*use b = 1 or kappa = 1"):
        build_minibatches([1, 2, 3, 4, 5], 4, 0, on_infeasible="error")
    assert is_feasible(64, 32, 0) and not is_feasible(65, 32, 0) and not is_feasible(31, 32, 2)
    assert is_feasible(66, 32, 2) and not is_feasible(35, 32, 2)  # 35 > 34 and < 64
    # sizes 32..34: m minibatches cover [32m, 34m]; these ranges touch from m = 16 on, so 511 is the last gap
    assert not is_feasible(511, 32, 2) and all(is_feasible(n, 32, 2) for n in range(512, 3000))


@pytest.mark.parametrize(
    ("n", "b", "kappa"), [(10, 16, 2), (37, 16, 2), (5, 4, 0), (65, 32, 0), (511, 32, 2), (7, 3, 0)]
)
def test_infeasible_message_suggests_settings_that_work(n: int, b: int, kappa: int) -> None:
    """The suggested b works with the given kappa and no larger b below the given one does; same for kappa."""
    message = infeasible_message(n, b, kappa)
    assert message.startswith(f"{n} prompts cannot form minibatches of {b}") and not is_feasible(n, b, kappa)
    if n < b:
        assert message.endswith(f"use b <= {n} (fewer prompts than b)") and is_feasible(n, n, kappa)
        return
    good_b, good_kappa = (int(x) for x in re.search(r"use b = (\d+) or kappa = (\d+)", message).groups())
    assert is_feasible(n, good_b, kappa) and not any(is_feasible(n, c, kappa) for c in range(good_b + 1, b))
    assert is_feasible(n, b, good_kappa) and not any(is_feasible(n, b, c) for c in range(kappa, good_kappa))


def test_large_input_sizes_within_bounds() -> None:
    lengths = np.sort(np.random.default_rng(0).integers(1, 8193, 100_003)).astype(float)
    sizes = np.diff(build_minibatches(lengths, 32, 2))
    assert sizes.sum() == 100_003 and sizes.min() >= 32 and sizes.max() <= 34


@pytest.mark.parametrize(
    ("lengths", "b", "kappa", "match"),
    [
        ([1.0, np.nan], 2, 0, r"sorted_lengths\[1\] = nan is NaN"),
        ([1.0, np.inf], 2, 0, "infinite"),
        (
            [1.0, 1e300],
            2,
            0,
            r"sorted_lengths\[1\] = 1e\+300 is larger than 1e15; lengths must be finite, > 0 and <= 1e15",
        ),
        ([0.0, 1.0], 2, 0, "zero or negative"),
        ([-3.0, 1.0], 2, 0, "zero or negative"),
        ([], 2, 0, "empty"),
        ([2.0, 1.0], 1, 0, "not sorted"),
        ([[1.0, 2.0]], 1, 0, "1-D"),
        (["a", "b"], 1, 0, "array of numbers"),
        ([1.0, 2.0], 0, 0, "b must be >= 1, got 0"),
        ([1.0, 2.0], 1, -1, "kappa must be >= 0, got -1"),
        ([1.0, 2.0], 1.5, 0, "b must be an integer"),
    ],
)
def test_bad_input_raises_clear_value_error(lengths: list, b: object, kappa: int, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        build_minibatches(lengths, b, kappa)


def test_fixed_minibatches_and_utilization() -> None:
    assert fixed_minibatches(7, 3).tolist() == [0, 3, 6, 7]
    assert fixed_minibatches(6, 3).tolist() == [0, 3, 6]
    # [1, 3 | 4, 4]: R = 4 / (2 * 3) = 2/3 and 1
    np.testing.assert_allclose(utilization([1, 3, 4, 4], np.array([0, 2, 4])), [2 / 3, 1.0])
