"""CPU sharing measured from a launch's records (asp.sim.sharing): hand-worked intervals, and a fit that must
recover the sharing a simulated run was made with."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from asp.sim.sharing import (
    ContentionTable,
    ProbeAnchor,
    anchored_generation_factor,
    anchored_training,
    bound_tables,
    fit_cpu_sharing,
    launch_intervals,
    mean_rates,
    median_interval,
    on_profile_clock,
    probe_clock_doubtful,
    probe_intervals,
    sharing_rate,
)
from asp.sim.timemodel import GenerationTimeModel, TrainingTimeModel, fit_training_model, shared


def test_sharing_rate_is_full_speed_until_the_demand_exceeds_the_cores():
    assert sharing_rate(np.array([0.0, 1.0, 2.0, 3.0, 4.0]), 2.0).tolist() == [1.0, 1.0, 1.0, 2 / 3, 0.5]


def test_mean_rates_hand_worked():
    # 2 cores, one thread per call, the trainer 1 thread. Call A 0-4, call B 0-2, a step 1-3:
    #   [0,1) A+B: demand 2 -> 1;  [1,2) A+B+step: 3 -> 2/3;  [2,3) A+step: 2 -> 1;  [3,4) A: 1 -> 1.
    calls, steps = np.array([[0.0, 4.0], [0.0, 2.0]]), np.array([[1.0, 3.0]])
    rc, rs = mean_rates(calls, steps, cores=2.0, threads_per_actor=1.0, trainer_threads=1.0)
    assert rc == pytest.approx([(1 + 2 / 3 + 1 + 1) / 4, (1 + 2 / 3) / 2])
    assert rs == pytest.approx([(2 / 3 + 1) / 2])
    # a trainer with 3 threads: [1,2) demand 5 -> 2/5, [2,3) demand 4 -> 1/2
    rc, rs = mean_rates(calls, steps, cores=2.0, threads_per_actor=1.0, trainer_threads=3.0)
    assert rc == pytest.approx([(1 + 0.4 + 0.5 + 1) / 4, (1 + 0.4) / 2]) and rs == pytest.approx([0.45])
    # the trainer off the cores: nothing ever exceeds 2 threads
    rc, rs = mean_rates(calls, steps, cores=2.0, threads_per_actor=1.0, trainer_threads=0.0)
    assert rc.tolist() == [1.0, 1.0] and rs.tolist() == [1.0]


def test_launch_intervals_from_the_tables():
    mb = pd.DataFrame(
        {
            "gen_start_s": [0.0, 0.5, 9.0],
            "gen_s": [2.0, 3.0, 1.0],
            "prompts": [4, 4, 4],
            "responses": [8, 8, 8],
            "tokens": [40, 40, 40],
            "max_length": [6, 6, 6],
            "session": [0, 0, 1],  # a resumed session restarts the clock: left out
        }
    )
    it = pd.DataFrame({"step": [2, 1], "runtime/iteration_time_s": [1.5, 3.0], "runtime/train_step_s": [1.0, 0.5]})
    calls, steps = launch_intervals(mb, it)
    assert calls.tolist() == [[0.0, 2.0], [0.5, 3.5]]
    assert steps.tolist() == [[2.5, 3.0], [3.5, 4.5]]  # step 1 ends at 3.0, step 2 at 4.5
    with pytest.raises(ValueError, match=r"lacks columns \['runtime/train_step_s'\]"):
        launch_intervals(mb, it.drop(columns="runtime/train_step_s"))


def _launch(
    rng: np.random.Generator,
    threads: float,
    factor: float,
    base: float,
    per_token: float,
    contention: ContentionTable | None = None,
):
    """A synthetic launch on 2 cores made under a known sharing: 2 actors decode back to back while the trainer
    steps whenever a call ends; each time is its full-speed work / the mean sharing rate it ran at (solved by
    fixed-point iteration on the measured intervals)."""
    gen = GenerationTimeModel(
        "static", (0.2, 0.01, 0.0, 0.0, 0.0), ("intercept", "decode_steps", "row_steps", "prefill_tokens", "kv_reads")
    )
    n = 60
    max_length = rng.integers(20, 160, size=n)
    work = factor * gen.seconds_many(8, 8, max_length, max_length * 40, 80)
    tokens = rng.integers(2000, 9000, size=n // 2)
    train_work = base + per_token * tokens
    seconds, steps_s = work.copy(), train_work.copy()
    for _ in range(60):  # the contention changes the times, which change the contention
        start = np.zeros(n)
        for a in (0, 1):
            idx = np.arange(a, n, 2)
            start[idx] = np.concatenate([[0.0], np.cumsum(seconds[idx])[:-1]])
        end = start + seconds
        step_end = np.sort(end)[1::2] + steps_s
        step_start = step_end - steps_s
        calls, steps = np.column_stack([start, end]), np.column_stack([step_start, step_end])
        rc, rs = mean_rates(
            calls, steps, cores=2.0, threads_per_actor=1.0, trainer_threads=threads, contention=contention
        )
        seconds, steps_s = work / rc, train_work / rs
    iteration = np.diff(np.concatenate([[0.0], step_end]))
    mb = pd.DataFrame(
        {
            "gen_start_s": start,
            "gen_s": seconds,
            "prompts": 8,
            "responses": 64,
            "tokens": max_length * 40,
            "max_length": max_length,
        }
    )
    it = pd.DataFrame(
        {
            "step": np.arange(1, n // 2 + 1),
            "runtime/iteration_time_s": iteration,
            "runtime/train_step_s": steps_s,
            "train/t_train_s": pd.Series(steps_s).rolling(10, min_periods=1).mean(),
            "train/response_tokens": tokens,
            "train/prompts": 16,
            "train/t_save_s": 0.0,
            "train/t_convert_s": 0.0,
            "train/t_load_s": 0.0,
        }
    )
    return mb, it, gen


def test_fit_recovers_the_sharing_a_launch_was_made_with():
    mb, it, gen = _launch(np.random.default_rng(0), threads=1.0, factor=1.25, base=0.4, per_token=2e-4)
    sharing, train, report = fit_cpu_sharing([mb], [it], gen, 10.0, cores=2.0, threads_per_actor=1.0, n_samples=[8])
    assert sharing.trainer_threads == pytest.approx(1.0, abs=0.25)
    assert sharing.generation_factor == pytest.approx(1.25, rel=0.1)
    # at the launch's own batch size (16 prompts x 8): what one batch size identifies
    assert train.step_seconds(5000, 128) == pytest.approx(0.4 + 5000 * 2e-4, rel=0.1)
    assert report["mdape_generation"] < 0.1 and report["mdape_training"] < 0.1
    assert report["trainer_threads_near_min"] <= 1.0 <= report["trainer_threads_near_max"]
    # measured as they are (no sharing), the trainer's steps look slower than its full speed
    naive, _ = fit_training_model([it], n_samples=8)
    assert naive.step_seconds(5000) > 1.1 * train.step_seconds(5000)
    # the simulator applies the generation factor to the profile fit
    assert shared(gen, 1.25).seconds(8, 8, 100, 4000, 80) == pytest.approx(1.25 * gen.seconds(8, 8, 100, 4000, 80))


def test_fit_refuses_unpaired_or_empty_tables():
    mb, it, gen = _launch(np.random.default_rng(1), threads=1.0, factor=1.0, base=0.4, per_token=2e-4)
    with pytest.raises(ValueError, match="one minibatches table, one iterations table"):
        fit_cpu_sharing([mb, mb], [it], gen, 10.0, cores=2.0, threads_per_actor=1.0, n_samples=[8])
    with pytest.raises(ValueError, match="at least 3 generation calls"):
        fit_cpu_sharing([mb.iloc[:2]], [it], gen, 10.0, cores=2.0, threads_per_actor=1.0, n_samples=[8])


def test_a_fixed_trainer_demand_moves_the_slowdown_into_the_generation_factor():
    # made with a 1-thread trainer; told it is 2 threads, the fit blames the trainer for more of the calls'
    # slowdown (a smaller generation factor) and predicts the calls worse than the free fit
    mb, it, gen = _launch(np.random.default_rng(2), threads=1.0, factor=1.25, base=0.4, per_token=2e-4)
    free, _, free_report = fit_cpu_sharing([mb], [it], gen, 10.0, cores=2.0, threads_per_actor=1.0, n_samples=[8])
    fixed, _, report = fit_cpu_sharing(
        [mb], [it], gen, 10.0, cores=2.0, threads_per_actor=1.0, n_samples=[8], grid=(2.0,)
    )
    assert fixed.trainer_threads == 2.0
    assert report["trainer_threads_near_min"] == report["trainer_threads_near_max"] == 2.0
    assert fixed.generation_factor < free.generation_factor
    assert report["mdape_generation"] > free_report["mdape_generation"]


# a measured table: 2 engines alone 1.1x, beside a step 1.6x (the step 1.8x); 1 engine beside a step 1.05x (1.0x)
TABLE = ContentionTable(generation=((1.0, 1.05), (1.1, 1.6)), training=(1.0, 1.8))


def test_contention_table_slowdowns_hand_worked():
    call, step = TABLE.slowdowns(np.array([0, 1, 1, 2, 2, 3, 4]), np.array([1, 0, 1, 0, 1, 1, 0], bool))
    # no engine decoding: nothing to slow; beyond the 2 measured engines the last row scales as k / 2
    assert call.tolist() == pytest.approx([1.0, 1.0, 1.05, 1.1, 1.6, 1.6 * 1.5, 1.1 * 2])
    assert step.tolist() == pytest.approx([1.0, 1.0, 1.0, 1.0, 1.8, 1.8 * 1.5, 1.0])


def test_contention_table_from_the_probe_file_and_its_refusals():
    table = ContentionTable.from_dict({"generation_slowdown": [[1, 1.05], [1.1, 1.6]], "training_slowdown": [1, 1.8]})
    assert table == TABLE
    with pytest.raises(ValueError, match="not a sharing probe"):
        ContentionTable.from_dict({"generation_slowdown": [[1, 1.05]]})
    with pytest.raises(ValueError, match="one generation row and one training entry"):
        ContentionTable(generation=((1.0, 1.0),), training=(1.0, 1.2))
    with pytest.raises(ValueError, match="finite and > 0"):
        ContentionTable(generation=((1.0, 0.0),), training=(1.0,))


def test_mean_rates_under_a_contention_table_hand_worked():
    # call A 0-4, call B 0-2, a step 1-3 (as above), the table's rates:
    #   [0,1) 2 engines: call 1/1.1;  [1,2) 2 engines + step: call 1/1.6, step 1/1.8;
    #   [2,3) 1 engine + step: call 1/1.05, step 1/1.0;  [3,4) A alone: 1.
    calls, steps = np.array([[0.0, 4.0], [0.0, 2.0]]), np.array([[1.0, 3.0]])
    rc, rs = mean_rates(calls, steps, cores=2.0, threads_per_actor=1.0, trainer_threads=0.0, contention=TABLE)
    assert rc == pytest.approx([(1 / 1.1 + 1 / 1.6 + 1 / 1.05 + 1) / 4, (1 / 1.1 + 1 / 1.6) / 2])
    assert rs == pytest.approx([(1 / 1.8 + 1.0) / 2])


def test_fit_under_a_contention_table_recovers_the_generation_factor():
    rng = np.random.default_rng(3)
    mb, it, gen = _launch(rng, threads=0.0, factor=1.2, base=0.4, per_token=2e-4, contention=TABLE)
    sharing, train, report = fit_cpu_sharing(
        [mb], [it], gen, 10.0, cores=2.0, threads_per_actor=1.0, n_samples=[8], contention=TABLE
    )
    assert report["contention"] == 1.0 and sharing.trainer_threads == 0.0  # no demand fitted
    assert sharing.generation_factor == pytest.approx(1.2, rel=0.02)
    assert train.step_seconds(5000, 128) == pytest.approx(0.4 + 5000 * 2e-4, rel=0.05)
    assert report["mdape_generation"] < 0.02
    # processor sharing on the same launch explains it worse
    _, _, ps_report = fit_cpu_sharing([mb], [it], gen, 10.0, cores=2.0, threads_per_actor=1.0, n_samples=[8])
    assert ps_report["mdape_generation"] > report["mdape_generation"]


def test_probe_anchor_from_the_probe_file():
    probe = {
        "alone_step_s": 0.8,
        "training_load": {"response_tokens": 4000, "sequences": 128},
        "alone_calls": [{"seconds": 0.5, "prompts": 8, "responses": 64, "tokens": 2000, "max_length": 60,
                         "prompt_tokens": 400}],
    }  # fmt: skip
    anchor = ProbeAnchor.from_probe(probe)
    assert anchor is not None and (anchor.step_seconds, anchor.step_tokens, anchor.step_sequences) == (0.8, 4000, 128)
    assert anchor.calls[0]["max_length"] == 60
    assert ProbeAnchor.from_probe({"alone_step_s": 0.8, "training_load": {"sequences": 128}}) is None  # stand-in's
    assert ProbeAnchor.from_probe({**probe, "alone_calls": None}).calls == ()


def test_anchored_training_hand_worked():
    # a step alone of 1.0 s with 0.1 s of export on 800 response tokens and 16 sequences of 12.5 prompt tokens:
    # 0.9 s / (800 + 12.5 x 16) tokens = 0.9 ms per token, 11.25 ms per sequence, refresh costs kept
    refresh = TrainingTimeModel(2.0, 5e-3, save_s=0.08, convert_s=0.02, load_s=0.3, step_per_sample_s=1.0)
    train = anchored_training(refresh, ProbeAnchor(1.0, 800.0, 16.0), 12.5)
    assert train.step_base_s == 0.0 and train.step_per_token_s == pytest.approx(9e-4)
    assert train.step_per_sample_s == pytest.approx(0.01125)
    assert (train.save_s, train.convert_s, train.load_s) == (0.08, 0.02, 0.3)
    assert train.step_seconds(800, 16) + train.publish_seconds() == pytest.approx(1.0)  # the anchor itself
    assert train.step_seconds(1600, 32) == pytest.approx(1.8)  # twice the batch: twice the work
    with pytest.raises(ValueError, match="must outlast the export"):
        anchored_training(refresh, ProbeAnchor(0.1, 800.0, 16.0), 12.5)


def test_anchored_generation_factor_hand_worked():
    gen = GenerationTimeModel(
        "static", (0.2, 0.01, 0.0, 0.0, 0.0), ("intercept", "decode_steps", "row_steps", "prefill_tokens", "kv_reads")
    )
    # the fit says 0.2 + 0.01 x 60 = 0.8 s and 0.2 + 0.01 x 100 = 1.2 s; the calls took 1.25x that
    calls = [
        {"seconds": 1.0, "prompts": 8, "responses": 64, "tokens": 2000, "max_length": 60, "prompt_tokens": 400},
        {"seconds": 1.5, "prompts": 8, "responses": 64, "tokens": 3000, "max_length": 100, "prompt_tokens": 400},
    ]
    assert anchored_generation_factor(gen, calls) == pytest.approx(1.25)
    with pytest.raises(ValueError, match="no call"):
        anchored_generation_factor(gen, [])
    with pytest.raises(ValueError, match="lacks 'max_length'"):
        anchored_generation_factor(gen, [{k: v for k, v in calls[0].items() if k != "max_length"}])


def test_on_profile_clock_moves_the_probe_s_step_by_its_calls_hand_worked():
    gen = GenerationTimeModel(
        "static", (0.2, 0.01, 0.0, 0.0, 0.0), ("intercept", "decode_steps", "row_steps", "prefill_tokens", "kv_reads")
    )
    refresh = TrainingTimeModel(0.0, 1e-3, save_s=0.08, convert_s=0.02, load_s=0.3, step_per_sample_s=0.0)
    # the fit says 0.8 s and 1.2 s; the probe's sitting ran them 1.25x slower: its 1.0 s step is 0.8 s on the
    # profile's clock, 0.7 s of it work over 800 response + 12.5 x 16 prompt tokens = 0.7 ms per token
    slow = [
        {"seconds": 1.0, "prompts": 8, "responses": 64, "tokens": 2000, "max_length": 60, "prompt_tokens": 400},
        {"seconds": 1.5, "prompts": 8, "responses": 64, "tokens": 3000, "max_length": 100, "prompt_tokens": 400},
    ]
    train, clock = on_profile_clock(gen, refresh, ProbeAnchor(1.0, 800.0, 16.0, tuple(slow)), 12.5)
    assert clock == pytest.approx(1.25)
    assert train.step_per_token_s == pytest.approx(7e-4) and train.step_per_sample_s == pytest.approx(12.5 * 7e-4)
    assert (train.step_base_s, train.save_s, train.load_s) == (0.0, 0.08, 0.3)
    # a probe sitting twice as fast (clock 0.5): its 1.0 s step is 2.0 s here, 1.9 s of it work
    fast = tuple({**c, "seconds": c["seconds"] / 2.5} for c in slow)
    train, clock = on_profile_clock(gen, refresh, ProbeAnchor(1.0, 800.0, 16.0, fast), 12.5)
    assert clock == pytest.approx(0.5) and train.step_per_token_s == pytest.approx(1.9e-3)
    with pytest.raises(ValueError, match="no call"):
        on_profile_clock(gen, refresh, ProbeAnchor(1.0, 800.0, 16.0), 12.5)


def test_an_anchored_fit_takes_full_speed_from_the_probe_not_the_launch():
    rng = np.random.default_rng(3)
    # a step costs 2e-4 s per response and prompt token: 128 sequences of 10 prompt tokens are a fixed 0.256 s here
    mb, it, gen = _launch(rng, threads=0.0, factor=1.2, base=0.256, per_token=2e-4, contention=TABLE)
    # the probe timed the step alone at 2e-4 s per token (1000 + 10 x 16 tokens) and calls alone at 1.2x the fit
    calls = [{"seconds": 1.2 * gen.seconds(8, 8, m, 40 * m, 80), "prompts": 8, "responses": 64, "tokens": 40 * m,
              "max_length": m, "prompt_tokens": 80} for m in (30, 90, 150)]  # fmt: skip
    anchor = ProbeAnchor(2e-4 * 1160, 1000.0, 16.0, tuple(calls))
    kwargs = {"cores": 2.0, "threads_per_actor": 1.0, "n_samples": [8], "contention": TABLE, "anchor": anchor}
    sharing, train, report = fit_cpu_sharing([mb], [it], gen, 10.0, **kwargs)
    assert report["anchored"] == 1.0 and report["generation_anchored"] == 1.0
    assert sharing.generation_factor == pytest.approx(1.2)
    assert train.step_per_token_s == pytest.approx(2e-4) and train.step_per_sample_s == pytest.approx(2e-3)
    assert report["mdape_generation"] < 0.02 and report["mdape_training"] < 0.02  # the launch agrees: a check
    # a launch twice as slow changes the errors, not the terms
    slow = it.assign(**{"train/t_train_s": 2 * it["train/t_train_s"]})
    _, train2, report2 = fit_cpu_sharing([mb], [slow], gen, 10.0, **kwargs)
    assert train2.step_per_token_s == pytest.approx(2e-4)
    assert report2["mdape_training"] > report["mdape_training"] + 0.1
    # a probe without calls alone: the generation factor comes from the launch
    _, _, report3 = fit_cpu_sharing([mb], [it], gen, 10.0, **{**kwargs, "anchor": ProbeAnchor(0.232, 1000.0, 16.0)})
    assert report3["generation_anchored"] == 0.0 and report3["generation_factor"] == pytest.approx(1.2, rel=0.02)


def test_median_interval_hand_worked():
    # n = 20: P(B <= 5) = 21,700 / 2^20 = 0.0207 <= 0.05 < P(B <= 6) = 0.0577, so the 6th and 15th values (coverage
    # 1 - 2 x 0.0207 = 0.959); the order of the values does not matter
    assert median_interval(list(range(20, 0, -1))) == (6.0, 15.0)
    # n = 5: P(B <= 0) = 1/32 <= 0.05 < P(B <= 1) = 6/32: min and max (coverage 0.9375)
    assert median_interval([5, 1, 4, 2, 3]) == (1.0, 5.0)
    assert median_interval([3.0]) == (3.0, 3.0) and median_interval([2, 1]) == (1.0, 2.0)  # too few: min-max
    assert median_interval(list(range(1, 21)), level=0.5)[0] > 6  # a lower level, a narrower interval
    with pytest.raises(ValueError, match="need values and a level"):
        median_interval([])
    with pytest.raises(ValueError, match="need values and a level"):
        median_interval([1.0], level=1.0)


ROUNDS = {  # a probe's per-round ratios: (k engines)[+training] -> the calls' and the steps' ratios
    "1": {"calls": [1.0] * 5, "steps": []},
    "1+training": {"calls": [1.1, 1.3, 1.2, 1.0, 1.4], "steps": [1.05, 1.0, 1.1, 1.2, 1.15]},
    "2": {"calls": [1.5, 1.1, 1.2, 1.3, 1.4], "steps": []},
    "2+training": {"calls": [1.6, 1.7, 1.5, 1.9, 1.8], "steps": [1.9, 1.7, 1.8, 2.0, 1.6]},
}


def test_probe_intervals_and_the_tables_at_their_ends_hand_worked():
    intervals = probe_intervals({"rounds_ratios": ROUNDS})
    assert intervals is not None
    # five values each: the median and (min, max), `median_interval` at n = 5
    assert intervals[(1, False, "call")] == (1.0, 1.0, 1.0)
    assert intervals[(1, True, "call")] == pytest.approx((1.2, 1.0, 1.4))
    assert intervals[(1, True, "step")] == pytest.approx((1.1, 1.0, 1.2))
    assert intervals[(2, False, "call")] == pytest.approx((1.3, 1.1, 1.5))
    assert intervals[(2, True, "step")] == pytest.approx((1.8, 1.6, 2.0))
    assert (1, False, "step") not in intervals  # no step ran without training
    table = ContentionTable(generation=((1.0, 1.2), (1.3, 1.7)), training=(1.1, 1.8))
    low, high = bound_tables(table, intervals)
    assert low == ContentionTable(generation=((1.0, 1.0), (1.1, 1.5)), training=(1.0, 1.6))
    assert high == ContentionTable(generation=((1.0, 1.4), (1.5, 1.9)), training=(1.2, 2.0))
    # a slowdown without an interval keeps its value at both ends
    partial = {k: v for k, v in intervals.items() if k[0] == 1}
    assert bound_tables(table, partial)[0].generation[1] == (1.3, 1.7)
    # widened 2x about the median; a low end stays at or above min(1, its own value)
    wide = probe_intervals({"rounds_ratios": ROUNDS}, widen=2.0)
    assert wide is not None
    assert wide[(2, True, "call")] == pytest.approx((1.7, 1.3, 2.1))
    assert wide[(2, False, "call")] == pytest.approx((1.3, 1.0, 1.7))  # 1.3 - 2 x 0.2 = 0.9: held at 1
    assert wide[(1, True, "step")] == pytest.approx((1.1, 1.0, 1.3))
    with pytest.raises(ValueError, match="widen must be >= 1"):
        probe_intervals({"rounds_ratios": ROUNDS}, widen=0.5)
    assert probe_intervals({"generation_slowdown": [[1, 1]]}) is None  # an older probe kept no rounds
    with pytest.raises(ValueError, match="rounds_ratios: not per-setting ratios"):
        probe_intervals({"rounds_ratios": {"two": {"calls": [1.0]}}})


def test_the_probe_s_clock_is_doubted_beyond_10_percent_only_where_it_moves_the_trainer() -> None:
    assert not probe_clock_doubtful(None, "grpo", False)  # no probe anchor
    assert not probe_clock_doubtful(1.08, "grpo", False) and not probe_clock_doubtful(0.91, "grpo", False)  # 10 %
    assert probe_clock_doubtful(1.18, "grpo", False) and probe_clock_doubtful(0.82, "grpo", False)
    assert not probe_clock_doubtful(0.82, "grpo", True)  # the step timed in the sitting: the clock moves nothing
    assert not probe_clock_doubtful(0.82, "simulated", False)  # a trainer that computes nothing: nor does it
