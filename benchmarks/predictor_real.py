"""Benchmark: the length predictor on real text and real answer lengths, k-fold cross-validated per target model.

Data: data/alpaca_eval_lengths.json (805 AlpacaEval instructions; for 14 real chat models the length of each
model's one answer, in whitespace words; Apache-2.0, data/LICENSE.alpaca_eval). For each target model the
prompts are cut into k folds (the same folds for every target and method); each fold is held out once and the
predictor is trained on the other k-1 with the project's own code path: `asp.pipeline.train_predictor.train`
(the stage's `build_predictor` + `fit` = `asp.steps.fit.fit_predictor`, its seeded validation split for early
stopping, `params.yaml`'s `predictor:` block) and scored like the evaluate stage (`predict_lengths`,
`ranking_metrics`, `cross_fit_calibration` inside the held-out fold for the calibrated MAE). No held-out length
of any model is used in training.

Baselines on the same folds: prompt length (characters), TF-IDF (word 1-2 grams) ridge regression on log(1 +
length) fitted on the training folds, the training folds' median (MAE only), and another model's lengths on the
held-out prompts (a ceiling: a sibling model's real answers), and the mean log length of all 13 other models'
real answers to the held-out prompts (a higher ceiling: what a predictor that read 13 real answers would know).

Run from the repo root (prints a markdown table, writes the out-of-fold predictions):

    .venv/bin/python benchmarks/predictor_real.py                        # 5 folds, the three targets
    .venv/bin/python benchmarks/predictor_real.py --folds 3 --targets Qwen1.5-7B-Chat --set predictor.epochs=2
    .venv/bin/python benchmarks/predictor_real.py --baselines-only       # the baselines alone, in seconds
    .venv/bin/python benchmarks/predictor_real.py --demo                 # the demo world (outputs/prompts, profile)

Out-of-fold predictions (for the schedule ablation on real lengths) go to benchmarks/results/predictor_real_oof.json
(`--oof`): per target, prompt index (row of the data file), fold, raw prediction, out-of-fold calibrated
prediction and realized length (words).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from asp.errors import exit_user_error

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "data" / "alpaca_eval_lengths.json"
OOF = ROOT / "benchmarks" / "results" / "predictor_real_oof.json"
OTHERS = "all other models (mean log length)"  # a ceiling: the held-out prompts' real answers by 13 other models
TARGETS = {"Qwen1.5-7B-Chat": "Qwen1.5-14B-Chat", "phi-2-sft": "phi-2-dpo", "tulu-2-dpo-7b": "tulu-2-dpo-13b"}


@dataclass
class Scores:
    """Per-fold scores of one method on one target."""

    tau: list[float] = field(default_factory=list)
    spearman: list[float] = field(default_factory=list)
    mae: list[float] = field(default_factory=list)
    mae_cal: list[float] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)

    def add(self, pred: np.ndarray, true: np.ndarray, raw_mae: bool, seconds: float | None = None) -> np.ndarray:
        """Score `pred` against `true` as the evaluate stage does; returns the out-of-fold calibrated values."""
        from asp.predictor.calibration import CALIBRATION_FOLDS, cross_fit_calibration
        from asp.predictor.metrics import ranking_metrics

        m = ranking_metrics(pred, true)
        self.tau.append(float(m["kendall_tau"]))
        self.spearman.append(float(m["spearman"]))
        self.mae.append(float(np.mean(np.abs(pred - true))) if raw_mae else float("nan"))
        cal = cross_fit_calibration(pred, true, min(CALIBRATION_FOLDS, len(true)))
        self.mae_cal.append(float(np.mean(np.abs(cal - true))))
        if seconds is not None:
            self.seconds.append(seconds)
        return cal


def load_rows(path: Path) -> tuple[list[str], list[dict[str, Any]], list[str]]:
    data = json.loads(path.read_text())
    rows = data["rows"]
    return [r["instruction"] for r in rows], rows, list(data["models"])


def lengths_of(rows: list[dict[str, Any]], model: str, unit: str) -> np.ndarray:
    return np.asarray([r[f"{unit}:{model}"] for r in rows], dtype=np.float64)


def fold_ids(n: int, folds: int, seed: int) -> np.ndarray:
    """Fold of each prompt: a seeded permutation cut into `folds` near-equal parts."""
    fold = np.empty(n, dtype=np.int64)
    fold[np.random.default_rng(seed).permutation(n)] = np.arange(n) % folds
    return fold


def tfidf_ridge(train_texts: list[str], train_y: np.ndarray, test_texts: list[str]) -> np.ndarray:
    """TF-IDF (word 1-2 grams, sublinear tf) + ridge on log(1 + length), alpha by generalized CV; lengths."""
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import RidgeCV

    vec = TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True, min_df=2)
    x = vec.fit_transform(train_texts)
    reg = RidgeCV(alphas=np.logspace(-2, 2, 9)).fit(x, np.log1p(train_y))
    return np.maximum(np.expm1(reg.predict(vec.transform(test_texts))), 0.0)


def load_params(path: Path, sets: list[str]) -> Any:
    """params.yaml (or another file) with `--set section.key=value` overrides (values parsed as YAML)."""
    from asp.config import deep_merge, load_params, parse_yaml, validate_params

    params = load_params(path)
    raw = params.model_dump()
    for item in sets:
        key, sep, value = item.partition("=")
        if not sep:
            exit_user_error(f"--set {item!r}: expected section.key=value")
        node: dict[str, Any] = {}
        cur = node
        parts = key.split(".")
        for p in parts[:-1]:
            cur = cur.setdefault(p, {})
        cur[parts[-1]] = parse_yaml(value)
        raw = deep_merge(raw, node)
    return validate_params(raw, "params", overrides=[s.partition("=")[0] for s in sets])


def train_fold(texts: list[str], y: np.ndarray, test_texts: list[str], params: Any, seed: int) -> tuple[Any, float]:
    """The train_predictor stage's training on (texts, y), then the evaluate stage's prediction on `test_texts`."""
    from asp.pipeline.train_predictor import make_split, train
    from asp.predictor.train import predict_lengths
    from asp.tracking import NullTracker

    t0 = time.perf_counter()
    split = make_split(texts, y, params.predictor, seed)
    model, tokenizer, result = train(split, params.predictor, seed, NullTracker())
    seconds = time.perf_counter() - t0
    pred = predict_lengths(model, tokenizer, test_texts, batch_size=params.predict.batch_size)
    return (pred, result), seconds


def run_target(target: str, sibling: str | None, data: tuple, fold: np.ndarray, a: argparse.Namespace, params: Any):
    """Every fold of one target: the predictor and the baselines; returns (scores per method, out-of-fold rows)."""
    texts, rows, _ = data
    y = lengths_of(rows, target, a.unit)
    sib = lengths_of(rows, sibling, a.unit) if sibling else None
    others = np.mean([np.log1p(lengths_of(rows, m, a.unit)) for m in data[2] if m != target], axis=0)
    plen = np.asarray([len(t) for t in texts], dtype=np.float64)
    names = (["predictor"] if not a.baselines_only else []) + ["TF-IDF ridge", "prompt length", "train median"]
    names += ([f"sibling: {sibling}"] if sib is not None else []) + [OTHERS]
    scores = {n: Scores() for n in names}
    oof: dict[str, list] = {"prompt_index": [], "fold": [], "prediction": [], "calibrated": [], "realized": []}
    epochs: list[int] = []
    weights: list[float] = []
    for f in range(a.folds if a.only_folds is None else min(a.only_folds, a.folds)):
        te, tr = np.flatnonzero(fold == f), np.flatnonzero(fold != f)
        tr_texts, te_texts = [texts[i] for i in tr], [texts[i] for i in te]
        if not a.baselines_only:
            (pred, result), sec = train_fold(tr_texts, y[tr], te_texts, params, a.seed + f)
            epochs.append(result.best_epoch)
            weights.append(result.lexical_weight)
            cal = scores["predictor"].add(pred, y[te], raw_mae=True, seconds=sec)
        scores["TF-IDF ridge"].add(tfidf_ridge(tr_texts, y[tr], te_texts), y[te], raw_mae=True)
        scores["prompt length"].add(plen[te], y[te], raw_mae=False)
        med = np.full(len(te), float(np.median(y[tr])))
        s = scores["train median"]
        s.mae.append(float(np.mean(np.abs(med - y[te]))))
        if sib is not None:
            scores[f"sibling: {sibling}"].add(sib[te], y[te], raw_mae=True)
        scores[OTHERS].add(np.expm1(others[te]), y[te], raw_mae=True)
        if a.baselines_only:
            continue
        for key, vals in (("prompt_index", te), ("fold", np.full(len(te), f)), ("prediction", pred)):
            oof[key].extend(vals.tolist())
        oof["calibrated"].extend(cal.tolist())
        oof["realized"].extend(y[te].tolist())
        print(
            f"  {target} fold {f}: tau {scores['predictor'].tau[-1]:.3f} (best epoch {result.best_epoch}, lexical "
            f"weight {result.lexical_weight}, "
            f"{sec:.0f} s; TF-IDF {scores['TF-IDF ridge'].tau[-1]:.3f})",
            file=sys.stderr,
            flush=True,
        )
    return scores, oof, {"best_epochs": epochs, "lexical_weights": weights}


def _target_job(target: str, data: tuple, fold: np.ndarray, a: argparse.Namespace, params: Any):
    """`run_target` in a worker process (``--jobs``) with ``--threads`` torch threads."""
    import torch

    torch.set_num_threads(a.threads)
    return run_target(target, TARGETS.get(target), data, fold, a, params)


def fmt(vals: list[float], spread: bool = False, digits: int = 3) -> str:
    v = [x for x in vals if np.isfinite(x)]
    if not v:
        return "—"
    s = f"{np.mean(v):.{digits}f}"
    return s + (f" ({min(v):.{digits}f}–{max(v):.{digits}f})" if spread and len(v) > 1 else "")


def table(results: dict[str, dict[str, Scores]]) -> str:
    lines = [
        "| target | method | Kendall τ mean (min–max over folds) | Spearman | MAE words "
        "| MAE calibrated (out of fold) | train s/fold |",
        "|---|---|---|---|---|---|---|",
    ]
    for target, by_method in results.items():
        for name, s in by_method.items():
            tau = fmt(s.tau, spread=True)
            if name == "predictor":
                tau = f"**{tau}**"
            sec = fmt(s.seconds, digits=0) if s.seconds else "—"
            lines.append(
                f"| {target} | {name} | {tau} | {fmt(s.spearman)} | {fmt(s.mae, digits=1)} | "
                f"{fmt(s.mae_cal, digits=1)} | {sec} |"
            )
    return "\n".join(lines)


def demo(a: argparse.Namespace, params: Any) -> None:
    """Train on the demo's profiled prompts (outputs/prompts, outputs/profile) and score its held-out prompts."""
    from asp.pipeline.train_predictor import load_split, train
    from asp.predictor.metrics import ranking_metrics
    from asp.predictor.train import predict_lengths
    from asp.steps.loaders import profiled_texts
    from asp.steps.paths import TrainPredictorPaths
    from asp.tracking import NullTracker

    paths = TrainPredictorPaths()
    paths = TrainPredictorPaths(prompts=ROOT / paths.prompts, profile=ROOT / paths.profile)
    seed = params.common.seed
    t0 = time.perf_counter()
    model, tokenizer, result = train(load_split(paths, params.predictor, seed), params.predictor, seed, NullTracker())
    sec = time.perf_counter() - t0
    texts, true = profiled_texts(paths.prompts, paths.profile, "heldout", params.predictor.text_field)
    pred = predict_lengths(model, tokenizer, texts, batch_size=params.predict.batch_size)
    m = ranking_metrics(pred, true)
    print(
        f"demo world: held-out Kendall tau {m['kendall_tau']:.3f}, Spearman {m['spearman']:.3f} on {len(true)} "
        f"prompts; best epoch {result.best_epoch} of {len(result.history)}, lexical weight {result.lexical_weight}, "
        f"train {sec:.0f} s ({a.threads} torch threads)"
    )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--params", type=Path, default=ROOT / "params.yaml")
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE", help="override a param")
    ap.add_argument("--targets", default=",".join(TARGETS), help="comma-separated target models")
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--only-folds", type=int, default=None, help="run only the first N of the k folds (exploring)")
    ap.add_argument("--seed", type=int, default=0, help="fold assignment and training seeds")
    ap.add_argument("--unit", choices=["words", "chars"], default="words")
    ap.add_argument("--jobs", type=int, default=1, help="train this many targets at once (one process each)")
    ap.add_argument("--threads", type=int, default=int(os.environ.get("ASP_BENCH_THREADS", "2")))
    ap.add_argument("--oof", default=str(OOF), help="out-of-fold predictions file ('' for none)")
    ap.add_argument("--baselines-only", action="store_true", help="score the baselines only (no training; seconds)")
    ap.add_argument("--demo", action="store_true", help="score the demo world instead (outputs/prompts, profile)")
    a = ap.parse_args(argv)
    import torch

    torch.set_num_threads(a.threads)
    params = load_params(a.params, a.set)
    if a.demo:
        demo(a, params)
        return
    data = load_rows(a.data)
    targets = [t.strip() for t in a.targets.split(",") if t.strip()]
    unknown = [t for t in targets if t not in data[2]]
    if unknown:
        exit_user_error(f"unknown target model(s) {unknown}; the data file has {data[2]}")
    fold = fold_ids(len(data[0]), a.folds, a.seed)
    results: dict[str, dict[str, Scores]] = {}
    oof_all: dict[str, Any] = {}
    if a.jobs > 1:  # one process per target, each with --threads torch threads
        from concurrent.futures import ProcessPoolExecutor
        from multiprocessing import get_context

        with ProcessPoolExecutor(min(a.jobs, len(targets)), mp_context=get_context("spawn")) as pool:
            futures = [pool.submit(_target_job, t, data, fold, a, params) for t in targets]
            outs = [f.result() for f in futures]
    else:
        outs = [run_target(t, TARGETS.get(t), data, fold, a, params) for t in targets]
    for target, (scores, oof, per_fold) in zip(targets, outs, strict=True):
        results[target] = scores
        oof_all[target] = {**oof, **per_fold}
    print(table(results))
    if a.baselines_only:
        return
    taus = [float(np.mean(r["predictor"].tau)) for r in results.values()]
    secs = [x for r in results.values() for x in r["predictor"].seconds]
    print(
        f"\npredictor: mean Kendall τ over {len(taus)} target(s) {np.mean(taus):.3f} "
        f"({', '.join(f'{t} {v:.3f}' for t, v in zip(results, taus, strict=True))}); training "
        f"{np.mean(secs):.0f} s per fold (mean, max {np.max(secs):.0f} s, {a.threads} torch threads x "
        f"{a.jobs} job(s)); "
        f"{a.folds}-fold CV, seed {a.seed}, unit {a.unit};\n"
        f"predictor params {json.dumps(params.predictor.model_dump())}"
    )
    if a.oof:
        from asp.io import write_json

        write_json(
            {
                "data": str(a.data.relative_to(ROOT)) if a.data.is_relative_to(ROOT) else str(a.data),
                "unit": a.unit,
                "folds": a.folds,
                "seed": a.seed,
                "predictor": params.predictor.model_dump(),
                "targets": oof_all,
            },
            Path(a.oof),
        )
        print(f"out-of-fold predictions: {a.oof}", file=sys.stderr)


if __name__ == "__main__":
    main()
