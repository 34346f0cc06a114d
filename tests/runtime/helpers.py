"""Helpers shared by the runtime tests: tiny plans, a fast config, the trainer ledger, hand-made outputs, and
gates (a stand-in engine and a simulated trainer that wait for counted events) for deterministic interleavings."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from ray import cloudpickle as ray_cloudpickle

from asp.config import deep_merge
from asp.runtime import MinibatchOutput, RuntimeConfig, WorkPlan
from asp.runtime.engines import StandInEngine
from asp.trainers import SimulatedTrainer


def make_plan(n_minibatches: int, size: int, k: int = 2) -> tuple[WorkPlan, dict[int, str]]:
    """Minibatches of `size` consecutive int prompt ids, groups of `k`; prompt text "w<i> ...".

    Prompt i has i % 5 + 1 words, so the stand-in engine's lengths differ between prompts.
    """
    total = n_minibatches * size
    prompts = {i: " ".join(f"w{(i + j) % 40}" for j in range(i % 5 + 1)) + f" #{i}" for i in range(total)}
    mbs = [list(range(s, s + size)) for s in range(0, total, size)]
    return WorkPlan.from_lists(mbs, [p // k for p in range(n_minibatches)]), prompts


def fast_config(**overrides: Any) -> RuntimeConfig:
    """A small config for tests: 1 GU x 2 actors, tiny fractional CPUs, short polls, one pass over the plan,
    an instant simulated trainer and no lag bound (the demo defaults of `RuntimeParams` otherwise); `overrides`:
    `RuntimeConfig` fields, a section's given as the keys that change (``queue={"q_max": 8}``)."""
    base: dict[str, Any] = {
        "iterations": None,
        "global_batch_prompts": 8,
        "sampling": {"n_samples": 2, "max_new_tokens": 16},
        "queue": {"max_policy_lag": None, "gu_queue_target": 4, "q_max": 32},
        # a stall means a bug, not a busy machine: CI may run two test workers at once
        "control": {"poll_timeout_s": 0.2, "stall_timeout_s": 240.0},
        "ray": {"generation_units": 1, "actors_per_unit": 2, "actor_num_cpus": 0.25},
        "trainer": {"step_s": 0.0, "refresh_delay_s": 0.0},
    }
    return RuntimeConfig(**deep_merge(base, overrides))


def read_ledger(path: Path) -> list[dict]:
    """The SimulatedTrainer's ledger lines."""
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def output(task_id: int, prompt_ids: list, lengths: list[int], n: int = 2, version: int = 0) -> MinibatchOutput:
    """An output whose sample s has tokens [100*task + s] * length and log-probs -(s + 1)."""
    lengths_arr = np.asarray(lengths, np.int32)
    tokens = np.concatenate([np.full(L, 100 * task_id + s, np.int32) for s, L in enumerate(lengths)])
    logprobs = np.concatenate([np.full(L, -(s + 1.0), np.float32) for s, L in enumerate(lengths)])
    return MinibatchOutput(
        task_id=task_id,
        minibatch_id=10 + task_id,
        attempt=0,
        gu=0,
        actor=task_id % 2,
        policy_version=version,
        prompt_ids=prompt_ids,
        n=n,
        lengths=lengths_arr,
        stopped=np.ones(len(lengths), bool),
        token_ids=tokens,
        logprobs=logprobs,
        prompt_tokens=np.full(len(prompt_ids), 3, np.int32),
        texts=[f"t{task_id}.{s}" for s in range(len(lengths))],
        gen_start=0.0,
        gen_end=1.0,
    )


# ---- gates: make an interleaving happen for certain instead of relying on how long two sleeps take ----------


class Gate:
    """File-backed counters shared by the driver, the generation actors and the Training Unit (one host).

    `tick(name)` claims the next ordinal of a counter atomically (exclusive file creation), so any process
    can count events and any other can wait for a count; nothing here depends on how fast anything runs.
    """

    def __init__(self, directory: str | Path) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)

    def count(self, name: str) -> int:
        return sum(1 for _ in self.dir.glob(f"{name}.*"))

    def tick(self, name: str, times: int = 1) -> int:
        """Add `times` to counter `name`; return its value after the last one."""
        n = self.count(name)
        for _ in range(times):
            while True:
                n += 1
                try:
                    os.close(os.open(self.dir / f"{name}.{n}", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
                    break
                except FileExistsError:
                    continue
        return n

    def wait(self, ok: Callable[[Gate], bool], what: str, timeout_s: float = 60.0) -> None:
        """Poll until `ok(self)`; raise `TimeoutError` naming `what` (the test then fails with it)."""
        deadline = time.monotonic() + timeout_s
        while not ok(self):
            if time.monotonic() > deadline:
                names = sorted({p.name.rsplit(".", 1)[0] for p in self.dir.iterdir()})
                seen = ", ".join(f"{n}={self.count(n)}" for n in names)
                raise TimeoutError(f"gate: {what} did not happen within {timeout_s:g} s (counters: {seen})")
            time.sleep(0.002)


class GatedEngine(StandInEngine):
    """`StandInEngine` that counts its calls and generated prompts in a `Gate`; calls after the first
    `free_calls` (counted over all actors) wait inside `generate` until the gate's "release" counter is set."""

    def __init__(self, gate_dir: str, free_calls: int | None, **options: Any) -> None:
        super().__init__(**options)
        self.gate, self.free_calls = Gate(gate_dir), free_calls

    def generate(self, prompts: list[str], params: Any) -> list[Any]:
        call = self.gate.tick("calls")
        if self.free_calls is not None and call > self.free_calls:
            self.gate.wait(lambda g: g.count("release") > 0, f"release of generate call {call}")
        results = super().generate(prompts, params)
        self.gate.tick("prompts", len(prompts))
        return results


@dataclass(frozen=True)
class GatedStandIn:
    """Picklable engine factory for `run_async`: one `GatedEngine` per generation actor."""

    gate_dir: str
    free_calls: int | None = None
    options: dict = field(default_factory=dict)

    def __call__(self) -> GatedEngine:
        return GatedEngine(self.gate_dir, self.free_calls, **self.options)


class GatedTrainer(SimulatedTrainer):
    """Instant `SimulatedTrainer` (with ledger) that starts step s only once ``may_step(gate, s)`` is true."""

    def __init__(self, gate_dir: str, may_step: Callable[[Gate, int], bool], ledger_path: str) -> None:
        super().__init__(0.0, 0.0, ledger_path)
        self.gate, self.may_step = Gate(gate_dir), may_step

    def step(self, batch: Any) -> Any:
        step = self.version + 1
        self.gate.wait(lambda g: self.may_step(g, step), f"the condition for training step {step}")
        return super().step(batch)


def after_prompts_generated(gate: Gate, step: int, *, prompts: int, at_step: int = 1) -> bool:
    """`may_step`: step `at_step` waits until the engines generated `prompts` prompts; other steps run."""
    return step != at_step or gate.count("prompts") >= prompts


def only_while_paused(gate: Gate, step: int, *, pauses: int) -> bool:
    """`may_step`: train only while the sender is paused, until it has paused `pauses` times (then freely)."""
    paused = gate.count("pause")
    return paused >= pauses or paused > gate.count("resume")


# The gated classes travel to the Ray workers by value: `tests/` is not on their import path.
ray_cloudpickle.register_pickle_by_value(sys.modules[__name__])
