"""`RuntimeConfig`: every knob of the asynchronous runtime in one frozen, typed dataclass.

The `launch` stage builds it from the ``runtime:`` params (``RuntimeConfig(**params)``); `validate()` raises
`asp.errors.UserError` naming the field, its value and what to do. Defaults suit a CPU laptop run.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from asp.errors import UserError


@dataclass(frozen=True, slots=True)
class RuntimeConfig:
    """Runtime settings (counts are minibatches, prompts or trainer steps as named; times in seconds).

    Attributes:
        iterations: trainer steps to run; None = one pass over the schedule (the last batch may be short).
            More steps than one pass needs cycle through the schedule again (epochs).
        generation_units: number of Generation Units (GUs).
        actors_per_unit: generation actors per GU (one engine each).
        gu_queue_target: minibatches kept waiting in each GU's input queue (paper: 5-10), on top of one per
            decoding actor.
        q_max: Training Queue depth (prompts) above which no new minibatch starts (backpressure).
        q_resume: depth (prompts) at or below which generation resumes; None = max(q_max - global_batch,
            global_batch - 1). It must be >= global_batch - 1, or a paused queue holding fewer prompts than a
            batch would never resume nor train.
        global_batch_prompts: prompts per training step (all n samples of a prompt stay together).
        n_samples: responses per prompt.
        max_new_tokens, temperature, top_p: sampling settings passed to every engine.
        seed: base sampling seed; minibatch task t samples with a seed derived from (seed, t).
        trainer_step_s: simulated Training Unit step time.
        refresh_delay_s: simulated weight reload time paid by each actor before its next minibatch.
        checkpoint_interval: write the runtime checkpoint every this many trainer steps (and at the end).
        actor_num_cpus, actor_num_gpus: Ray resources per generation actor (vLLM: GPUs = tensor parallel size).
        trainer_num_cpus, trainer_num_gpus: Ray resources of the Training Unit actor.
        actor_max_restarts: Ray restarts of a dead generation actor before it is given up.
        max_attempts: sends of one minibatch before the run fails with its last error.
        ray_address: connect to this Ray cluster instead of starting a local one.
        ray_num_cpus, ray_num_gpus: resources of a local cluster started here (None: what Ray detects).
        poll_timeout_s: longest wait of the Control Unit loop before it checks its state again.
        stall_timeout_s: fail when nothing is generated or trained for this long.
        coalesce_below_s, max_chunk: a GU hands an actor up to `max_chunk` queued minibatches per call, about
            `coalesce_below_s` seconds' worth, only while its minibatches take less than that each (stand-in
            or tiny models); otherwise one per call. 0 disables coalescing.
        max_policy_lag: bound on the policy lag (trainer version at consumption - generating version, in
            steps) of every trained sample; None = unbounded. Queued minibatches beyond it are removed before
            each batch is cut and handled per `stale_samples`.
        stale_samples: ``drop`` (counted as dropped, never trained) or ``regenerate`` (the minibatch's
            untrained prompts are generated again with newer weights, first in line).
    """

    iterations: int | None = None
    generation_units: int = 1
    actors_per_unit: int = 2
    gu_queue_target: int = 6
    q_max: int = 64
    q_resume: int | None = None
    global_batch_prompts: int = 16
    n_samples: int = 4
    max_new_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int = 0
    trainer_step_s: float = 0.0
    refresh_delay_s: float = 0.0
    checkpoint_interval: int = 10
    actor_num_cpus: float = 1.0
    actor_num_gpus: float = 0.0
    trainer_num_cpus: float = 0.0
    trainer_num_gpus: float = 0.0
    actor_max_restarts: int = 2
    max_attempts: int = 3
    ray_address: str | None = None
    ray_num_cpus: int | None = None
    ray_num_gpus: int | None = None
    poll_timeout_s: float = 1.0
    stall_timeout_s: float = 600.0
    coalesce_below_s: float = 0.05
    max_chunk: int = 16
    max_policy_lag: int | None = None
    stale_samples: str = "drop"

    @property
    def total_actors(self) -> int:
        return self.generation_units * self.actors_per_unit

    @property
    def resume_depth(self) -> int:
        """Queue depth (prompts) at or below which a paused sender resumes."""
        if self.q_resume is not None:
            return self.q_resume
        return max(self.q_max - self.global_batch_prompts, self.global_batch_prompts - 1)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def validate(self) -> RuntimeConfig:
        """Check ranges; return self.

        Raises:
            UserError: naming the ``runtime.<field>`` param, its value and the allowed range.
        """
        positive = ("generation_units", "actors_per_unit", "global_batch_prompts", "n_samples", "max_new_tokens")
        for name in positive:
            _check(self, name, getattr(self, name) >= 1, ">= 1")
        for name in ("gu_queue_target", "seed", "actor_max_restarts"):
            _check(self, name, getattr(self, name) >= 0, ">= 0")
        _check(self, "max_attempts", self.max_attempts >= 1, ">= 1")
        _check(self, "checkpoint_interval", self.checkpoint_interval >= 1, ">= 1")
        _check(self, "iterations", self.iterations is None or self.iterations >= 1, "None or >= 1")
        for name in ("trainer_step_s", "refresh_delay_s", "actor_num_cpus", "actor_num_gpus", "trainer_num_cpus"):
            _check(self, name, getattr(self, name) >= 0, ">= 0")
        _check(self, "trainer_num_gpus", self.trainer_num_gpus >= 0, ">= 0")
        _check(self, "temperature", self.temperature >= 0, ">= 0 (0 = greedy)")
        _check(self, "top_p", 0 < self.top_p <= 1, "in (0, 1]")
        _check(self, "poll_timeout_s", self.poll_timeout_s > 0, "> 0")
        _check(self, "stall_timeout_s", self.stall_timeout_s > 0, "> 0")
        _check(self, "coalesce_below_s", self.coalesce_below_s >= 0, ">= 0")
        _check(self, "max_chunk", self.max_chunk >= 1, ">= 1")
        _check(self, "max_policy_lag", self.max_policy_lag is None or self.max_policy_lag >= 0, "None or >= 0")
        _check(self, "stale_samples", self.stale_samples in ("drop", "regenerate"), "'drop' or 'regenerate'")
        if self.q_max < self.global_batch_prompts:
            raise UserError(
                f"runtime.q_max = {self.q_max} prompts is smaller than one global batch "
                f"(runtime.global_batch_prompts = {self.global_batch_prompts}): generation would pause before a "
                "training batch could form. Set q_max to at least global_batch_prompts (typically 2-4 batches)."
            )
        low = self.global_batch_prompts - 1
        if not low <= self.resume_depth <= self.q_max:
            raise UserError(
                f"runtime.q_resume = {self.resume_depth} must lie in [global_batch_prompts - 1 = {low}, q_max = "
                f"{self.q_max}]: below it, a paused queue with fewer prompts than one batch would never resume "
                "(deadlock). Leave q_resume unset for the default."
            )
        return self

    @classmethod
    def from_mapping(cls, params: dict[str, Any]) -> RuntimeConfig:
        """Build from a params mapping, rejecting unknown keys with a `UserError`."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(params) - known)
        if unknown:
            raise UserError(f"unknown runtime param(s) {unknown}; known: {sorted(known)}")
        return cls(**params).validate()


def _check(cfg: RuntimeConfig, name: str, ok: bool, allowed: str) -> None:
    if not ok:
        raise UserError(f"runtime.{name} = {getattr(cfg, name)!r} is out of range; it must be {allowed}.")
