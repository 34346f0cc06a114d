"""Benchmark: the two re-profiles of the drift loop on real answer lengths, side by side (issue 35 §2).

`drift.action: reprofile` profiles fresh prompts with the current policy (generation) and fine-tunes the predictor
on them; `drift.action: refit_from_run` fine-tunes it on the realized lengths the run already has (no generation).
Which is better after a real policy shift, and at what cost?

Data: data/alpaca_eval_lengths.json (805 AlpacaEval instructions, each real chat model's one answer per prompt, in
whitespace words x 1.3 tokens). A chain of two real policies: the predictor's (A) and its sibling after
preference tuning or scaling (B): phi-2-sft -> phi-2-dpo, Qwen1.5-7B-Chat -> Qwen1.5-14B-Chat, tulu-2-dpo-7b ->
tulu-2-dpo-13b. A model's answer length is taken as the prompt's mean under that policy; n = 8 samples per visit
are drawn around it with mean-preserving lognormal noise whose sigma makes one sample rank another at Kendall tau
0.70 (as benchmarks/history_real.py does; the data has one answer per model).

The run, per chain (one seeded split of the 805 prompts):

* profile: 200 prompts, 8 samples each under A; v1 = the train_predictor stage's own training on them
  (`asp.pipeline.train_predictor.train`, params.yaml's `predictor:` block: MiniLM);
* trained so far: 300 prompts at 16 per step (versions 0-18); the first 120 under A, then the policy is B (the
  drift; the watch fired at the end): the checkpoint's `LengthHistory` holds one visit of 8 samples each;
* remaining: 305 prompts. `reprofile` profiles 192 of them under B (8 samples each, `drift.reprofile_prompts`);
  the other 113 are the comparison set: every variant is scored there against B's real lengths, the lengths the
  re-plan schedules (out of sample for all: no variant saw them).

Variants, each warm-started from v1 (the project's code: `asp.adaptation.reprofile.split_roles` / `fine_tune`,
`asp.adaptation.refit.history_targets` / `choose_recent`; `drift.reprofile_eval_fraction` 0.33 held out,
`drift.reprofile_epochs` 2): `v1` (the stale predictor; what `warn` and `recalibrate` keep ranking with: a
monotone map does not change tau), `reprofile` (192 generated), `refit 192` and `refit 300`
(`drift.refit_prompts`: the 192 most recent trained prompts = all under B, or the whole history including the 120
stale visits under A; 512, the default, takes all 300 here). Columns: tau on the comparison set, the gate's own
held-out tau (what `evaluate.min_tau` sees), fine-tuning seconds, and tokens generated (192 x 8 x the mean
sampled length; the refits generate none).

    .venv/bin/python benchmarks/refit_real.py                       # 3 chains, ~10-15 min on 2 busy cores
    .venv/bin/python benchmarks/refit_real.py --chains qwen --threads 2

Results: benchmarks/results/refit_real.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from history_real import draw, sample_sigma  # noqa: E402  (the same sample model)

DATA = ROOT / "data" / "alpaca_eval_lengths.json"
OUT = ROOT / "benchmarks" / "results" / "refit_real.json"
CHAINS = {
    "phi": ("phi-2-sft", "phi-2-dpo"),
    "qwen": ("Qwen1.5-7B-Chat", "Qwen1.5-14B-Chat"),
    "tulu": ("tulu-2-dpo-7b", "tulu-2-dpo-13b"),
}
TOKENS_PER_WORD, N_SAMPLES, SAMPLE_TAU = 1.3, 8, 0.70
PROFILE, TRAINED, BEFORE_DRIFT, PER_STEP = 200, 300, 120, 16


def run_chain(chain: str, params: Any, seed: int) -> dict[str, Any]:
    from asp.adaptation.refit import choose_recent, history_targets
    from asp.adaptation.reprofile import fine_tune, split_roles
    from asp.pipeline.train_predictor import make_split, train
    from asp.predictor.metrics import kendall_tau
    from asp.predictor.train import predict_lengths
    from asp.schedule.history import LengthHistory
    from asp.steps.checkpoint import save_predictor
    from asp.steps.loaders import load_trained_predictor
    from asp.tracking import NullTracker

    rows = json.loads(DATA.read_text())["rows"]
    texts = [r["instruction"] for r in rows]
    a, b = (np.array([r[f"words:{m}"] for r in rows], float) * TOKENS_PER_WORD for m in CHAINS[chain])
    a, b = np.maximum(a, 1.0), np.maximum(b, 1.0)
    rng = np.random.default_rng([seed, 35])
    order = rng.permutation(len(rows))
    prof, done, rest = order[:PROFILE], order[PROFILE : PROFILE + TRAINED], order[PROFILE + TRAINED :]
    sigma = sample_sigma(b, SAMPLE_TAU, seed)
    bs, drift = params.predict.batch_size, params.drift

    def mean_of_samples(idx: np.ndarray, means: np.ndarray) -> np.ndarray:
        return draw(means[idx], N_SAMPLES, sigma, rng).mean(axis=1)

    t0 = time.perf_counter()
    split = make_split([texts[i] for i in prof], mean_of_samples(prof, a), params.predictor, seed)
    model, tokenizer, _ = train(split, params.predictor, seed, NullTracker())
    v1_seconds = time.perf_counter() - t0
    work = Path(tempfile.mkdtemp(prefix="refit_real_"))
    save_predictor(model, tokenizer, work / "v1", {"text_field": "prompt"}, backbone_ref=params.predictor.backbone)

    history = LengthHistory()  # the run's checkpoint: one visit of 8 samples per trained prompt
    for i, p in enumerate(done):
        policy = a if i < BEFORE_DRIFT else b
        history.add([int(p)], draw(policy[[p]], N_SAMPLES, sigma, rng), [i // PER_STEP])
    version = TRAINED // PER_STEP
    profiled = rng.choice(rest, drift.reprofile_prompts, replace=False)
    compare = np.setdiff1d(rest, profiled)

    def variant(ids: np.ndarray, targets: np.ndarray, vseed: int) -> dict[str, Any]:
        m, tok, _ = load_trained_predictor(work / "v1", params.predictor)
        roles = split_roles(len(ids), drift.reprofile_eval_fraction, params.predictor.val_fraction, vseed)
        vtexts = [texts[i] for i in ids]
        start = time.perf_counter()
        fine_tune(m, tok, vtexts, targets, roles, params, vseed)
        seconds = time.perf_counter() - start
        held = np.flatnonzero(roles == "eval")
        gate = kendall_tau(predict_lengths(m, tok, [vtexts[i] for i in held], batch_size=bs), targets[held])
        pred = predict_lengths(m, tok, [texts[i] for i in compare], batch_size=bs)
        return {"tau": kendall_tau(pred, b[compare]), "gate_tau": gate, "train_s": seconds, "prompts": len(ids)}

    v1_pred = predict_lengths(model, tokenizer, [texts[i] for i in compare], batch_size=bs)
    out: dict[str, Any] = {
        "chain": chain,
        "models": list(CHAINS[chain]),
        "compare_prompts": len(compare),
        "v1": {"tau": kendall_tau(v1_pred, b[compare]), "train_s": v1_seconds, "tokens": 0},
        "sigma": sigma,
    }
    sampled = draw(b[profiled], N_SAMPLES, sigma, rng)
    out["reprofile"] = {
        **variant(profiled, sampled.mean(axis=1), seed + 1),
        "tokens": int(sampled.sum()),
    }
    targets = history_targets(history, version, params.runtime.history.drift_per_version)
    for limit in (drift.reprofile_prompts, TRAINED):
        chosen = choose_recent(targets, limit, seed + 2)
        ids = chosen["prompt_id"].to_numpy(dtype=np.int64)
        stale = int(np.isin(ids, done[:BEFORE_DRIFT]).sum())
        out[f"refit {limit}"] = {
            **variant(ids, chosen["mean_length"].to_numpy(np.float64), seed + 1),
            "tokens": 0,
            "stale_prompts": stale,
        }
    return out


def table(results: list[dict[str, Any]]) -> str:
    lines = [
        "| chain | variant | prompts | tau on the 113 remaining (vs B) | gate tau (own held-out) | fine-tune s | "
        "tokens generated |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        for name in ("v1", "reprofile", *[k for k in r if k.startswith("refit ")]):
            v = r[name]
            gate = f"{v['gate_tau']:.3f}" if "gate_tau" in v else "—"
            prompts = str(v.get("prompts", PROFILE))
            if "stale_prompts" in v:
                prompts += f" ({v['stale_prompts']} stale)"
            label = "v1 (stale; warn / recalibrate)" if name == "v1" else name
            lines.append(
                f"| {r['chain']} | {label} | {prompts} | {v['tau']:.3f} | {gate} | {v['train_s']:.0f} | "
                f"{v['tokens']:,} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--chains", nargs="+", default=list(CHAINS), choices=list(CHAINS))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)

    import torch

    from asp.config import load_params
    from asp.env import set_offline_defaults

    set_offline_defaults()
    torch.set_num_threads(args.threads)
    params = load_params(ROOT / "params.yaml")
    results = []
    for chain in args.chains:
        start = time.perf_counter()
        results.append(run_chain(chain, params, args.seed))
        print(f"[refit_real] {chain}: {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
    print(table(results))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"seed": args.seed, "results": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
