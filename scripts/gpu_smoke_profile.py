"""GPU smoke test for the generation engines: profile-style rollouts, then tokens/s, lengths, truncation.

Builds an engine from a LOCAL checkpoint (vLLM by default, or the Hugging Face engine for comparison on the
same GPU), samples `--n` responses per prompt in minibatches of `--batch-size` prompts with a `--max-tokens`
cap, exactly as the `profile` stage does, and prints per-minibatch timings and a summary (generated
tokens/s, mean/median/max response length, truncation rate, mean per-token log-prob).

Examples (on a CUDA machine with ``pip install 'asp[vllm]'``)::

    python scripts/gpu_smoke_profile.py --model /models/Qwen3-8B --prompts data/deepscaler_math_train.json \\
        --num-prompts 64 --batch-size 32 --n 8 --max-tokens 2048
    python scripts/gpu_smoke_profile.py --model /models/Qwen3-8B --engine hf --num-prompts 8 --max-tokens 512
    python scripts/gpu_smoke_profile.py --model runs/policy --engine hf --device cpu --max-tokens 64  # no GPU

Prompts: built-in math questions, or ``--prompts FILE`` (.txt: one per line; .json list / .jsonl of objects
with a "prompt" or "problem" field). With ``--chat-template auto`` (default) each prompt becomes the user
message of the tokenizer's chat template when it has one.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

BUILTIN_PROMPTS = [
    "What is 17 * 23? Think step by step and give the final answer in \\boxed{}.",
    "Find all real x such that x^2 - 5x + 6 = 0. Put the final answer in \\boxed{}.",
    "A train travels 120 km in 1.5 hours. What is its average speed in km/h? Answer in \\boxed{}.",
    "How many positive divisors does 360 have? Put the final answer in \\boxed{}.",
    "Compute the sum of the first 50 odd numbers. Put the final answer in \\boxed{}.",
    "What is the remainder when 2^100 is divided by 7? Put the final answer in \\boxed{}.",
    "If log_2(x) + log_2(x - 2) = 3, find x. Put the final answer in \\boxed{}.",
    "How many ways can 5 people sit in a row if two of them refuse to sit together? Answer in \\boxed{}.",
]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", required=True, help="local checkpoint directory (never downloaded)")
    p.add_argument("--engine", choices=["vllm", "hf"], default="vllm")
    p.add_argument("--prompts", type=Path, help="prompt file (.txt/.json/.jsonl); default: built-in prompts")
    p.add_argument("--num-prompts", type=int, default=None, help="use the first N prompts (repeat built-ins to N)")
    p.add_argument("--batch-size", type=int, default=16, help="prompts per minibatch (one generate call)")
    p.add_argument("--n", type=int, default=8, help="samples per prompt")
    p.add_argument("--max-tokens", type=int, default=1024, help="response token cap")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--chat-template", choices=["auto", "on", "off"], default="auto")
    p.add_argument("--warmup", type=int, default=1, help="untimed warm-up minibatches (of 1 prompt)")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--logprobs-mode", choices=["processed_logprobs", "raw_logprobs"], default="processed_logprobs")
    g = p.add_argument_group("vllm")
    g.add_argument("--tp", type=int, default=1, help="tensor_parallel_size")
    g.add_argument("--gpu-memory-utilization", type=float, default=0.85)
    g.add_argument("--max-model-len", type=int, default=None)
    g.add_argument("--enforce-eager", action="store_true")
    g = p.add_argument_group("hf")
    g.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    g.add_argument("--threads", type=int, default=None, help="CPU threads during generate (1 is best for tiny models)")
    p.add_argument("--json-out", type=Path, help="write the summary as JSON here")
    return p.parse_args(argv)


def read_prompts(path: Path | None, limit: int | None) -> list[str]:
    """Prompts from a file, or the built-ins repeated up to `limit`."""
    if path is None:
        k = limit or len(BUILTIN_PROMPTS)
        return [BUILTIN_PROMPTS[i % len(BUILTIN_PROMPTS)] for i in range(k)]
    text = path.read_text()
    if path.suffix == ".txt":
        prompts = [line for line in text.splitlines() if line.strip()]
    else:
        rows = (
            json.loads(text)
            if path.suffix == ".json"
            else [json.loads(line) for line in text.splitlines() if line.strip()]
        )
        prompts = [row.get("prompt") or row.get("problem") for row in rows]
        if any(not isinstance(x, str) for x in prompts):
            sys.exit(f"{path}: every row needs a string 'prompt' or 'problem' field")
    prompts = prompts[:limit] if limit else prompts
    if not prompts:
        sys.exit(f"{path}: no prompts found")
    return prompts


def template(prompts: list[str], tokenizer: Any, mode: str) -> list[str]:
    """Wrap each prompt as the user turn of the tokenizer's chat template (when asked / available)."""
    has_template = getattr(tokenizer, "chat_template", None) is not None
    if mode == "off" or (mode == "auto" and not has_template):
        return prompts
    if not has_template:
        sys.exit("--chat-template on, but the tokenizer has no chat template")
    return [
        tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
        for q in prompts
    ]


