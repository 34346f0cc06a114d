"""benchmarks/sim_sensitivity.py: every arm of the table runs (a short real run at one grid point, with prompts
visited again), and a later pass of a prompt generates its own lengths there."""

from __future__ import annotations

import numpy as np
import pytest


@pytest.fixture
def bench(bench_module, monkeypatch: pytest.MonkeyPatch):
    module = bench_module("sim_sensitivity")
    # 6 steps of 64 prompts over 128: three passes, so the history-aware arm plans on what it saw
    monkeypatch.setattr(module, "PROMPTS", 128)
    monkeypatch.setattr(module, "ITERATIONS", 6)
    monkeypatch.setattr(module, "SENSITIVITY_GRID", module.SENSITIVITY_GRID[:1])
    return module


def test_a_short_run_prints_every_conclusion(bench, capsys) -> None:
    bench.main(["--no-planner"])
    out = capsys.readouterr().out
    header = "| point | C0 iter s | C4 vs C0 | history vs predictor-only | partial vs not (lag 2) | async vs sync |"
    assert header in out
    for conclusion in ("C4 vs C0", "history vs predictor-only", "partial vs not (lag 2)", "async vs sync"):
        assert f"| {conclusion} faster |" in out


def test_the_workload_s_later_visits_are_its_own(bench) -> None:
    _, _, work, _ = bench.setup()
    # 6 steps x 64 prompts over 128: 3 passes, and two more
    assert work.revisits.shape == (3 + 2 - 1, *work.lengths.shape)
    assert not np.array_equal(work.revisits[0], work.lengths)
