"""benchmarks/history_real.py on one chain at the demo layout for two passes (phi-2-sft -> phi-2-dpo, the real
predictor's out-of-fold predictions): pass 1 has no history (every load is the prediction: C4 with history is C4 on
predictor loads), and at pass 2, with 90 % of the prompts seen, the loads rank the new policy's lengths better than
the predictor alone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


def test_two_passes_at_the_demo_layout(bench_module, tmp_path: Path, capsys) -> None:
    bench = bench_module("history_real")

    out = tmp_path / "rows.json"
    png = tmp_path / "history.png"
    argv = ["--chains", "phi", "--layouts", "demo", "--passes", "2", "--anneal", "2000", "--json", str(out)]
    bench.main([*argv, "--plot", str(png)])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    first, second = json.loads(out.read_text())["rows"]
    assert first["known"] == 0.0 and first["tau blend"] == first["tau pred"]
    assert first["iter C4 hist"] == first["iter C4 pred"]  # the same loads, the same schedule
    assert second["known"] == pytest.approx(1 - 80 / 805, abs=1e-9)  # the in-flight window: 16 + 1 x (2 + 2) x 16
    assert second["tau blend"] > second["tau pred"] + 0.08
    assert "| phi | demo | 2 |" in capsys.readouterr().out


def test_gpu_copies_are_distinct_prompts_and_gradual_drift_interpolates(bench_module) -> None:
    import numpy as np

    bench = bench_module("history_real")

    pred, raw, (a, b) = bench.chain_inputs("tulu", 3, 0.0, 0, "shuffle", 16)
    size = pred.size // 3
    np.testing.assert_array_equal(pred[size : 2 * size], pred[:size])  # a copy keeps its prompt's predictions
    np.testing.assert_array_equal(raw[2 * size :], raw[:size])
    order = np.lexsort((np.arange(size), raw[:size], pred[:size]))
    for c in (1, 2):
        copy_a, copy_b = a[c * size : (c + 1) * size], b[c * size : (c + 1) * size]
        assert not np.array_equal(copy_a, a[:size])  # another prompt's lengths ...
        for start in range(0, size, 16):  # ... drawn from the same bin of 16 prompts adjacent in prediction
            members = order[start : start + 16]
            assert sorted(copy_a[members]) == sorted(a[members]) and sorted(copy_b[members]) == sorted(b[members])
    _, _, exact = bench.chain_inputs("tulu", 3, 0.0, 0, "exact", 16)
    np.testing.assert_array_equal(exact[0][size : 2 * size], exact[0][:size])
    assert bench.pass_means([a, b], 1, 3, "abrupt") is b
    np.testing.assert_allclose(bench.pass_means([a, b], 1, 3, "gradual"), np.sqrt(a * b))
    np.testing.assert_allclose(bench.pass_means([a, b], 2, 3, "gradual"), b)


def test_a_preset_time_model_adds_the_sensitivity_range(bench_module, tmp_path: Path, capsys) -> None:
    """Under a published-source preset every row carries each schedule's iteration time at the 13 grid points, and
    the table prints C4 / C0 with its min-max over them (the preset's own value inside the range)."""
    bench = bench_module("history_real")

    from asp.sim.presets import SENSITIVITY_GRID

    out = tmp_path / "rows.json"
    argv = ["--chains", "phi", "--layouts", "demo", "--passes", "1", "--anneal", "500", "--json", str(out)]
    bench.main([*argv, "--time-model", "h100-qwen3-8b"])
    (row,) = json.loads(out.read_text())["rows"]
    assert len(row["grid C0"]) == len(row["grid C4 hist"]) == len(SENSITIVITY_GRID)
    assert row["grid C0"][0] == pytest.approx(row["iter C0"])  # the grid's first point is the preset itself
    ratios = [a / b for a, b in zip(row["grid C4 hist"], row["grid C0"], strict=True)]
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("| phi | demo | 1 |"))
    assert f"[{min(ratios):.3f}-{max(ratios):.3f}]" in line
    with pytest.raises(SystemExit) as exit_info:  # an unknown name: a usage error listing the valid ones
        bench.main([*argv, "--time-model", "h100-nonexistent"])
    assert exit_info.value.code == 2 and "h100-qwen3-8b" in capsys.readouterr().err