def build(args: argparse.Namespace) -> Any:
    from asp.rollout import make_engine

    if args.engine == "vllm":
        return make_engine(
            "vllm",
            args.model,
            tensor_parallel_size=args.tp,
            gpu_memory_utilization=args.gpu_memory_utilization,
            dtype=args.dtype,
            max_model_len=args.max_model_len,
            seed=args.seed,
            logprobs_mode=args.logprobs_mode,
            enforce_eager=args.enforce_eager,
        )
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    return make_engine(
        "hf", args.model, device=device, dtype=args.dtype, logprobs_mode=args.logprobs_mode, num_threads=args.threads
    )


def summarize(timings: list[Any], samples: list[Any], init_s: float) -> dict[str, Any]:
    lengths = [s.length for s in samples]
    wall = sum(t.wall_s for t in timings)
    tokens = sum(t.total_tokens for t in timings)
    lps = [x for s in samples for x in s.logprobs]
    return {
        "engine_init_s": round(init_s, 2),
        "minibatches": len(timings),
        "prompts": sum(t.num_prompts for t in timings),
        "samples": len(samples),
        "generated_tokens": tokens,
        "generate_wall_s": round(wall, 3),
        "tokens_per_s": round(tokens / wall, 1) if wall > 0 else 0.0,
        "mean_length": round(statistics.fmean(lengths), 1),
        "median_length": statistics.median(lengths),
        "max_length": max(lengths),
        "truncation_rate": round(sum(s.finish_reason == "length" for s in samples) / len(samples), 4),
        "mean_token_logprob": round(statistics.fmean(lps), 4) if lps else None,
    }


def run_minibatches(engine: Any, prompts: list[str], args: argparse.Namespace) -> tuple[list[Any], list[Any]]:
    """Warm up, then generate `prompts` in minibatches of `args.batch_size`; returns (timings, samples)."""
    from asp.rollout import SamplingParams, timed_generate

    params = SamplingParams(args.n, args.max_tokens, args.temperature, args.top_p, args.seed)
    for i in range(args.warmup):
        engine.generate(prompts[:1], params.with_seed(args.seed - 1 - i))
    timings, samples = [], []
    for b, start in enumerate(range(0, len(prompts), args.batch_size)):
        seed = args.seed + start * args.n  # vLLM: no two samples of the run share a seed
        mb = timed_generate(engine, prompts[start : start + args.batch_size], params.with_seed(seed))
        t = mb.timing
        timings.append(t)
        samples += [s for r in mb.results for s in r.samples]
        print(
            f"minibatch {b}: {t.num_prompts} prompts x {t.n}, {t.total_tokens} tokens (max {t.max_length}) "
            f"in {t.wall_s:.2f} s = {t.tokens_per_s:.0f} tok/s"
        )
    return timings, samples


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from asp.errors import UserError
    from asp.rollout import load_tokenizer

    try:
        t0 = time.perf_counter()
        engine = build(args)
        init_s = time.perf_counter() - t0
        prompts = template(
            read_prompts(args.prompts, args.num_prompts), load_tokenizer(args.model), args.chat_template
        )
        timings, samples = run_minibatches(engine, prompts, args)
    except (UserError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    summary = {"engine": args.engine, "model": str(args.model), **summarize(timings, samples, init_s)}
    print(json.dumps(summary, indent=2))
    if args.json_out:
        from asp.io import write_json

        write_json(summary, args.json_out)
    engine.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
