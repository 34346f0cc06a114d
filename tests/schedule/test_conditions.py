"""C0-C4 as dispatchable schedules: every prompt exactly once, and each condition's defining order."""

from __future__ import annotations

import numpy as np
import pytest

from asp.schedule import CONDITION_NAMES, condition_schedule, schedule_metrics


@pytest.fixture()
def data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    lengths = rng.lognormal(6, 1, 203).clip(1, 8192)
    return np.array([f"p{i}" for i in range(203)]), lengths


@pytest.mark.parametrize("cond", CONDITION_NAMES)
def test_each_condition_is_a_permutation_of_the_prompts(cond: str, data) -> None:
    ids, lengths = data
    s = condition_schedule(ids, lengths, cond, b=8, kappa=2, k=3, seed=1, iterations=20000, method="asp")
    assert sorted(s.prompt_ids.tolist()) == sorted(ids.tolist()) and s.info["condition"] == cond
    assert np.array_equal(ids[s.positions], s.prompt_ids)


def test_condition_orders(data) -> None:
    ids, lengths = data
    c0 = condition_schedule(ids, lengths, "C0", b=8, kappa=2, k=6, seed=0)
    assert c0.prompt_ids.tolist() == ids.tolist() and c0.minibatch_sizes.tolist() == [8] * 25 + [3]
    c1 = condition_schedule(ids, lengths, "C1", b=8, kappa=2, k=6, seed=0)
    assert np.all(np.diff(lengths[c1.positions]) >= 0)  # sorted short to long
    c2 = condition_schedule(ids, lengths, "C2", b=8, kappa=2, k=6, seed=0)
    assert np.all(np.diff(lengths[c2.positions]) >= 0) and set(c2.minibatch_sizes[:-1]) <= {8, 9, 10}
    c3 = condition_schedule(ids, lengths, "C3", b=8, kappa=2, k=6, seed=4)
    assert sorted(map(tuple, c3.minibatches())) == sorted(map(tuple, c2.minibatches()))  # same minibatches
    c4 = condition_schedule(ids, lengths, "C4", b=8, kappa=2, k=3, iterations=50000, seed=0, method="asp")
    cv = {c.info["condition"]: schedule_metrics(lengths, c)["CV"] for c in (c2, c3, c4)}
    assert cv["C4"] < cv["C3"] < cv["C2"]  # oracle predictions: balancing beats shuffling beats sorting


def test_unknown_condition(data) -> None:
    ids, lengths = data
    with pytest.raises(ValueError, match="condition"):
        condition_schedule(ids, lengths, "C9", b=8, kappa=2, k=6, seed=0)


def test_c1_to_c4_sort_the_same_loads(data) -> None:
    """Per-prompt loads that are not a monotone map of the predictions (cross-fitted ones): C1 sorts them as C2-C4
    do, so C1 and C2 differ only in the cut and C2-C4 share minibatches."""
    from asp.schedule.ablation import FixedLoads

    ids, lengths = data
    loads = lengths * np.random.default_rng(1).lognormal(0, 0.5, lengths.size)  # reorders the predictions
    kw = {"b": 8, "kappa": 2, "k": 3, "seed": 2, "calibration": FixedLoads(lengths, loads), "loads": "calibrated"}
    s = {c: condition_schedule(ids, lengths, c, iterations=20000, **kw, method="asp") for c in CONDITION_NAMES}
    assert np.all(np.diff(loads[s["C1"].positions]) >= 0)  # sorted by the loads, not by the predictions
    np.testing.assert_array_equal(s["C1"].positions, s["C2"].positions)
    assert s["C1"].minibatch_sizes.tolist() == [8] * 25 + [3] and set(s["C2"].minibatch_sizes[:-1]) <= {8, 9, 10}
    for c in ("C1", "C2", "C3"):
        np.testing.assert_array_equal(s[c].loads, loads[s[c].positions])
    by_id = {c: sorted(map(tuple, s[c].minibatches())) for c in ("C2", "C3", "C4")}
    assert by_id["C2"] == by_id["C3"] == by_id["C4"]
    monotone = condition_schedule(
        ids, lengths, "C1", b=8, kappa=2, k=3, calibration=np.sqrt, loads="calibrated", seed=0
    )
    np.testing.assert_array_equal(monotone.positions, np.argsort(lengths, kind="stable"))  # = the predictions' order
