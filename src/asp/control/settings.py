"""`ControlSettings`: what the Control Unit's decisions depend on, as a plain frozen dataclass.

The runtime builds it from its `RuntimeConfig` (`RuntimeConfig.control_settings()`), the simulator's callers from
the params at the pipeline / CLI edge, so `asp.control` and `asp.sim` never read `asp.config`. The fields mean what
the ``runtime:`` params of the same name mean, flat here: ``runtime.sampling.n_samples`` is `n_samples`,
``runtime.queue.q_max`` `q_max`, ``runtime.ray.generation_units`` `generation_units`, ``runtime.control.max_attempts``
`max_attempts` (docs in `asp.config.RuntimeParams` and its sections); there are no defaults here, the config owns
them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:  # a type only: importing asp.control.history (the scheduler, scipy) would slow every `asp` command
    from asp.control.history import HistorySettings


def default_resume_depth(q_max: int, global_batch_prompts: int) -> int:
    """Depth (prompts) at or below which a paused sender resumes when ``q_resume`` is unset:
    ``max(q_max - batch, batch - 1)``. Example: q_max 64, batch 16 -> 48; q_max 16, batch 16 -> 15."""
    return max(q_max - global_batch_prompts, global_batch_prompts - 1)


def resume_depth(q_resume: int | None, q_max: int, global_batch_prompts: int) -> int:
    """Queue depth (prompts) at or below which a paused sender resumes: ``q_resume``, or the default above."""
    return q_resume if q_resume is not None else default_resume_depth(q_max, global_batch_prompts)


@dataclass(frozen=True, slots=True)
class PartialSettings:
    """Partial rollouts (``runtime.partial``; `asp.control.partial`).

    Attributes:
        enabled: generate at most `token_budget` tokens per response per engine call.
        token_budget: tokens per response per engine call.
        continuation_order: continuation rows handed out in arrival order ("fifo") or longest expected remainder first
            ("online": the online length correction).
        max_rows: most rows of one continuation item (None: the rows of the plan's largest minibatch).
        wait_for_full: pooled rows wait until `max_rows` of them can go in one call (the tails of several minibatches
            decoded together), unless no new minibatch is left to issue; False: sent as soon as a GU has room.
        oldest_first: under a lag bound, rows of the held task with the oldest segment are continued first (before
            the order above), so long responses finish before they age out.
    """

    enabled: bool
    token_budget: int
    continuation_order: Literal["fifo", "online"]
    max_rows: int | None
    wait_for_full: bool
    oldest_first: bool

    @property
    def budget(self) -> int | None:
        """The budget work items carry (None when off)."""
        return self.token_budget if self.enabled else None


@dataclass(frozen=True, slots=True)
class ControlSettings:
    """The Control Unit's settings (see the module docstring).

    Attributes:
        mode: "async" (ASP) or "sync" (rounds of one global batch, lag 0).
        generation_units, actors_per_unit: the layout.
        gu_queue_target: minibatches waiting per GU on top of one per live actor (async).
        global_batch_prompts, n_samples: prompts per training step and responses per prompt.
        q_max, q_resume: backpressure thresholds in prompts (q_resume None: `default_resume_depth`).
        max_policy_lag, stale_samples: the lag bound (None: unbounded) and what happens beyond it.
        iterations: trainer steps (None: one pass over the schedule).
        max_attempts: sends of one minibatch before the run fails.
        checkpoint_interval: a stop takes effect at a multiple of it when the driver checkpoints.
        stall_timeout_s: the run fails when nothing is generated or trained this long.
        poll_timeout_s: longest wait of the driver's loop (the simulator models it too).
        seed: base sampling seed of the Database's tasks.
        partial: partial rollouts (`PartialSettings`).
        max_new_tokens: the per-response token cap (partial rollouts continue a response up to it).
        history: re-schedule each new pass on history-aware loads (``runtime.history``; None: off).
    """

    mode: Literal["async", "sync"]
    generation_units: int
    actors_per_unit: int
    gu_queue_target: int
    global_batch_prompts: int
    n_samples: int
    q_max: int
    q_resume: int | None
    max_policy_lag: int | None
    stale_samples: Literal["drop", "regenerate"]
    iterations: int | None
    max_attempts: int
    checkpoint_interval: int
    stall_timeout_s: float
    poll_timeout_s: float
    seed: int
    partial: PartialSettings
    max_new_tokens: int
    history: HistorySettings | None

    def __post_init__(self) -> None:
        if self.mode not in ("async", "sync"):
            raise ValueError(f"mode must be 'async' or 'sync', got {self.mode!r}")
        if self.partial.enabled and self.mode != "async":
            raise ValueError("partial rollouts (runtime.partial.enabled) need runtime.mode: async")

    @property
    def sync(self) -> bool:
        return self.mode == "sync"

    @property
    def total_actors(self) -> int:
        return self.generation_units * self.actors_per_unit

    @property
    def resume_depth(self) -> int:
        """Queue depth (prompts) at or below which a paused sender resumes."""
        return resume_depth(self.q_resume, self.q_max, self.global_batch_prompts)
