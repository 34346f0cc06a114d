"""Measure how generation engines and a training step slow each other down on shared CPU cores.

`asp simulate probe-sharing` (and `probe_sharing` here) starts K of launch's generation actors
(`asp.runtime.generation.GenerationActor`, ``runtime.engine``, on Ray with launch's actor resources) and one
training load beside them, then times, on the same cores the launch uses:

* the training load alone (its baseline);
* k = 1..K engines decoding the same minibatch at once, ``repeats`` calls each without the training load, and
  beside it as many calls as make the window every engine decodes in hold ``repeats`` of its steps
  (`calls_for_steps`);
* the training load's steps while k engines decode.

Each slowdown is a median time over its baseline's median (one engine decoding with nothing beside it, or the load
alone; the engines' own call times, `MinibatchOutput.gen_start`
/ ``gen_end``; the load's steps inside the window where every engine decoded). The result is the
`asp.sim.sharing.ContentionTable` the simulator uses instead of processor sharing by thread demand
(``simulate.contention``).

The training load is a **stand-in for the GRPO trainer's step**: the policy's own model, with
``runtime.grpo.num_threads`` torch threads, runs forward and backward over a global batch's worth of sequences
(``runtime.global_batch_prompts x n_samples`` of the profile's mean prompt + response tokens, in micro-batches of
``runtime.grpo.micro_batch_tokens``) and an AdamW step with learning rate 0, so its weights never change. It is the
trainer's compute, not its data: what the probe needs is the trainer's pressure on the cores.

    result = probe_sharing(runtime, spec, sampling, prompts, load, max_engines=3, repeats=4)
    ContentionTable.from_dict(result)

Tests: tests/runtime/test_contention.py (a tiny real model on the shared local Ray).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from asp.control.messages import Failure, WorkItem
from asp.errors import UserError
from asp.rollout.base import SamplingParams
from asp.runtime.config import RuntimeConfig
from asp.runtime.profile_actors import generation_pool
from asp.runtime.trainer import work_in

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainingLoadSpec:
    """What the training load computes (picklable): the model directory, sequences per step, tokens per sequence,
    padded tokens per micro-batch, torch threads."""

    model_path: str
    sequences: int
    seq_tokens: int
    micro_batch_tokens: int
    num_threads: int


class TrainingLoad:
    """The trainer stand-in (see the module docstring); a threaded Ray actor so `stop` reaches a running `run`."""

    def __init__(self, spec: TrainingLoadSpec, cwd: str | None = None) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        work_in(cwd)
        torch.set_num_threads(spec.num_threads)
        self.spec = spec
        self.model = AutoModelForCausalLM.from_pretrained(spec.model_path, local_files_only=True, use_safetensors=True)
        self.model.train()
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=0.0)
        vocab = int(self.model.config.vocab_size)
        gen = torch.Generator().manual_seed(0)
        tokens = torch.randint(0, vocab, (spec.sequences, spec.seq_tokens), generator=gen)
        per = max(1, spec.micro_batch_tokens // spec.seq_tokens)
        self.micro = list(tokens.split(per))
        self.stopping = threading.Event()

    def ready(self) -> None:
        return None

    def step(self) -> tuple[float, float]:
        """One forward/backward over the batch and an optimizer step: its (start, end) wall-clock seconds."""
        start = time.time()
        for ids in self.micro:
            self.model(input_ids=ids, labels=ids).loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return start, time.time()

    def steps(self, n: int) -> list[tuple[float, float]]:
        return [self.step() for _ in range(n)]

    def run(self) -> list[tuple[float, float]]:
        """Steps until `stop` is called (at least one)."""
        self.stopping.clear()
        out = [self.step()]
        while not self.stopping.is_set():
            out.append(self.step())
        return out

    def stop(self) -> None:
        self.stopping.set()


def _items(prompts: list[str], repeats: int, seed: int) -> list[WorkItem]:
    return [WorkItem(r, r, 0, 0, list(range(len(prompts))), prompts, seed + r) for r in range(repeats)]


def _call_times(outputs: list[Any]) -> list[tuple[float, float]]:
    times = []
    for out in outputs:
        if isinstance(out, Failure):
            raise UserError(f"the sharing probe's generation call failed: {out.reason}")
        times.append((float(out.gen_start), float(out.gen_end)))
    return times


def calls_for_steps(call_s: float, step_s: float, steps: int) -> int:
    """Calls per engine whose back-to-back run outlasts `steps` + 2 training steps (the first and last ones straddle
    the window's edges), at the times of each alone (both slow down beside each other): at least `steps` (pure)."""
    if not call_s > 0 or not step_s > 0 or steps < 1:
        raise ValueError(f"need positive times and steps, got {call_s}, {step_s}, {steps}")
    return max(steps, int(np.ceil((steps + 2) * step_s / call_s)))


def slowdown_rows(
    alone_call_s: float, alone_step_s: float, measured: dict[tuple[int, bool], tuple[list[float], list[float]]]
) -> tuple[list[list[float]], list[float]]:
    """(generation rows [[alone, with training], ...] for k = 1..K, training entries for k = 1..K) from the
    medians of each setting's call times and step times over the baselines (pure; the row of one engine alone is
    1 when `alone_call_s` is that setting's median).

    Args:
        measured: (k, training) -> (call seconds, step seconds) of that setting.
    """
    if not alone_call_s > 0 or not alone_step_s > 0:
        raise ValueError("the baselines must be > 0 s")
    engines = sorted({k for k, _ in measured})
    if engines != list(range(1, len(engines) + 1)):
        raise ValueError(f"need every engine count from 1, got {engines}")
    gen, train = [], []
    for k in engines:
        row = []
        for training in (False, True):
            calls, _ = measured[(k, training)]
            row.append(float(np.median(calls)) / alone_call_s)
        gen.append(row)
        steps = measured[(k, True)][1]
        if not steps:
            raise ValueError(f"no training step ran while {k} engines decoded: raise the repeats")
        train.append(float(np.median(steps)) / alone_step_s)
    return gen, train


def probe_sharing(
    runtime: RuntimeConfig,
    engine_factory: Any,
    sampling: SamplingParams,
    prompts: list[str],
    load: TrainingLoadSpec,
    *,
    max_engines: int,
    repeats: int,
    seed: int,
) -> dict[str, Any]:
    """Run the probe (see the module docstring) and return its record: ``generation_slowdown``,
    ``training_slowdown``, ``alone_call_s``, ``alone_step_s``, the raw medians and the setting.

    Raises:
        UserError: an actor could not start or a call failed; ValueError: bad arguments.
    """
    import ray

    if max_engines < 1 or repeats < 1 or not prompts:
        raise ValueError(f"need max_engines >= 1, repeats >= 1 and prompts, got {max_engines}, {repeats}")
    cwd = os.getcwd()
    pool = generation_pool(runtime, max_engines, engine_factory, sampling, what="sharing probe", knob="--engines")
    with pool as (handles, _):
        trainer = ray.remote(TrainingLoad).options(num_cpus=0, max_concurrency=2).remote(load, cwd)
        try:
            ray.get(trainer.ready.remote())
            engines = [handles[a] for a in sorted(handles)]
            warm = _items(prompts, 2, seed)  # a process's first calls are slower (allocators, caches)
            ray.get([h.generate.remote(warm, None) for h in engines] + [trainer.steps.remote(2)])
            log.info("sharing probe: %d engines and the training load warmed up", len(engines))
            alone_steps = [e - s for s, e in ray.get(trainer.steps.remote(repeats))]
            first = ray.get(engines[0].generate.remote(_items(prompts, repeats, seed), None))
            one = [e - s for s, e in _call_times(first)]
            # beside the load, enough calls that `repeats` of its steps fit inside the window every engine decodes
            calls_beside = calls_for_steps(float(np.median(one)), float(np.median(alone_steps)), repeats)
            measured: dict[tuple[int, bool], tuple[list[float], list[float]]] = {}
            for k in range(1, max_engines + 1):
                for training in (False, True):
                    n_calls = calls_beside if training else repeats
                    items = _items(prompts, n_calls, seed)
                    run_ref = trainer.run.remote() if training else None
                    if training:
                        time.sleep(0.05)
                    outs = ray.get([h.generate.remote(items, None) for h in engines[:k]])
                    steps: list[tuple[float, float]] = []
                    if run_ref is not None:
                        ray.get(trainer.stop.remote())
                        steps = ray.get(run_ref)
                    calls = [t for out in outs for t in _call_times(out)]
                    lo, hi = max(c[0] for c in calls[::n_calls]), min(c[1] for c in calls[n_calls - 1 :: n_calls])
                    inside = [e - s for s, e in steps if s >= lo and e <= hi]
                    measured[(k, training)] = ([e - s for s, e in calls], inside)
                    log.info(
                        "sharing probe: %d engine(s)%s: call %.3f s, step %s",
                        k,
                        " + training" if training else "",
                        float(np.median([e - s for s, e in calls])),
                        f"{np.median(inside):.3f} s" if inside else "-",
                    )
        finally:
            ray.kill(trainer)
    alone_call, alone_step = float(np.median(measured[(1, False)][0])), float(np.median(alone_steps))
    gen, train = slowdown_rows(alone_call, alone_step, measured)
    return {
        "generation_slowdown": [[round(v, 4) for v in row] for row in gen],
        "training_slowdown": [round(v, 4) for v in train],
        "alone_call_s": alone_call,
        "alone_step_s": alone_step,
        "median_call_s": {f"{k}{'+training' if t else ''}": float(np.median(v[0])) for (k, t), v in measured.items()},
        "median_step_s": {f"{k}": float(np.median(measured[(k, True)][1])) for k in range(1, max_engines + 1)},
        "engines": max_engines,
        "repeats": repeats,
        "calls_beside_training": calls_beside,
        "prompts_per_call": len(prompts),
        "samples_per_prompt": sampling.n,
        "training_load": {"sequences": load.sequences, "seq_tokens": load.seq_tokens, "threads": load.num_threads},
    }
