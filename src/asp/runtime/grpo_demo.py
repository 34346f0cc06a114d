"""GRPO demo on this machine: build + warm-start the tiny demo policy, then an asynchronous GRPO run over a C4
(ASP) schedule, and report the reward curve, the measured and estimated policy lag, T_* and the duty cycle.

The schedule uses the demo task's intended response lengths as the length predictions (a stand-in for the
predictor stage, so the run needs nothing else); everything else is the real runtime: HF generation actors
on Ray, the Training Queue with backpressure, the GRPO Training Unit, weights through the Ray object store
with deferred reload. Run::

    python -m asp.runtime.grpo_demo --work-dir /tmp/grpo_demo     # ~4-5 min on 2 CPU cores (1-2 min warm start)
    python -m asp.runtime.grpo_demo --warm-steps 40 --iterations 4 --prompts 64   # smoke size
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np


def build_policy(out: Path, *, warm_steps: int, seed: int, max_steps: int = 8) -> dict[str, Any]:
    """Build and warm-start the demo policy (asp.demo.policy defaults, problems of at most `max_steps` terms)
    into `out`; return the warm-start time and final loss."""
    from asp.demo.policy import DEFAULTS, build_model, warm_start
    from asp.demo.task import generate_problems
    from asp.demo.tokenizer import build_tokenizer

    tokenizer = build_tokenizer()
    model = build_model(tokenizer, **DEFAULTS["model"], seed=seed)
    records = generate_problems(2000, seed=seed + 100, max_steps=max_steps)
    ws = DEFAULTS["warm_start"]
    hist = warm_start(model, tokenizer, records, steps=warm_steps, batch_size=ws["batch_size"], lr=ws["lr"], seed=seed)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return {"warm_start_s": hist["seconds"], "warm_start_final_loss": hist["loss"][-1]}


def make_prompts(policy: Path, n: int, *, seed: int, max_steps: int) -> tuple[dict, dict, dict]:
    """(prompt id -> chat-templated prompt, -> answer, -> intended response length) for `n` new problems."""
    from asp.demo.task import generate_problems, intended_length
    from asp.rollout import load_tokenizer

    tok = load_tokenizer(policy)
    recs = generate_problems(n, seed=seed + 300, max_steps=max_steps)
    chat = {r["id"]: tok.apply_chat_template([{"role": "user", "content": r["problem"]}], tokenize=False,
                                             add_generation_prompt=True) for r in recs}  # fmt: skip
    return chat, {r["id"]: r["answer"] for r in recs}, {r["id"]: intended_length(r) + 1 for r in recs}


def held_out_reward(policy: Path, weights: Path | None, *, n: int, seed: int, max_steps: int) -> float:
    """Mean demo reward of the policy (optionally with trainer-checkpoint `weights`) on `n` held-out problems x 4."""
    import torch
    from safetensors.torch import load_model
    from transformers import AutoModelForCausalLM

    from asp.demo.policy import evaluate_policy
    from asp.demo.task import generate_problems
    from asp.rollout import load_tokenizer

    model = AutoModelForCausalLM.from_pretrained(str(policy), local_files_only=True, dtype=torch.float32).eval()
    if weights is not None:
        load_model(model, str(weights))
    records = generate_problems(n, seed=seed + 900, max_steps=max_steps)
    result = evaluate_policy(model, load_tokenizer(policy), records, n_samples=4, max_new_tokens=5 * max_steps + 16,
                             seed=seed, batch_size=64)  # fmt: skip
    return result["mean_reward"]


def run_demo(
    work_dir: str | Path,
    *,
    warm_steps: int = 600,
    iterations: int = 200,
    prompts: int = 3200,
    batch_prompts: int = 16,
    n_samples: int = 8,
    lr: float = 5e-4,
    aggregation: str = "sequence",
    max_steps: int = 4,
    actors: int = 2,
    max_policy_lag: int | None = 4,
    q_max_batches: int = 1,
    warmup: int = 10,
    held_out: int = 256,
    seed: int = 0,
) -> dict[str, Any]:
    """Build the policy (reused when `work_dir/policy` exists), run GRPO, return the summary + settings."""
    from asp.runtime import EngineSpec, RuntimeConfig, WorkPlan, grpo_summary, make_trainer_factory, run_async
    from asp.schedule import condition_schedule

    work = Path(work_dir)
    policy = work / "policy"
    info: dict[str, Any] = {}
    if not (policy / "config.json").exists():
        info = build_policy(policy, warm_steps=warm_steps, seed=seed)
    chat, answers, lengths = make_prompts(policy, prompts, seed=seed, max_steps=max_steps)
    ids = list(chat)
    sched = condition_schedule(np.array(ids, dtype=object), np.array([lengths[i] for i in ids], np.float64), "C4",
                               b=8, kappa=2, k=2, seed=seed, iterations=20_000)  # fmt: skip
    cfg = RuntimeConfig(
        iterations=iterations, generation_units=1, actors_per_unit=actors, actor_num_cpus=0.5,
        global_batch_prompts=batch_prompts, q_max=q_max_batches * batch_prompts, n_samples=n_samples,
        max_new_tokens=5 * max_steps + 16, temperature=1.0, seed=seed, checkpoint_interval=max(iterations, 1),
        max_policy_lag=max_policy_lag, stale_samples="drop", gu_queue_target=2,
    )  # fmt: skip
    grpo = {
        "lr": lr,
        "warmup_steps": warmup,
        "loss_aggregation": aggregation,
        "micro_batch_tokens": 4096,
        "num_threads": 1,
        "reward": "demo",
    }
    trainer = make_trainer_factory("grpo", cfg, policy_path=policy, prompts=chat, answers=answers, grpo=grpo,
                                   state_dir=work / "state")  # fmt: skip
    engine = EngineSpec("hf", str(policy), {"device": "cpu", "dtype": "float32", "num_threads": 1})
    shutil.rmtree(work / "state", ignore_errors=True)  # a fresh run: no old trainer checkpoints
    t0 = time.perf_counter()
    summary = run_async(WorkPlan.from_schedule(sched), chat, engine, cfg, trainer_factory=trainer, resume=False)
    out = {**info, **grpo_summary(summary.iterations), "run_wall_s": time.perf_counter() - t0}
    final = work / "state" / "trainer" / f"step-{summary.trainer_step:08d}" / "model.safetensors"
    for name, weights in (("held_out_reward_before", None), ("held_out_reward_after", final)):
        out[name] = held_out_reward(policy, weights, n=held_out, seed=seed, max_steps=max_steps)
    out["settings"] = {
        "warm_steps": warm_steps, "iterations": iterations, "batch_prompts": batch_prompts, "n_samples": n_samples,
        "lr": lr, "aggregation": aggregation, "max_steps": max_steps, "actors": actors,
        "max_policy_lag": max_policy_lag, "policy_version": summary.policy_version,
    }  # fmt: skip
    out["rewards"] = [r["train/reward_mean"] for r in summary.iterations if "train/reward_mean" in r]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work-dir", default="/tmp/asp_grpo_demo")
    ints = (("warm-steps", 600), ("iterations", 200), ("prompts", 3200), ("actors", 2), ("q-max-batches", 1))
    for name, default in ints:
        ap.add_argument(f"--{name}", type=int, default=default)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--check", action="store_true", help="exit 1 unless the held-out reward went up")
    args = ap.parse_args()
    result = run_demo(args.work_dir, warm_steps=args.warm_steps, iterations=args.iterations, prompts=args.prompts,
                      lr=args.lr, actors=args.actors, q_max_batches=args.q_max_batches)  # fmt: skip
    print(json.dumps(result, indent=1, default=float))
    if args.check and not result["held_out_reward_after"] > result["held_out_reward_before"]:
        raise SystemExit("GRPO did not raise the held-out reward")


if __name__ == "__main__":
    main()
