"""benchmarks/sim_paper.py: the paper's results recomputed. The table of the paper's other measurements of the same
runs (hand-worked errors: relative for times and depths, absolute for a trend), a short real run of the whole script
(every table printed, every condition of Table 4(b) simulated), and a bad layout refused with exit code 2."""

from __future__ import annotations

import numpy as np
import pytest


@pytest.fixture
def bench(bench_module):
    return bench_module("sim_paper")


def _run(**values: float) -> dict[str, float]:
    keys = ("gen_std", "tps_std", "trend", "queue_std", "queue_max", "mean")
    return {k: values.get(k, 1.0) for k in keys}


def test_other_measurements_gives_each_error_against_the_paper(bench) -> None:
    r1 = {"C0": [_run(gen_std=60.0), _run(gen_std=76.0)], "C4": [_run(gen_std=96.0, tps_std=57.4)]}
    r3 = {c: [_run(mean=180.0, trend=0.5, queue_std=36.0, queue_max=220.0)] for c in bench.CONDITIONS}
    lines = bench.other_measurements(r1, r3).splitlines()
    assert lines[0].startswith("| the paper's other measurements of the same runs | paper |")
    # C0: mean of 60 and 76 = 68, the paper's 68: +0 %; C4: 96 against 48: +100 %
    assert "| 1. STD of minibatch generation time (s), C0 | 68.0 | 68.0 (60.0 to 76.0) | +0 % |" in lines
    assert "| 1. STD of minibatch generation time (s), C4 | 48.0 | 96.0 (96.0 to 96.0) | +100 % |" in lines
    assert "| 1. STD of a minibatch's vLLM tokens/s/NPU, C4 | 57.4 | 57.4 (57.4 to 57.4) | +0 % |" in lines
    # a trend is a correlation: its error is the difference (C1: 0.5 - 0.67 = -0.17)
    assert "| 3. Table 4(b) iteration-time trend, C1 | +0.670 | +0.500 (+0.500 to +0.500) | -0.17 (abs.) |" in lines
    assert "| 3. Table 4(b) mean iteration (s), C3 | 190.0 | 180.0 (180.0 to 180.0) | -5 % |" in lines
    assert "| 3. Table 4(b) Training Queue max (samples), C4 | 110.0 | 220.0 (220.0 to 220.0) | +100 % |" in lines
    assert len(lines) == 2 + 4 + 4 * 5  # header, run 1's four spreads, four measurements of five conditions


def test_a_short_run_prints_every_table(bench, capsys) -> None:
    bench.main(["--seeds", "1", "--iterations", "12", "--t4b-actors", "8"])
    out = capsys.readouterr().out
    assert "| 1. C4 vs C0 | -10.9 % |" in out and "| 2. speed-up | 2.69x |" in out
    assert "| what run 1's scheduling gain needs | value | how |" in out
    assert "| C4 / C0 throughput at Table 4(a)'s paddings, per-step cost only | 1.145x |" in out
    for c in bench.CONDITIONS:
        assert f"| 3. Table 4(b) iteration-time trend, {c} |" in out


def test_the_paper_s_measured_paddings_bound_its_gain(bench) -> None:
    # per-step cost only: seconds per token ~ 1 / (1 - P), so 0.776 / 0.678 = 1.1445x, short of 126 / 106 = 1.189x
    assert bench.table_4a_ratio(1.0, 0.0, 32) == pytest.approx(0.776 / 0.678)
    assert bench.table_4a_ratio(1.0, 0.0, 32) < 126 / 106
    # a per-sequence share can only shrink it: (1 / (32 x 0.678) + 1) / (1 / (32 x 0.776) + 1)
    assert bench.table_4a_ratio(1.0, 1.0, 32) == pytest.approx((1 / (32 * 0.678) + 1) / (1 / (32 * 0.776) + 1))


def test_later_visits_keep_each_prompt_s_effect_and_draw_the_samples_again(bench) -> None:
    first = bench.lengths_with_mean(400, 3000.0, seed=1)
    visits = bench.lengths_with_mean(400, 3000.0, seed=1, visits=3)
    assert visits.shape == (3, 400, bench.N)
    assert (visits[0] == first).all() and not (visits[1] == visits[0]).all()  # visit 0 as before, then new draws
    # the prompt effect (sigma 0.75) outweighs a mean of 8 samples' noise (0.4 / sqrt 8): prompt means correlate
    means = np.log(visits.mean(axis=2))
    assert np.corrcoef(means[0], means[1])[0, 1] > 0.9 and np.corrcoef(means[1], means[2])[0, 1] > 0.9
    assert abs(visits[1].mean() / visits[0].mean() - 1) < 0.05  # at the first visit's median


@pytest.mark.parametrize("actors", ["6", "0"])
def test_a_layout_not_in_four_equal_gus_is_a_usage_error(bench, capsys, actors: str) -> None:
    with pytest.raises(SystemExit) as exc:
        bench.main(["--t4b-actors", actors])
    assert exc.value.code == 2
    assert f"--t4b-actors {actors}: give a positive multiple of 4" in capsys.readouterr().err
