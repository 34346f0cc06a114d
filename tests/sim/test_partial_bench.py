"""benchmarks/partial_rollouts.py keeps running: its simulated part at the GPU preset's layout on a small synthetic
workload (two updates), with and without partial rollouts, prints its table and the partial run continues responses.

Run: ``.venv/bin/python -m pytest tests/sim/test_partial_bench.py -q``
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def _bench():
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location("partial_rollouts", BENCH / "partial_rollouts.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCH))


@pytest.mark.slow  # ~5 s, most of it importing the scheduler (numba)
def test_the_simulated_part_runs_at_the_gpu_layout(capsys):
    bench = _bench()
    rows = bench.sim(2, 2048, 512, ["C0", "C0 + partial (fifo)"], "none")
    out = capsys.readouterr().out
    assert "3 GUs x 4 actors, batch 512 x n=8, cap 8192" in out and "| C0 + partial (fifo) |" in out
    assert rows["C0"]["runtime/summary/continuations"] == 0
    assert rows["C0 + partial (fifo)"]["runtime/summary/continuations"] > 0
    assert rows["C0"]["runtime/summary/iterations"] == rows["C0 + partial (fifo)"]["runtime/summary/iterations"] == 2


@pytest.mark.slow  # ~30 s: 13 grid points x 2 variants of two updates
def test_a_sourced_preset_prints_its_sensitivity_range(capsys):
    bench = _bench()
    rows = bench.sim(2, 2048, 512, ["C4", "C4 + partial (fifo)"], "none", "h100-qwen3-8b")
    out = capsys.readouterr().out
    assert "the published-source preset h100-qwen3-8b" in out and "(assumed)" not in out
    assert "h100-qwen3-8b: mean iteration over C4's, at the preset and across its 13-point grid" in out
    assert rows["C4"]["vs_c4_min"] == rows["C4"]["vs_c4_max"] == 1.0  # C4 against itself at every point
    at = (
        rows["C4 + partial (fifo)"]["runtime/summary/mean_iteration_time_s"]
        / rows["C4"]["runtime/summary/mean_iteration_time_s"]
    )
    assert rows["C4 + partial (fifo)"]["vs_c4_min"] <= at <= rows["C4 + partial (fifo)"]["vs_c4_max"]


def test_the_synthetic_workload_s_later_visits_keep_each_prompt_s_median(bench_module):
    bench_sim = bench_module("bench_sim")
    _, first = bench_sim.synthetic_workload(500)
    _, work = bench_sim.synthetic_workload(500, visits=3)
    assert (work.lengths == first.lengths).all() and first.revisits.shape[0] == 0  # visit 0 as before
    assert work.revisits.shape == (2, 500, bench_sim.N_SAMPLES) and not (work.revisits[0] == work.lengths).all()
    # the per-prompt median (sigma 0.75) outweighs a mean of the samples' noise (0.4 / sqrt n): means correlate
    means = np.log(np.concatenate([work.lengths[None], work.revisits]).mean(axis=2))
    assert np.corrcoef(means[0], means[1])[0, 1] > 0.85
