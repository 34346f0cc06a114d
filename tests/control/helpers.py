"""Helpers of the control-core tests: settings, a plan, and hand-made minibatch outputs for a work item."""

from __future__ import annotations

from typing import Any

import numpy as np

from asp.config import deep_merge
from asp.control.core import ControlCore, GUSlot
from asp.control.database import Database
from asp.control.messages import MinibatchOutput, WorkItem
from asp.control.plan import WorkPlan
from asp.control.settings import ControlSettings, PartialSettings
from asp.runtime import RuntimeConfig

PARTIAL_OFF = PartialSettings(
    enabled=False, token_budget=64, continuation_order="fifo", max_rows=None, wait_for_full=False, oldest_first=True
)


def gu_slots(generation_units: int, actors_per_unit: int) -> list[GUSlot]:
    """GU g holds actors ``g * actors_per_unit ...`` (global actor indices, as the runtime numbers them)."""
    slots = []
    for g in range(generation_units):
        ids = list(range(g * actors_per_unit, (g + 1) * actors_per_unit))
        slots.append(GUSlot(g, ids, set(ids)))
    return slots


def settings(**overrides) -> ControlSettings:
    """2 GUs x 2 actors, batches of 4 prompts, n = 2, one pass, no lag bound, no checkpoints to wait for."""
    base = dict(
        mode="async",
        generation_units=2,
        actors_per_unit=2,
        gu_queue_target=1,
        global_batch_prompts=4,
        n_samples=2,
        q_max=12,
        q_resume=None,
        max_policy_lag=None,
        stale_samples="drop",
        iterations=None,
        max_attempts=3,
        checkpoint_interval=2,
        stall_timeout_s=60.0,
        poll_timeout_s=1.0,
        seed=0,
        partial=PARTIAL_OFF,
        max_new_tokens=160,
        history=None,
    )
    return ControlSettings(**(base | overrides))


def plan(n_minibatches: int = 12, size: int = 2, k: int = 2) -> WorkPlan:
    """Minibatches of `size` consecutive int prompt ids, batch groups of `k` minibatches."""
    mbs = [list(range(s, s + size)) for s in range(0, n_minibatches * size, size)]
    return WorkPlan.from_lists(mbs, [p // k for p in range(n_minibatches)])


def core(s: ControlSettings | None = None, p: WorkPlan | None = None, **kwargs) -> ControlCore:
    s = s or settings()
    p = p or plan()
    texts = {pid: f"prompt {pid}" for pid in p.prompt_ids()}
    epochs = 1 if s.iterations is None else None
    db = Database(p, texts, epochs=epochs, max_attempts=s.max_attempts, seed=s.seed)
    c = ControlCore(s, db, gu_slots(s.generation_units, s.actors_per_unit), **kwargs)
    c.begin(0.0)
    return c


def output(
    item: WorkItem,
    gu: int,
    actor: int,
    version: int,
    start: float,
    end: float,
    n: int = 2,
    lengths: np.ndarray | None = None,
) -> MinibatchOutput:
    """The completed minibatch of `item`: every sample (3 + prompt id) tokens long, unless `lengths` (one per sample)
    are given."""
    if lengths is None:
        lengths = np.repeat(np.asarray([3 + int(p) for p in item.prompt_ids], np.int32), n)
    return MinibatchOutput(
        task_id=item.task_id,
        minibatch_id=item.minibatch_id,
        attempt=item.attempt,
        gu=gu,
        actor=actor,
        policy_version=version,
        prompt_ids=list(item.prompt_ids),
        n=n,
        lengths=lengths,
        stopped=np.ones(lengths.size, bool),
        token_ids=np.zeros(0, np.int32),
        logprobs=np.zeros(0, np.float32),
        prompt_tokens=np.full(len(item.prompt_ids), 5, np.int32),
        texts=[],
        gen_start=start,
        gen_end=end,
    )


def sim_settings(enabled: bool, order: str = "fifo", **overrides: Any) -> ControlSettings:
    """The simulator's settings for the partial-rollout tests: 1 GU x 2 actors, global batch 4, 2 samples of at most
    16 tokens, partial rollouts with a 4-token budget (`enabled`, `order`); `overrides`: other RuntimeConfig fields (a
    section's as the keys that change, merged in).
    """
    fields: dict[str, Any] = {
        "iterations": None,
        "global_batch_prompts": 4,
        "sampling": {"n_samples": 2, "max_new_tokens": 16},
        "queue": {"max_policy_lag": None, "gu_queue_target": 2, "q_max": 16},
        "ray": {"generation_units": 1, "actors_per_unit": 2},
        "partial": {"enabled": enabled, "token_budget": 4, "continuation_order": order},
    }
    return RuntimeConfig(**deep_merge(fields, overrides)).control_settings()
