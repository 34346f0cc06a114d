"""Helpers shared by the runtime tests: tiny plans, a fast config, the trainer ledger, hand-made outputs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from asp.runtime import MinibatchOutput, RuntimeConfig, WorkPlan


def make_plan(n_minibatches: int, size: int, k: int = 2) -> tuple[WorkPlan, dict[int, str]]:
    """Minibatches of `size` consecutive int prompt ids, groups of `k`; prompt text "w<i> ...".

    Prompt i has i % 5 + 1 words, so the stand-in engine's lengths differ between prompts.
    """
    total = n_minibatches * size
    prompts = {i: " ".join(f"w{(i + j) % 40}" for j in range(i % 5 + 1)) + f" #{i}" for i in range(total)}
    mbs = [list(range(s, s + size)) for s in range(0, total, size)]
    return WorkPlan.from_lists(mbs, [p // k for p in range(n_minibatches)]), prompts


def fast_config(**overrides) -> RuntimeConfig:
    """A small config for tests: 1 GU x 2 actors, tiny fractional CPUs, short polls, one pass over the plan,
    an instant simulated trainer and no lag bound (the demo defaults of `RuntimeParams` otherwise)."""
    base = dict(
        iterations=None,
        trainer_step_s=0.0,
        refresh_delay_s=0.0,
        max_policy_lag=None,
        generation_units=1,
        actors_per_unit=2,
        gu_queue_target=4,
        global_batch_prompts=8,
        q_max=32,
        n_samples=2,
        max_new_tokens=16,
        actor_num_cpus=0.25,
        poll_timeout_s=0.2,
        stall_timeout_s=60.0,
    )
    base.update(overrides)
    return RuntimeConfig(**base)


def read_ledger(path: Path) -> list[dict]:
    """The SimulatedTrainer's ledger lines."""
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def output(task_id: int, prompt_ids: list, lengths: list[int], n: int = 2, version: int = 0) -> MinibatchOutput:
    """An output whose sample s has tokens [100*task + s] * length and log-probs -(s + 1)."""
    lengths_arr = np.asarray(lengths, np.int32)
    tokens = np.concatenate([np.full(L, 100 * task_id + s, np.int32) for s, L in enumerate(lengths)])
    logprobs = np.concatenate([np.full(L, -(s + 1.0), np.float32) for s, L in enumerate(lengths)])
    return MinibatchOutput(
        task_id=task_id, minibatch_id=10 + task_id, attempt=0, gu=0, actor=task_id % 2, policy_version=version,
        prompt_ids=prompt_ids, n=n, lengths=lengths_arr, stopped=np.ones(len(lengths), bool), token_ids=tokens,
        logprobs=logprobs, prompt_tokens=np.full(len(prompt_ids), 3, np.int32),
        texts=[f"t{task_id}.{s}" for s in range(len(lengths))], gen_start=0.0, gen_end=1.0,
    )  # fmt: skip
