"""`evaluate.min_tau`'s justification: the sweep's crossover wording, the gate's message, and
benchmarks/min_tau.py / benchmarks/ablation_real.py on small arguments (the full runs take minutes)."""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import numpy as np
import pandas as pd
import pytest

from asp.config import Params
from asp.schedule import SweepResult
from asp.schedule.min_tau import describe_crossover, gate_message

ROOT = Path(__file__).resolve().parents[2]


def _module(name: str) -> Iterator[ModuleType]:
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(name, None)


@pytest.fixture()
def min_tau_bench() -> Iterator[ModuleType]:
    yield from _module("min_tau")


@pytest.fixture()
def ablation_bench() -> Iterator[ModuleType]:
    yield from _module("ablation_real")


def _sweep(c4: list[float]) -> SweepResult:
    taus = [1.0, 0.5, 0.3, 0.0]
    rows = [
        {"tau": t, "seed": s, "C0": 0.06 + 0.001 * s, "C4_cal": v + 0.001 * s}
        for t, v in zip(taus, c4, strict=True)
        for s in range(3)
    ]
    per_seed = pd.DataFrame(rows)
    cv = per_seed.groupby("tau")[["C0", "C4_cal"]].mean()
    return SweepResult(local=pd.DataFrame(), cv=cv, per_seed=per_seed)


def test_describe_crossover_names_both_criteria() -> None:
    text = describe_crossover(_sweep([0.0, 0.03, 0.07, 0.06]), 3)
    assert "lower group-load CV at every tau >= 0.5 (not at 0.3; means over 3 seeds)" in text
    assert "by more than 2 paired standard errors at every tau >= 0.5" in text
    assert "at every tau of the grid (means over 1 seeds)." in describe_crossover(_sweep([0.0, 0.01, 0.02, 0.03]), 1)
    assert "no lower group-load CV even at the largest tau (1)" in describe_crossover(_sweep([0.1] * 4), 1)


def test_gate_message_says_what_the_threshold_means_and_what_to_do() -> None:
    msg = gate_message(0.2134, 0.35)
    assert msg.startswith("held-out Kendall tau 0.213 is below evaluate.min_tau = 0.35.")
    for hint in (
        "(C4)",
        "(C0)",
        "benchmarks/min_tau.py",
        "prepare.profile_prompts",
        "predictor.epochs",
        "evaluate.on_fail: warn",
        "asp schedule sweep",
    ):
        assert hint in msg


def test_min_tau_default_says_where_it_comes_from() -> None:
    field = Params.model_fields["evaluate"].annotation.model_fields["min_tau"]
    assert "benchmarks/min_tau.py" in (field.description or "")


def test_min_tau_benchmark_on_a_coarse_grid(min_tau_bench: ModuleType, tmp_path: Path, capsys) -> None:
    """A set the oracle balances gives the default; one whose longest answers outweigh a group is named and left
    out."""
    data = tmp_path / "lengths.json"
    x = np.random.default_rng(0).lognormal(5, 0.6, 300)
    tail = x.copy()
    tail[:20] = 30_000.0  # 20 answers of 30k words: the sorted minibatch of them outweighs any group
    rows = [
        {"instruction": f"q{i}", "words:m": float(a), "words:t": float(b)}
        for i, (a, b) in enumerate(zip(x, tail, strict=True))
    ]
    data.write_text(json.dumps({"rows": rows}))
    out = tmp_path / "sweep.json"
    args = ["--data", str(data), "--targets", "m,t", "--demo", "", "--seeds", "3", "--taus", "1,0", "--out", str(out)]
    args += ["--iterations", "20000"]
    got = min_tau_bench.main(args)
    captured = capsys.readouterr()
    text = captured.out
    assert "no demo row" not in captured.err  # --demo '' means none
    assert "| m (words) | 300 |" in text and "C0 − C4 (± SE)" in text
    assert got["results"]["m (words)"]["z_crossover"][0] == 1.0  # the oracle balances; tau 0 does not beat C0
    assert got["results"]["t (words)"]["z_crossover"][0] is None and got["results"]["t (words)"]["tail_ratio"] > 1
    assert "t (words): C4 does not beat C0 even with oracle predictions" in text
    assert json.loads(out.read_text())["implied_min_tau"] == got["implied"] == 1.0
    assert "implied evaluate.min_tau = 1:" in text


def test_ablation_benchmark_tfidf_out_of_fold(ablation_bench: ModuleType, tmp_path: Path, capsys) -> None:
    data = tmp_path / "lengths.json"
    words = ["short", "list", "essay", "poem", "explain", "code"]
    rng = np.random.default_rng(1)
    rows = []
    for i in range(200):
        w = words[i % 6]
        rows.append(
            {"instruction": f"{w} {w} about topic {i % 17}", "words:m": float((i % 6 + 1) * 40 + rng.integers(0, 30))}
        )
    data.write_text(json.dumps({"rows": rows}))
    ablation_bench.main(
        ["--data", str(data), "--targets", "m", "--no-demo", "--seeds", "2", "--oof", str(tmp_path / "none.json")]
        + ["--iterations", "20000"]
    )
    text = capsys.readouterr().out
    assert "predictions: TF-IDF ridge, 5-fold out-of-fold" in text and "| group-load CV |" in text
    assert "2 seeds vary the prompts' order (C0's minibatches), the cross-fitting folds" in text
    oof = tmp_path / "oof.json"
    pred = [float(r["words:m"]) * 1.1 for r in rows]
    oof.write_text(
        json.dumps(
            {"unit": "words", "folds": 5, "targets": {"m": {"prompt_index": list(range(200)), "prediction": pred}}}
        )
    )
    ablation_bench.main(
        ["--data", str(data), "--targets", "m", "--no-demo", "--seeds", "1", "--oof", str(oof), "--iterations", "2000"]
    )
    assert "predictions: the predictor, 5-fold out-of-fold (oof.json) (τ 1.000)" in capsys.readouterr().out
