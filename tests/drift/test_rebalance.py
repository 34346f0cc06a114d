"""`asp.drift.rebalance`: the recalibrate action keeps the minibatches and re-balances their batch groups.

The stream: 1,536 prompts with lognormal expected lengths, raw predictions with log-noise 0.25, a calibration map
fitted on 400 held-out prompts, and the C4 schedule built on it (b = 16, k = 4: 96 minibatches, 24 groups). Then
the policy drifts: prompts whose predicted length lies in a middle band (150-400 tokens) answer 2.5x longer. A
refit on 256 realized prompts (8 noisy samples each) and `rebalance` bring the realized group-load CV back down;
re-balancing on the old calibration does not.
"""

from __future__ import annotations

import doctest

import numpy as np
import pytest

from asp.drift import rebalance as rebalance_module
from asp.drift.monitor import cv
from asp.drift.rebalance import minibatch_loads, rebalance
from asp.predictor.calibration import fit_calibration
from asp.schedule import build_schedule
from asp.schedule.balance import group_loads

N, B, K, ITERATIONS = 1536, 16, 4, 20_000


def group_load_cv(minibatches: list, loads: dict, k: int) -> float:
    """CV (std / mean) of the loads of the complete batch groups of `k` consecutive minibatches (dispatch order);
    a trailing partial group is left out (as the drift monitor does), NaN with fewer than two complete groups."""
    full = len(minibatches) // k * k
    return cv(group_loads(minibatch_loads(minibatches[:full], loads), k)) if full else float("nan")


def _stream(seed: int) -> dict:
    rng = np.random.default_rng(seed)
    true = 200 * np.exp(rng.normal(0, 0.8, N))
    raw = true * np.exp(rng.normal(0, 0.25, N))
    held_true = 200 * np.exp(rng.normal(0, 0.8, 400))
    calibration = fit_calibration(held_true * np.exp(rng.normal(0, 0.25, 400)), held_true)
    ids = [f"p{i:04d}" for i in range(N)]
    schedule = build_schedule(
        ids, raw, b=B, kappa=2, k=K, calibration=calibration, iterations=ITERATIONS, seed=0, method="asp"
    )
    drifted = true * np.where((raw > 150) & (raw < 400), 2.5, 1.0)  # injected bias in a length band
    seen = rng.choice(N, 256, replace=False)  # prompts realized since the last switch, 8 samples each
    realized_mean = (drifted[seen, None] * np.exp(rng.normal(0, 0.5, (256, 8)) - 0.125)).mean(axis=1)
    refit = fit_calibration(raw[seen], realized_mean)
    return {
        "ids": ids,
        "minibatches": [m.tolist() for m in schedule.minibatches()],
        "old": dict(zip(ids, calibration(raw), strict=True)),
        "new": dict(zip(ids, refit(raw), strict=True)),
        "realized": dict(zip(ids, drifted, strict=True)),
    }


@pytest.mark.parametrize("seed", [0, 1])
def test_refit_and_rebalance_lower_the_realized_group_load_cv(seed: int) -> None:
    s = _stream(seed)
    mbs, realized = s["minibatches"], s["realized"]
    before = group_load_cv(mbs, realized, K)
    after, groups = rebalance(mbs, s["new"], K, seed=seed, iterations=ITERATIONS, method="asp")
    stale, _ = rebalance(mbs, s["old"], K, seed=seed, iterations=ITERATIONS, method="asp")
    cv_after, cv_stale = group_load_cv(after, realized, K), group_load_cv(stale, realized, K)
    assert group_load_cv(mbs, s["old"], K) < before  # the drift unbalanced what was balanced on the old loads
    assert cv_after < 0.7 * before, (before, cv_after)  # measured: 0.263 -> 0.103 (seed 0), 0.285 -> 0.130 (1)
    assert cv_stale > 1.5 * cv_after  # the old calibration cannot see the drift: the refit is what helps
    # same minibatches (same prompt sets, each prompt once), groups of k in dispatch order
    assert sorted(map(tuple, after)) == sorted(map(tuple, mbs))
    assert groups == [p // K for p in range(len(mbs))]


def test_rebalance_is_deterministic_for_a_seed_and_keeps_the_prompt_set() -> None:
    s = _stream(0)
    mbs = s["minibatches"][:50]  # 50 minibatches: 12 groups of 4 and a partial group of 2, kept last
    first = rebalance(mbs, s["new"], K, seed=3, iterations=5000, method="asp")
    assert rebalance(mbs, s["new"], K, seed=3, iterations=5000, method="asp") == first
    assert (
        rebalance(mbs, s["new"], K, seed=4, iterations=5000, method="asp") != first
    )  # the shuffle of whole groups differs
    ordered, groups = first
    assert sorted(p for mb in ordered for p in mb) == sorted(p for mb in mbs for p in mb)
    assert groups[-2:] == [12, 12] and max(groups) == 12
    kept, _ = rebalance(mbs, s["new"], K, method="sorted", shuffle=False, iterations=0, seed=0)
    assert kept == [list(mb) for mb in mbs]  # "sorted" re-numbers groups only


def test_hand_worked_loads_and_errors() -> None:
    loads = {"a": 1.0, "b": 2.0, "c": 3.0, "d": 4.0}
    assert minibatch_loads([["a", "b"], ["c"], ["d", "a"]], loads).tolist() == [3.0, 3.0, 5.0]
    # groups of 2 in dispatch order: (a+b) + c = 6, d + (a) = 5 -> CV = 0.5 / 5.5
    assert group_load_cv([["a", "b"], ["c"], ["d"], ["a"]], loads, 2) == pytest.approx(0.5 / 5.5)
    assert np.isnan(group_load_cv([["a"], ["b"], ["c"]], loads, 2))  # one complete group only
    with pytest.raises(ValueError, match="prompt 'x' of minibatch 1 has no load"):
        rebalance([["a"], ["x"]], loads, 2, iterations=100, method="asp", seed=0)
    with pytest.raises(ValueError, match="at least one minibatch"):
        rebalance([], loads, 2, iterations=100, method="asp", seed=0)
    with pytest.raises(ValueError, match="minibatch 0 is empty"):
        rebalance([[]], loads, 2, iterations=100, method="asp", seed=0)
    with pytest.raises(ValueError):
        rebalance(
            [["a"], ["b"]], {"a": 1.0, "b": -1.0}, 2, iterations=100, method="asp", seed=0
        )  # loads must be > 0 (balance_groups' check)


def test_docstring_example() -> None:
    assert doctest.testmod(rebalance_module, verbose=False).failed == 0
