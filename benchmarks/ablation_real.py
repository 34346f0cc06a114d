"""Benchmark: the C0-C4 schedule ablation on the demo's held-out prompts and on real answer lengths.

Every condition of a seed sees the same inputs (`asp.schedule.ablation.run_ablation`): the prompts in one order
and one load vector, the 5-fold cross-fitted isotonic calibration of the predictions against the true lengths
(C1 sorts those loads, C2 cuts the same order with the DP, C3 shuffles C2's minibatches, C4 balances them). Each
seed varies the prompts' order (C0's minibatches), the cross-fitting folds, C3's shuffle and C4's annealing; the
prompts and the predictions are the same in every seed. Tables give mean ± standard deviation over seeds.
Scheduler settings are the pipeline's `schedule:` params (params.yaml).

- demo: what the `schedule` stage computes (`asp.pipeline.schedule.heldout_ablation`) on the pipeline's outputs
  (outputs/predictions.parquet, outputs/calibration.json, outputs/profile, outputs/prompts/heldout.parquet):
  the held-out prompts, true = profiled mean lengths (tokens), predictions from the trained predictor.
- real: data/alpaca_eval_lengths.json (805 AlpacaEval instructions; a chat model's answer length in whitespace
  words), out-of-fold predictions: the predictor's from benchmarks/predictor_real.py's
  benchmarks/results/predictor_real_oof.json when it is there (`--oof`), otherwise a TF-IDF (word 1-2 grams)
  ridge on log(1 + length) cross-fitted here over 5 seeded folds (no prompt predicted by a model fitted on it).

    .venv/bin/python benchmarks/ablation_real.py                 # demo + the three targets, 10 seeds, ~1 min
    .venv/bin/python benchmarks/ablation_real.py --no-demo --targets phi-2-sft --seeds 3
    .venv/bin/python benchmarks/ablation_real.py --predictions tfidf    # ignore the OOF file
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "data" / "alpaca_eval_lengths.json"
OOF = ROOT / "benchmarks" / "results" / "predictor_real_oof.json"
TARGETS = ("Qwen1.5-7B-Chat", "phi-2-sft", "tulu-2-dpo-7b")
FOLDS = 5
NAMES = {"C0": "C0 original", "C1": "C1 sorted", "C2": "C2 DP", "C3": "C3 shuffled DP", "C4": "C4 balanced (ASP)"}
ROWS = (("D", "dispersion D", "{:.3g}"), ("P", "padding rate P", "{:.3f}"), ("CV", "group-load CV", "{:.4f}"))
ROWS += (("spread", "group-load spread (max/min)", "{:.2f}"),)


def tfidf_oof(texts: list[str], y: np.ndarray, folds: int, seed: int) -> np.ndarray:
    """Out-of-fold TF-IDF ridge predictions (lengths): each fold predicted by a model fitted on the others."""
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import RidgeCV

    fold = np.empty(len(texts), dtype=np.int64)
    fold[np.random.default_rng(seed).permutation(len(texts))] = np.arange(len(texts)) % folds
    out = np.empty(len(texts))
    for f in range(folds):
        tr, te = np.flatnonzero(fold != f), np.flatnonzero(fold == f)
        vec = TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True, min_df=2)
        reg = RidgeCV(alphas=np.logspace(-2, 2, 9)).fit(vec.fit_transform([texts[i] for i in tr]), np.log1p(y[tr]))
        out[te] = np.expm1(reg.predict(vec.transform([texts[i] for i in te])))
    return out


def real_inputs(data: Path, target: str, source: str, oof: Path, seed: int) -> tuple[np.ndarray, np.ndarray, str]:
    """(true lengths >= 1, out-of-fold predictions > 0, what the predictions are) of one target model."""
    rows = json.loads(data.read_text())["rows"]
    true = np.maximum(np.asarray([r[f"words:{target}"] for r in rows], dtype=np.float64), 1.0)
    if source in ("auto", "oof") and oof.is_file():
        got = json.loads(oof.read_text())
        if got.get("unit", "words") != "words":
            raise SystemExit(f"{oof}: unit {got.get('unit')!r}; this benchmark uses words")
        t = got["targets"].get(target)
        if t is not None:
            idx = np.asarray(t["prompt_index"], dtype=np.int64)
            pred = np.full(true.size, np.nan)
            pred[idx] = t["prediction"]
            keep = np.flatnonzero(np.isfinite(pred))
            label = f"the predictor, {got.get('folds')}-fold out-of-fold ({oof.name})"
            return true[keep], np.maximum(pred[keep], 1e-3), label
        if source == "oof":
            raise SystemExit(f"{oof}: no predictions for {target}")
    elif source == "oof":
        raise SystemExit(f"{oof}: missing; run benchmarks/predictor_real.py first or use --predictions tfidf")
    pred = tfidf_oof([r["instruction"] for r in rows], true, FOLDS, seed)
    return true, np.maximum(pred, 1e-3), f"TF-IDF ridge, {FOLDS}-fold out-of-fold"


def markdown(title: str, res: Any, extra: str) -> str:
    """The C0-C4 table (mean ± sd over seeds) with what the seeds varied."""
    head = "| | " + " | ".join(NAMES[c] for c in res.mean.index) + " |"
    lines = [f"**{title}** — {extra}; loads' Kendall τ {res.loads_tau:.3f}", "", head, "|---" * 6 + "|"]
    for key, label, f in ROWS:
        cells = [f"{f.format(res.mean.at[c, key])} ± {f.format(res.sd.at[c, key])}" for c in res.mean.index]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines.append(f"\n{len(res.seeds)} seeds vary {res.varies}; the prompts and predictions are fixed.")
    return "\n".join(lines)


def demo(params: Any, seeds: int, spec: Any) -> str | None:
    """The schedule stage's held-out ablation on the pipeline's outputs, with `seeds` seeds."""
    from asp.pipeline import schedule as stage
    from asp.predictor.metrics import kendall_tau
    from asp.schedule.ablation import run_ablation
    from asp.steps.paths import SchedulePaths, rebase

    paths = rebase(SchedulePaths(), ROOT)
    try:
        preds, calibration, true = stage.load_inputs(paths)
    except Exception as exc:  # noqa: BLE001 - a missing pipeline output: say so and go on with the real data
        print(f"demo skipped: {exc}", file=sys.stderr)
        return None
    if true is None:
        print("demo skipped: no profile / held-out split in outputs/ (run `dvc repro predict`)", file=sys.stderr)
        return None
    joined = preds.merge(true, on="prompt_id", how="inner")
    pred, lengths = joined["predicted_length"].to_numpy(np.float64), joined["mean_length"].to_numpy(np.float64)
    folds = stage.ablation_folds(pred, calibration, params.schedule.loads)
    res = run_ablation(
        lengths,
        pred,
        spec,
        seeds=[params.common.seed + i for i in range(seeds)],
        loads="raw",
        cross_fit=folds,
    )
    extra = f"{len(joined)} held-out prompts, the trained predictor (held-out τ {kendall_tau(pred, lengths):.3f})"
    return markdown("demo", res, extra)


def main(argv: list[str] | None = None) -> None:
    from asp.config import load_params
    from asp.predictor.metrics import kendall_tau
    from asp.schedule.ablation import run_ablation
    from asp.steps.scheduling import schedule_spec

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--targets", default=",".join(TARGETS), help="comma-separated models ('' for none)")
    ap.add_argument("--predictions", choices=("auto", "oof", "tfidf"), default="auto", help="auto: OOF file if there")
    ap.add_argument("--oof", type=Path, default=OOF, help="benchmarks/predictor_real.py's out-of-fold predictions")
    ap.add_argument("--no-demo", action="store_true", help="skip the demo's held-out ablation")
    ap.add_argument("--params", type=Path, default=ROOT / "params.yaml")
    ap.add_argument("--iterations", type=int, default=None, help="annealing proposals (default: params')")
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0, help="first seed (and the TF-IDF folds' seed)")
    a = ap.parse_args(argv)

    params = load_params(a.params)
    spec = schedule_spec(params.schedule)
    if a.iterations is not None:
        spec = replace(spec, iterations=a.iterations)
    print(f"schedule: b {spec.b}, κ {spec.kappa}, k {spec.k}, {spec.iterations} iterations, {spec.method}\n")
    if not a.no_demo:
        table = demo(params, a.seeds, spec)
        if table:
            print(table + "\n", flush=True)
    for target in [t for t in a.targets.split(",") if t.strip()]:
        true, pred, label = real_inputs(a.data, target, a.predictions, a.oof, a.seed)
        res = run_ablation(true, pred, spec, seeds=range(a.seed, a.seed + a.seeds), cross_fit=FOLDS)
        extra = f"{true.size} prompts, words; predictions: {label} (τ {kendall_tau(pred, true):.3f})"
        print(markdown(target, res, extra) + "\n", flush=True)


if __name__ == "__main__":
    main()
