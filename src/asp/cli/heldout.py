"""`asp heldout-reward`: mean demo reward of the policy, optionally with a trainer checkpoint's weights, on new
problems of the built-in task (never seen by the warm start, the profile or the GRPO run).

    asp heldout-reward                                                          # the policy stage's output
    asp heldout-reward --weights outputs/launch_state/C4/trainer/step-00000200/model.safetensors

Both lines decode the same problems with the same seed, so their difference is the GRPO run's held-out gain
(the README's "held-out reward before -> after").
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from asp.errors import UserError


def held_out_reward(
    policy_dir: Path, weights: Path | None, *, problems: int, samples: int, max_new_tokens: int, seed: int
) -> float:
    """Mean reward of `samples` responses to each of `problems` fresh demo problems (seed-derived ids)."""
    import torch
    from safetensors.torch import load_model
    from transformers import AutoModelForCausalLM

    from asp.demo.policy import evaluate_policy
    from asp.demo.task import generate_problems
    from asp.pipeline.loaders import policy_model_path
    from asp.rollout import load_tokenizer

    path = policy_model_path(policy_dir)
    model = AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True, dtype=torch.float32).eval()
    if weights is not None:
        if not weights.is_file():
            raise UserError(f"{weights}: no such weights file; give a trainer checkpoint's model.safetensors.")
        load_model(model, str(weights))
    records = generate_problems(problems, seed=seed + 900, id_prefix="heldout")
    result = evaluate_policy(
        model,
        load_tokenizer(path),
        records,
        n_samples=samples,
        max_new_tokens=max_new_tokens,
        seed=seed,
        batch_size=64,
    )
    return float(result["mean_reward"])


def heldout_reward(
    weights: Annotated[Path | None, typer.Option(help="Trainer checkpoint weights (model.safetensors).")] = None,
    policy: Annotated[Path, typer.Option(help="The policy stage's output directory.")] = Path("outputs/policy"),
    problems: Annotated[int, typer.Option(min=1, help="New demo problems.")] = 256,
    samples: Annotated[int, typer.Option(min=1, help="Responses per problem.")] = 4,
    max_new_tokens: Annotated[int, typer.Option(min=1, help="Response cap (runtime.max_new_tokens).")] = 160,
    seed: Annotated[int, typer.Option(min=0)] = 0,
) -> None:
    """Mean demo reward on new problems (the policy, or the policy with trained weights)."""
    reward = held_out_reward(
        policy, weights, problems=problems, samples=samples, max_new_tokens=max_new_tokens, seed=seed
    )
    typer.echo(f"held-out reward {reward:.3f} ({problems} problems x {samples} samples)")
