"""benchmarks/vs_trl.py's bookkeeping: evenly spaced checkpoints, wall-clock to a held-out reward (first checkpoint
that reaches it, nan when none does) and the table's mean ± 95 % t interval (worked by hand)."""

from __future__ import annotations

import math

import pytest


@pytest.fixture
def bench(bench_module):
    return bench_module("vs_trl")


def test_checkpoints_and_time_to_reward(bench) -> None:
    assert bench.checkpoint_steps(30, 3) == [10, 20, 30]
    assert bench.checkpoint_steps(2, 3) == [1, 2]
    cps = [{"wall_s": 10.0, "heldout_reward": 0.2}, {"wall_s": 20.0, "heldout_reward": 0.5}]
    assert bench.time_to(cps, 0.5) == 20.0 and bench.time_to(cps, 0.1) == 10.0
    assert math.isnan(bench.time_to(cps, 0.6))


def test_table_gives_mean_and_t_interval(bench) -> None:
    # two seeds 1.0 and 3.0: mean 2.0, sd 1.414, t(0.975, 1) = 12.706 -> half-width 12.706 * 1.414 / 1.414 = 12.71
    text = bench.summarize({"TRL": [{"time_per_update_s": 1.0}, {"time_per_update_s": 3.0}], "asp C4": [{}]})
    assert "| time per update (s) | 2.00 ± 12.71 | – |" in text
    assert "| wall-clock to TRL's final held-out reward (s) | not reached | not reached |" in text
