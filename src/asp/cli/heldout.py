"""`asp heldout-reward`: mean demo reward of the policy, optionally with a trainer checkpoint's weights, on new
problems of the built-in task that are not among the pipeline's prompts (so never trained on by the GRPO run).

    asp heldout-reward                                                          # the policy stage's output
    asp heldout-reward --weights outputs/launch_state/C4/trainer/step-00000200/model.safetensors

Both lines decode the same problems with the same seed, so their difference is the GRPO run's held-out gain.
The launch stage measures the same numbers itself (``grpo/heldout_reward_before`` / ``_after`` in
metrics/launch.json, `asp.trainers.heldout`); with the defaults (the params' defaults of ``common.seed``,
``runtime.sampling.max_new_tokens`` and ``runtime.heldout_problems``, and the launch's samples per problem and
temperature), this command repeats that measurement.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from asp.errors import UserError


def held_out_reward(
    policy_dir: Path,
    weights: Path | None,
    *,
    problems: int,
    samples: int,
    max_new_tokens: int,
    seed: int,
    prompts: Path | None = None,
) -> tuple[float, int]:
    """Mean reward of `samples` responses to each of `problems` new demo problems (seed-derived) that are not
    among the `prompts` file's problems; returns it and how many candidate problems were skipped for that."""
    import pandas as pd

    from asp.config import TEMPERATURE
    from asp.steps.loaders import policy_model_path
    from asp.trainers.heldout import heldout_problems, heldout_rewards

    exclude: set[str] = set()
    if prompts is not None and prompts.is_file():
        exclude = set(pd.read_parquet(prompts, columns=["problem"])["problem"])
    records, skipped = heldout_problems(problems, seed=seed, exclude=exclude)
    try:
        result = heldout_rewards(
            policy_model_path(policy_dir),
            weights,
            records,
            samples=samples,
            max_new_tokens=max_new_tokens,
            seed=seed,
            temperature=TEMPERATURE,  # the launch's default sampling, on the CPU as the launch's demo trainer
            device="cpu",
        )
    except FileNotFoundError:
        raise UserError(f"{weights}: no such weights file; give a trainer checkpoint's model.safetensors.") from None
    return result.mean, skipped


def heldout_reward(
    weights: Annotated[Path | None, typer.Option(help="Trainer checkpoint weights (model.safetensors).")] = None,
    policy: Annotated[Path, typer.Option(help="The policy stage's output directory.")] = Path("outputs/policy"),
    prompts: Annotated[
        Path, typer.Option(help="Prompts to leave out (the prepare stage's train.parquet; skipped if absent).")
    ] = Path("outputs/prompts/train.parquet"),
    problems: Annotated[
        int | None, typer.Option(min=1, help="New demo problems (default: runtime.heldout_problems' default).")
    ] = None,
    samples_per_problem: Annotated[
        int | None, typer.Option("--samples", min=1, help="Responses per problem (default: the launch's).")
    ] = None,
    max_new_tokens: Annotated[
        int | None, typer.Option(min=1, help="Response cap (default: runtime.sampling.max_new_tokens' default).")
    ] = None,
    seed: Annotated[int | None, typer.Option(min=0, help="Seed (default: common.seed's default).")] = None,
) -> None:
    """Mean demo reward on new problems (the policy, or the policy with trained weights)."""
    from asp.config import MAX_NEW_TOKENS, SEED, RuntimeParams
    from asp.trainers.heldout import HELDOUT_SAMPLES

    if problems is None:
        problems = int(RuntimeParams.model_fields["heldout_problems"].default)
    if samples_per_problem is None:
        samples_per_problem = HELDOUT_SAMPLES
    reward, skipped = held_out_reward(
        policy,
        weights,
        problems=problems,
        samples=samples_per_problem,
        max_new_tokens=MAX_NEW_TOKENS if max_new_tokens is None else max_new_tokens,
        seed=SEED if seed is None else seed,
        prompts=prompts,
    )
    left_out = (
        f"{skipped} drawn problems skipped as prompts of {prompts}" if prompts.is_file() else f"{prompts} absent"
    )
    typer.echo(f"held-out reward {reward:.3f} ({problems} problems x {samples_per_problem} samples; {left_out})")
