"""The Training Unit: a `Trainer` protocol, the `SimulatedTrainer`, and `TrainingUnit`, the actor wrapper.

A trainer consumes one `GlobalBatch` per `step` and returns a `StepResult` (new policy version, metrics, a
small JSON-able state for the runtime checkpoint, and optionally a `WeightUpdate` for the generation
actors). `SimulatedTrainer` (paper appendix F.6.3) sleeps a fixed step time, bumps the version, and
announces a snapshot whose reload the actors model as a fixed delay. The GRPO trainer (`asp.runtime.grpo`)
implements the same protocol; `make_trainer_factory("simulated" | "grpo", ...)` returns the picklable factory
that `TrainingUnit` calls inside its Ray actor.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from asp.runtime.messages import GlobalBatch, StepResult, WeightUpdate

log = logging.getLogger(__name__)


@runtime_checkable
class Trainer(Protocol):
    """What the Training Unit runs. `version` is the policy version (0 before any step)."""

    version: int

    def step(self, batch: GlobalBatch) -> StepResult:
        """Train on one global batch; return the new version, metrics, state and optional weight update."""
        ...

    def restore(self, state: Mapping[str, Any]) -> WeightUpdate | None:
        """Continue from the `StepResult.state` stored in a runtime checkpoint; return the snapshot the
        generation actors must load to match the restored weights (None: keep theirs)."""
        ...


class SimulatedTrainer:
    """Fixed-duration stand-in trainer.

    Args:
        step_time_s: seconds each step sleeps.
        refresh_delay_s: reload delay announced with every snapshot (paid by each actor, deferred).
        ledger_path: if set, one JSON line per step is appended there (step, prompt_ids, task_ids, versions,
            lengths, token and log-prob counts): the record of exactly what reached the trainer.
    """

    def __init__(self, step_time_s: float = 0.0, refresh_delay_s: float = 0.0, ledger_path: str | None = None):
        self.step_time_s, self.refresh_delay_s = step_time_s, refresh_delay_s
        self.ledger = Path(ledger_path) if ledger_path else None
        self.version = 0

    def step(self, batch: GlobalBatch) -> StepResult:
        start = time.perf_counter()
        if self.step_time_s > 0:
            time.sleep(self.step_time_s)
        self.version += 1
        if self.ledger is not None:
            line = {
                "step": self.version,
                "prompt_ids": list(batch.prompt_ids),
                "task_ids": batch.task_ids.tolist(),
                "versions": batch.versions.tolist(),
                "lengths": batch.lengths.tolist(),
                "tokens": int(batch.token_ids.size),
                "logprobs": int(batch.logprobs.size),
                "logprob_max": float(batch.logprobs.max()) if batch.logprobs.size else None,
            }
            with self.ledger.open("a") as fh:
                fh.write(json.dumps(line, default=str) + "\n")
        lengths = batch.lengths
        return StepResult(
            step=batch.step,
            version=self.version,
            duration_s=time.perf_counter() - start,
            metrics={
                "train/prompts": float(batch.num_prompts),
                "train/mean_response_length": float(lengths.mean()) if lengths.size else 0.0,
            },
            state={"version": self.version},
            weights=WeightUpdate(self.version, None, self.refresh_delay_s),
        )

    def restore(self, state: Mapping[str, Any]) -> WeightUpdate | None:
        self.version = int(state.get("version", 0))
        return WeightUpdate(self.version, None, self.refresh_delay_s) if self.version else None


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
        kind: ``"simulated"`` (fixed step time, `config.trainer_step_s` / `refresh_delay_s`) or ``"grpo"``.
        config: the `RuntimeConfig` (temperature, seed, checkpoint_interval, iterations are used).
        policy_path: local checkpoint directory of the policy (grpo).
        prompts: prompt id -> chat-templated text, the same mapping given to `run_async` (grpo).
        answers: prompt id -> reference answer (grpo).
        grpo: a `GRPOConfig` or its params mapping (``runtime.grpo``); None = defaults.
        reward: overrides ``grpo.reward``; ``auto`` is resolved with `dataset` (see `resolve_reward`).
        dataset: the ``prepare.dataset`` value (only used to resolve ``auto``).
        state_dir: directory for trainer checkpoints and file snapshots (None: no trainer checkpoints).
        total_steps: steps of the run when `config.iterations` is None (one pass), for LR decay.

    Raises:
        UserError: unknown kind, bad grpo params, missing policy / prompts / answers, unknown reward.
    """
    import functools

    from asp.errors import UserError

    if kind == "simulated":
        return functools.partial(SimulatedTrainer, config.trainer_step_s, config.refresh_delay_s)
    if kind != "grpo":
        raise UserError(f"runtime.trainer = {kind!r} is unknown; choose one of {', '.join(TRAINER_KINDS)}.")
    from asp.grpo_config import GRPOConfig
    from asp.rl.rewards import get_reward
    from asp.rollout.model_dir import check_model_dir
    from asp.runtime.grpo import GRPOSpec

    cfg = grpo if isinstance(grpo, GRPOConfig) else GRPOConfig.from_mapping(grpo)
    name = resolve_reward(reward or cfg.reward, dataset)
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
        raise UserError(f"{len(missing)} prompts have no reference answer (e.g. {missing[:3]}); the grpo reward "
                        "needs one per prompt: check prepare.answer_field.")  # fmt: skip
    steps = cfg.total_steps or config.iterations or total_steps
    if cfg.lr_schedule != "constant" and steps is None:
        raise UserError(f"runtime.grpo.lr_schedule = {cfg.lr_schedule!r} needs runtime.grpo.total_steps or "
                        "runtime.iterations.")  # fmt: skip
    if config.top_p < 1.0:
        log.warning("top_p = %g < 1: behaviour log-probs come from the truncated distribution; GRPO ratios use "
                    "the full softmax and are biased", config.top_p)  # fmt: skip
    return GRPOSpec(
        policy_path=str(policy_path), prompts=dict(prompts), answers={k: str(answers[k]) for k in prompts},
        config=cfg, reward=name, temperature=config.temperature, seed=config.seed,
        checkpoint_interval=config.checkpoint_interval, total_steps=steps,
        state_dir=str(state_dir) if state_dir is not None else None,
    )  # fmt: skip


class TrainingUnit:
    """Ray actor wrapper around a `Trainer` built from a picklable zero-argument factory."""

    def __init__(self, trainer_factory: Callable[[], Trainer]) -> None:
        self.error: str | None = None
        self.trainer: Any = None
        try:
            self.trainer = trainer_factory()
        except Exception as exc:
            self.error = f"{type(exc).__name__}: {exc}"

    def ready(self) -> str | None:
        """None when the trainer was built, else its error message."""
        return self.error

    def restore(self, state: Mapping[str, Any]) -> WeightUpdate | None:
        return self.trainer.restore(state)

    def step(self, batch: GlobalBatch) -> StepResult:
        return self.trainer.step(batch)
