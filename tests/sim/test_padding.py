"""asp.sim.padding: the throughput padding rates buy under a continuous-batching decode cost, by hand."""

from __future__ import annotations

import pytest

from asp.sim.padding import padding_for_ratio, throughput_ratio


def test_pure_per_step_cost_scales_throughput_with_one_minus_padding():
    # seconds per token = 1 / (32 (1 - p)): 0.75 / 0.9 of the time at p = 0.1 vs p = 0.25 -> 1.2x
    assert throughput_ratio(1.0, 0.0, 32, 0.25, 0.1) == pytest.approx(0.9 / 0.75)
    assert padding_for_ratio(1.0, 0.0, 32, 0.25, 1.2) == pytest.approx(0.1)


def test_per_sequence_cost_caps_what_padding_can_buy():
    # per_step 32, per_seq 1, 32 sequences: seconds per token = 1 / (1 - p) + 1
    # p = 0.5 -> 3, p = 0 -> 2: at most 1.5x; 1.2x needs 2.5 -> 1 / (1 - p) = 1.5 -> p = 1/3
    assert throughput_ratio(32.0, 1.0, 32, 0.5, 0.0) == pytest.approx(1.5)
    assert padding_for_ratio(32.0, 1.0, 32, 0.5, 1.2) == pytest.approx(1 / 3)
    assert padding_for_ratio(32.0, 1.0, 32, 0.5, 2.0) is None  # beyond zero padding
    assert padding_for_ratio(0.0, 1.0, 32, 0.5, 1.1) is None  # no per-step cost: padding is free


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((-1.0, 1.0, 32, 0.2, 0.1), "costs"),
        ((1.0, 1.0, 0, 0.2, 0.1), "sequences"),
        ((1.0, 1.0, 32, 1.0, 0.1), "padding"),
    ],
)
def test_bad_arguments_are_refused(args, match):
    with pytest.raises(ValueError, match=match):
        throughput_ratio(*args)
