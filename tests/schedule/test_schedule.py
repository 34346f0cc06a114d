"""build_schedule end to end: structure, calibration, frames, summary, bad input."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from asp.schedule import (
    PAPER_SPEC,
    build_schedule,
    schedule_from_frame,
    schedule_metrics,
    schedule_summary,
    schedule_to_frame,
    synthetic_lengths,
)

PAPER = {
    "b": PAPER_SPEC.b,
    "kappa": PAPER_SPEC.kappa,
    "k": PAPER_SPEC.k,
    "iterations": PAPER_SPEC.iterations,
    "method": "asp",
}


def dataset(n: int = 3001, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    true = synthetic_lengths(n, seed)
    pred = true * np.exp(0.3 * np.random.default_rng(seed).standard_normal(n))
    ids = np.array([f"q{i:05d}" for i in range(n)])
    return ids, pred, true


def test_schedule_structure() -> None:
    ids, pred, _ = dataset()
    s = build_schedule(ids, pred, b=32, kappa=2, k=6, iterations=50_000, seed=1, method="asp")
    assert sorted(s.prompt_ids.tolist()) == sorted(ids.tolist())  # every prompt exactly once
    np.testing.assert_array_equal(ids[s.positions], s.prompt_ids)
    assert s.minibatch_sizes.min() >= 32 and s.minibatch_sizes.max() <= 34
    assert sorted(s.minibatch_ids.tolist()) == list(range(s.n_minibatches))
    assert s.n_groups == -(-s.n_minibatches // 6) and len(s.groups()) == s.n_groups
    # minibatch ids are ranks in sorted order: predicted lengths inside minibatch id m precede those of m + 1
    by_id = [s.predicted_lengths[s.offsets[p] : s.offsets[p + 1]] for p in np.argsort(s.minibatch_ids)]
    assert all(a.max() <= b.min() for a, b in zip(by_id[:-1], by_id[1:], strict=True))
    full = s.group_loads[: s.n_minibatches // 6]
    assert full.std() / full.mean() < 1e-3  # balanced on the loads it was given


def test_sorted_method_keeps_dp_order_and_shuffle_keeps_groups() -> None:
    ids, pred, _ = dataset(997)
    s = build_schedule(ids, pred, **{**PAPER, "method": "sorted"}, seed=0)
    np.testing.assert_array_equal(s.minibatch_ids, np.arange(s.n_minibatches))
    a = build_schedule(ids, pred, **{**PAPER, "iterations": 20_000}, seed=4)
    b = build_schedule(ids, pred, **{**PAPER, "iterations": 20_000}, seed=4, shuffle=True)

    def key(s):  # the set of complete groups, each with its internal order
        return sorted(tuple(s.minibatch_ids[g : g + 6]) for g in range(0, s.n_minibatches // 6 * 6, 6))

    assert key(a) == key(b) and not np.array_equal(a.minibatch_ids, b.minibatch_ids)


def test_calibrated_loads_callable_and_knots_agree() -> None:
    ids, pred, true = dataset()
    knots = (np.array([0.0, 3000.0, 20000.0]), np.array([2000.0, 4000.0, 6000.0]))
    kw = {**PAPER, "iterations": 20_000}
    by_knots = build_schedule(ids, pred, calibration=knots, **kw, seed=0)
    by_call = build_schedule(ids, pred, calibration=lambda x: np.interp(x, *knots), **kw, seed=0)
    by_map = build_schedule(ids, pred, calibration={"x": knots[0], "y": knots[1]}, **kw, seed=0)
    assert by_knots.info["loads"] == "calibrated"
    np.testing.assert_array_equal(by_knots.prompt_ids, by_call.prompt_ids)
    np.testing.assert_array_equal(by_knots.prompt_ids, by_map.prompt_ids)
    np.testing.assert_allclose(by_knots.loads, np.interp(by_knots.predicted_lengths, *knots))
    raw = build_schedule(ids, pred, calibration=knots, loads="raw", **kw, seed=0)
    assert raw.info["loads"] == "raw"
    np.testing.assert_array_equal(raw.loads, raw.predicted_lengths)


def test_frame_round_trip_through_parquet(tmp_path) -> None:
    ids, pred, true = dataset(1000)
    s = build_schedule(ids, pred, b=8, kappa=1, k=4, iterations=10_000, seed=0, method="asp")
    frame = schedule_to_frame(s)
    assert list(frame.columns) == [
        "prompt_id",
        "minibatch_id",
        "group_id",
        "dispatch_rank",
        "predicted_length",
        "load_used",
    ]
    frame.to_parquet(tmp_path / "s.parquet", index=False)
    back = schedule_from_frame(
        pd.read_parquet(tmp_path / "s.parquet")
        .sample(frac=1, random_state=0)
        .sort_values("dispatch_rank", kind="stable")
    )
    assert back.k == 4
    np.testing.assert_array_equal(back.offsets, s.offsets)
    np.testing.assert_array_equal(back.minibatch_ids, s.minibatch_ids)
    assert [set(m) for m in back.minibatches()] == [set(m) for m in s.minibatches()]
    bad = frame.assign(group_id=0)
    with pytest.raises(ValueError, match="group_id"):
        schedule_from_frame(bad, k=4)
    with pytest.raises(ValueError, match="lacks columns"):
        schedule_from_frame(frame.drop(columns="load_used"))


def test_summary_is_small_json_and_reports_realized_metrics() -> None:
    ids, pred, true = dataset(2000)
    s = build_schedule(ids, pred, **{**PAPER, "iterations": 10_000}, seed=0)
    summary = schedule_summary(s, true)
    json.dumps(summary)  # JSON-able
    assert summary["realized"] == schedule_metrics(true, s)
    assert summary["predicted"]["CV"] < summary["realized"]["CV"]  # balanced on predictions, not on truth
    assert summary["minibatch_size"]["min"] >= 32 and summary["feasible"] is True


def test_infeasible_n_gets_one_short_minibatch() -> None:
    s = build_schedule(
        list(range(5)), [1, 2, 3, 4, 5], b=4, kappa=0, k=1, iterations=PAPER_SPEC.iterations, seed=0, method="asp"
    )
    assert sorted(s.minibatch_sizes.tolist()) == [1, 4] and s.info["feasible"] is False
    with pytest.raises(ValueError, match=r"^10 prompts cannot form minibatches of 16-18 prompts .*use b <= 10"):
        build_schedule(list(range(10)), np.arange(1.0, 11.0), **{**PAPER, "b": 16}, on_infeasible="error", seed=0)


def test_summary_of_a_schedule_without_a_complete_group_is_strict_json() -> None:
    """No complete group: mean_group_load is NaN in the dict and null in the JSON text (never NaN)."""
    from asp.io import json_text

    s = build_schedule(list(range(10)), np.arange(1.0, 11.0), **{**PAPER, "b": 16}, seed=0)
    summary = schedule_summary(s)
    assert np.isnan(summary["predicted"]["mean_group_load"])
    text = json_text(summary)
    assert "NaN" not in text and json.loads(text)["predicted"]["mean_group_load"] is None


@pytest.mark.parametrize(
    ("args", "kwargs", "match"),
    [
        ((["a", "b"], [1.0]), {}, "prompt_ids has shape"),
        ((["a", "a"], [1.0, 2.0]), {}, "unique"),
        ((["a", "b"], [1.0, np.inf]), {}, "infinite"),
        ((["a", "b"], [1.0, 1e300]), {}, r"predicted_lengths\[1\] = 1e\+300 is larger than 1e15"),
        (
            (["a", "b"], [1.0, 2.0]),
            {"calibration": ([1.0, 2.0], [1.0, 1e16])},
            r"calibration\(predicted_lengths\)\[1\]",
        ),
        ((["a", "b"], [1.0, 0.0]), {}, "zero or negative"),
        (([], []), {}, "empty"),
        ((["a", "b"], [1.0, 2.0]), {"k": 0}, "k must be >= 1"),
        ((["a", "b"], [1.0, 2.0]), {"kappa": -1}, "kappa must be >= 0"),
        ((["a", "b"], [1.0, 2.0]), {"b": 0}, "b must be >= 1"),
        ((["a", "b"], [1.0, 2.0]), {"loads": "calibrated"}, "needs a calibration"),
        ((["a", "b"], [1.0, 2.0]), {"loads": "cooked"}, "loads must be one of"),
        ((["a", "b"], [1.0, 2.0]), {"calibration": lambda x: x - 5}, r"calibration\(predicted_lengths\)"),
        ((["a", "b"], [1.0, 2.0]), {"calibration": ([2.0, 1.0], [1.0, 2.0])}, "strictly increasing"),
        ((["a", "b"], [1.0, 2.0]), {"method": "best"}, "method must be one of"),
    ],
)
def test_bad_input(args: tuple, kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        build_schedule(*args, **{**PAPER, **kwargs}, seed=0)
