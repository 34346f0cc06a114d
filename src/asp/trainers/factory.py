"""`make_trainer_factory`: the picklable trainer factory the runtime's `TrainingUnit` calls inside its Ray actor.

    from asp.trainers import make_trainer_factory
    factory = make_trainer_factory("grpo", config, policy_path="outputs/policy", prompts=..., answers=...)
    run_async(plan, prompts, engine_spec, config, trainer_factory=factory)

Settings that cannot work together (the simulated trainer with several ranks, CPU offload or nccl without CUDA,
an unknown reward) are refused by the params themselves (`asp.config.RuntimeParams`, so `asp params check` reports
them before a run); this module builds the trainer and checks only its inputs (the policy checkpoint, prompts and
answers, that a package.module:function reward imports), in the caller, before any actor starts.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from asp.errors import UserError
from asp.rl.rewards import get_reward
from asp.rollout.model_dir import check_model_dir
from asp.runtime.testhooks import trainer_ledger
from asp.runtime.trainer import Trainer
from asp.trainers.simulated import SimulatedTrainer

log = logging.getLogger(__name__)


TRAINER_KINDS = ("simulated", "grpo")


def resolve_reward(reward: str, dataset: str | None) -> str:
    """``auto`` -> ``demo`` for the built-in demo dataset (``builtin:demo...``), else ``math``; others unchanged."""
    if reward != "auto":
        return reward
    return "demo" if str(dataset or "").startswith("builtin:demo") else "math"


def make_trainer_factory(
    kind: str,
    config: Any,
    *,
    policy_path: str | Path | None = None,
    prompts: Mapping[Any, str] | None = None,
    answers: Mapping[Any, str] | None = None,
    grpo: Any = None,
    reward: str | None = None,
    dataset: str | None = None,
    state_dir: str | Path | None = None,
    total_steps: int | None = None,
) -> Callable[[], Trainer]:
    """The picklable trainer factory for `run_async(..., trainer_factory=...)`; checks inputs in the caller.

    Args:
        kind: ``"simulated"`` (fixed step time, `config.trainer.step_s` / `refresh_delay_s`) or ``"grpo"``.
        config: the `RuntimeConfig` (sampling.temperature / top_p, seed, checkpoint_interval, iterations are used).
        policy_path: local checkpoint directory of the policy (grpo).
        prompts: prompt id -> chat-templated text, the same mapping given to `run_async` (grpo).
        answers: prompt id -> reference answer (grpo).
        grpo: the ``runtime.grpo`` params (`asp.config.GRPOParams`); None = ``config.grpo``.
        reward: overrides ``grpo.reward``; ``auto`` is resolved with `dataset` (see `resolve_reward`).
        dataset: the ``prepare.dataset`` value (only used to resolve ``auto``).
        state_dir: directory for trainer checkpoints and file snapshots (None: no trainer checkpoints).
        total_steps: steps of the run when `config.iterations` is None (one pass), for LR decay.

    Raises:
        UserError: unknown kind, missing policy / prompts / answers, a reward that does not import, an LR decay
            without a length (no ``grpo.total_steps``, ``config.iterations`` or `total_steps`).
    """

    if kind == "simulated":
        return functools.partial(SimulatedTrainer, config.trainer.step_s, config.trainer.refresh_delay_s)
    if kind != "grpo":
        raise UserError(f"runtime.trainer.kind = {kind!r} is unknown; choose one of {', '.join(TRAINER_KINDS)}.")
    from asp.trainers.grpo import GRPOSpec

    grpo_params = grpo if grpo is not None else config.grpo
    name = resolve_reward(reward or grpo_params.reward, dataset)
    try:
        get_reward(name)
    except ValueError as exc:
        raise UserError(f"runtime.grpo.reward: {exc}") from None
    if policy_path is None:
        raise UserError("the grpo trainer needs the policy checkpoint directory (policy stage output).")
    check_model_dir(policy_path)
    if not prompts or answers is None:
        raise UserError("the grpo trainer needs the prompts and their reference answers (prepare stage output).")
    missing = [pid for pid in prompts if pid not in answers]
    if missing:
        raise UserError(
            f"{len(missing)} prompts have no reference answer (e.g. {missing[:3]}); the grpo reward needs one per "
            "prompt: check prepare.answer_field."
        )
    steps = grpo_params.total_steps or config.iterations or total_steps
    if grpo_params.lr_schedule != "constant" and steps is None:
        raise UserError(
            f"runtime.grpo.lr_schedule = {grpo_params.lr_schedule!r} needs runtime.grpo.total_steps or "
            "runtime.iterations."
        )
    if config.sampling.top_p < 1.0:
        log.warning(
            "top_p = %g < 1: behaviour log-probs come from the truncated distribution; GRPO ratios use the full "
            "softmax and are biased",
            config.sampling.top_p,
        )
    return GRPOSpec(
        policy_path=str(policy_path),
        prompts=dict(prompts),
        answers={k: str(answers[k]) for k in prompts},
        config=grpo_params,
        reward=name,
        temperature=config.sampling.temperature,
        seed=config.seed,
        checkpoint_interval=config.checkpoint_interval,
        total_steps=steps,
        state_dir=str(state_dir) if state_dir is not None else None,
        ledger_path=trainer_ledger(),
    )
