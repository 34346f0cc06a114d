"""benchmarks/probe_spread.py: three probe files whose per-round ratios are written by hand, their intervals and how
many of the other probes' values each holds (hand-worked), as it is and `SITTING_WIDTH` as wide; the --probe option
of benchmarks/sim_validation.py; and bad files named with exit code 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from asp.sim.sharing import SITTING_WIDTH


def _probe(path: Path, two_alone: list[float]) -> str:
    """A probe of 1-2 engines whose ratios are fixed but for two engines decoding alone."""
    rounds = {
        "1": {"calls": [1.0] * 5, "steps": []},
        "1+training": {"calls": [1.1] * 5, "steps": [1.05] * 5},
        "2": {"calls": two_alone, "steps": []},
        "2+training": {"calls": [1.6] * 5, "steps": [1.7] * 5},
    }
    record = {
        "generation_slowdown": [[1.0, 1.1], [sorted(two_alone)[2], 1.6]],
        "training_slowdown": [1.05, 1.7],
        "rounds_ratios": rounds,
        "engine": "hf",
        "date": "2026-12-07",
        "prompts_per_call": 16,
        "repeats": 5,
        "alone_step_s": 0.75,
    }
    path.write_text(json.dumps(record))
    return f"{path.stem}={path}"


def test_the_intervals_and_the_other_probes_they_hold(bench_module, tmp_path: Path, capsys) -> None:
    bench = bench_module("probe_spread")
    # five values each: the median and (min, max) (asp.sim.sharing.median_interval at n = 5)
    a = _probe(tmp_path / "a.json", [1.10, 1.12, 1.14, 1.16, 1.18])  # 1.14 [1.10-1.18]
    b = _probe(tmp_path / "b.json", [1.12, 1.15, 1.17, 1.19, 1.22])  # 1.17 [1.12-1.22]
    c = _probe(tmp_path / "c.json", [1.25, 1.28, 1.30, 1.32, 1.35])  # 1.30 [1.25-1.35]
    bench.main([a, b, c])
    out = capsys.readouterr().out
    assert "| a | hf, 2026-12-07 | 16, 5 | 0.750 |" in out and "1.140 [1.100-1.180]" in out
    # the widest is b's (0.10 / 2 / 1.17); a holds b's 1.17, b holds a's 1.14, c holds neither and no one c's 1.30
    # 2.8x as wide: a is 1.14 +- 0.112 (1.028-1.252): holds b; b 1.17 -0.14/+0.14 (1.03-1.31): holds a and c;
    # c 1.30 +- 0.14 (1.16-1.44): holds b: 4 of 6
    assert pytest.approx(2.8) == SITTING_WIDTH
    assert "| 2 alone | 1.140-1.300 | ±4.3 % | 2 of 6 (33 %) | 4 of 6 (67 %) |" in out
    assert "| 2 + step: call | 1.600-1.600 | ±0.0 % | 6 of 6 (100 %) | 6 of 6 (100 %) |" in out


def test_bad_files_are_named_with_exit_code_2(bench_module, tmp_path: Path, capsys) -> None:
    bench = bench_module("probe_spread")
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"generation_slowdown": [[1, 1]], "training_slowdown": [1]}))
    with pytest.raises(SystemExit) as exc:
        bench.main([str(old)])
    assert exc.value.code == 2 and f"error: {old}: keeps no per-round ratios" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        bench.main([str(tmp_path / "none.json")])
    assert exc.value.code == 2 and "none.json: not a sharing probe" in capsys.readouterr().err
    validation = bench_module("sim_validation")
    with pytest.raises(SystemExit) as exc:
        validation.main(["--table", "sync", "--probe", str(tmp_path / "none.json")])
    assert exc.value.code == 2 and "--probe" in capsys.readouterr().err
