"""Measure how generation engines and the GRPO trainer slow each other down on shared CPU cores.

`asp simulate probe-sharing` (and `probe_sharing` here) starts K of launch's generation actors
(`asp.runtime.generation.GenerationActor`, ``runtime.engine``, on Ray with launch's actor resources) and launch's
own Training Unit beside them (`asp.runtime.trainer.build_training_unit` of the launch's trainer factory), then
measures in ``repeats`` rounds, on the same cores the launch uses. Each round times its baselines first (two
trainer steps alone, one call of one engine alone), then every setting against them:

* k = 1..K engines decoding the same minibatch at once, one call each without a training step (k = 1: the
  baseline call), and beside back-to-back steps as many calls as make the window every engine decodes in hold a
  whole step (`calls_for_steps`);
* the trainer's steps while k engines decode.

A setting's slowdown is the median over the rounds of its ratios to its own round's baselines: of the calls'
seconds per decode step (`seconds_per_decode_step`: the engines' own call times, `MinibatchOutput.gen_start` /
``gen_end``, over the call's longest response) and of the trainer's own step times (`StepResult.duration_s`) of
the steps inside the window where every engine decoded. Rounds, and ratios to the baselines just before, because
this machine's speed itself drifts: two probes a minute apart measured the step alone at 0.82 and 1.05 s. The result
is the `asp.sim.sharing.ContentionTable` the simulator uses instead of processor sharing by thread demand
(``simulate.contention``), and the baselines (``alone_step_s``, ``alone_calls``) anchor the full-speed times
(`asp.sim.sharing.ProbeAnchor`).

The training step is **the GRPO trainer's real step** (`asp.trainers.grpo.GRPOTrainer.step`: rewards, advantages,
forward and backward over micro-batches, clipping, the AdamW update, the weight export) on a global batch of the
engines' own samples (`probe_batch`: the warm-up calls' outputs, ``runtime.global_batch_prompts`` prompts). The
caller gives it learning rate 0, so every step trains the same weights on the same batch: the same compute each
time, and the engines never need new weights.

    result = probe_sharing(runtime, spec, sampling, prompts, trainer_factory, max_engines=3, repeats=4, seed=0)
    ContentionTable.from_dict(result)

Tests: tests/runtime/test_contention.py (a tiny real model and a real GRPO Training Unit on the shared local Ray).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from asp.control.messages import Failure, GlobalBatch, MinibatchOutput, WorkItem
from asp.control.queue import assemble_batch, sample_offsets
from asp.errors import UserError
from asp.rollout.base import SamplingParams
from asp.runtime.config import RuntimeConfig
from asp.runtime.profile_actors import generation_pool
from asp.runtime.trainer import build_training_unit, rank_handles

log = logging.getLogger(__name__)


def probe_batch(outputs: Sequence[MinibatchOutput], prompts: int) -> GlobalBatch:
    """A global batch of `prompts` prompts (with all their samples) taken from `outputs` in order, cycling through
    them again when they hold fewer (pure; step 1).

    Raises:
        ValueError: no output holds a prompt, or `prompts` < 1.
    """
    outs = [o for o in outputs if o.num_prompts > 0]
    if prompts < 1 or not outs:
        raise ValueError(f"need prompts >= 1 and outputs with prompts, got {prompts} and {len(outs)} outputs")
    pieces, left, i = [], prompts, 0
    while left > 0:
        out = outs[i % len(outs)]
        take = min(left, out.num_prompts)
        pieces.append((out, 0, take, sample_offsets(out.lengths)))
        left, i = left - take, i + 1
    return assemble_batch(1, outs[0].n, pieces)


class TrainerSteps:
    """Back-to-back steps of a Training Unit on one batch, driven from a thread of the caller (the unit's
    `StepResult.duration_s`, and the (start, end) wall-clock interval it ends at its return)."""

    def __init__(self, leader: Any, batch: GlobalBatch) -> None:
        import ray

        self.leader, self.batch = leader, ray.put(batch)
        self.stopping = threading.Event()
        self.thread: threading.Thread | None = None
        self.done: list[tuple[float, float]] = []
        self.error: Exception | None = None

    def step(self) -> tuple[float, float]:
        import ray

        result = ray.get(self.leader.step.remote(self.batch))
        end = time.time()
        return end - float(result.duration_s), end

    def steps(self, n: int) -> list[tuple[float, float]]:
        return [self.step() for _ in range(n)]

    def start(self) -> None:
        """Step until `stop` (at least once), in a thread."""
        self.stopping.clear()
        self.done = []

        def loop() -> None:
            try:
                self.done.append(self.step())
                while not self.stopping.is_set():
                    self.done.append(self.step())
            except Exception as exc:  # re-raised by `stop`
                self.error = exc

        self.thread = threading.Thread(target=loop, daemon=True)
        self.thread.start()

    def stop(self) -> list[tuple[float, float]]:
        """Stop after the running step; its (start, end) intervals."""
        self.stopping.set()
        if self.thread is not None:
            self.thread.join()
        if self.error is not None:
            raise UserError(f"the sharing probe's training step failed: {self.error}")
        return list(self.done)


def _items(prompts: list[str], repeats: int, seed: int) -> list[WorkItem]:
    return [WorkItem(r, r, 0, 0, list(range(len(prompts))), prompts, seed + r) for r in range(repeats)]


def seconds_per_decode_step(out: MinibatchOutput) -> float:
    """A call's seconds per decode step (its longest response's tokens: static and continuous batching both run
    that many steps). Calls of one prompt set differ in their longest response (other seeds; 51 to 145 tokens in
    one probe of the demo), so raw call times would compare longest responses, not the cores' sharing."""
    return float(out.gen_s) / max(int(out.lengths.max(initial=0)), 1)


def _call_times(outputs: list[Any]) -> list[tuple[float, float]]:
    times = []
    for out in outputs:
        if isinstance(out, Failure):
            raise UserError(f"the sharing probe's generation call failed: {out.reason}")
        times.append((float(out.gen_start), float(out.gen_end)))
    return times


def call_shape(out: MinibatchOutput) -> dict[str, float]:
    """A call's seconds and what the generation-time fit predicts from (`asp.sim.sharing.call_predictions`'
    columns): prompts, responses, total and longest response tokens, prompt tokens."""
    return {
        "seconds": float(out.gen_s),
        "prompts": float(out.num_prompts),
        "responses": float(out.lengths.size),
        "tokens": float(out.lengths.sum()),
        "max_length": float(out.lengths.max(initial=0)),
        "prompt_tokens": float(out.prompt_tokens.sum()),
    }


def calls_for_steps(call_s: float, step_s: float, steps: int) -> int:
    """Calls per engine whose back-to-back run outlasts `steps` + 2 training steps (the first and last ones straddle
    the window's edges), at the times of each alone (both slow down beside each other): at least `steps` (pure)."""
    if not call_s > 0 or not step_s > 0 or steps < 1:
        raise ValueError(f"need positive times and steps, got {call_s}, {step_s}, {steps}")
    return max(steps, int(np.ceil((steps + 2) * step_s / call_s)))


def slowdown_rows(
    ratios: dict[tuple[int, bool], tuple[list[float], list[float]]],
) -> tuple[list[list[float]], list[float]]:
    """(generation rows [[alone, with training], ...] for k = 1..K, training entries for k = 1..K): the medians of
    each setting's ratios to its rounds' baselines (pure).

    Args:
        ratios: (k, training) -> (call ratios, step ratios) of that setting.
    """
    engines = sorted({k for k, _ in ratios})
    if engines != list(range(1, len(engines) + 1)):
        raise ValueError(f"need every engine count from 1, got {engines}")
    gen, train = [], []
    for k in engines:
        gen.append([float(np.median(ratios[(k, training)][0])) for training in (False, True)])
        steps = ratios[(k, True)][1]
        if not steps:
            raise ValueError(f"no training step ran while {k} engines decoded: raise the repeats")
        train.append(float(np.median(steps)))
    return gen, train


def probe_sharing(
    runtime: RuntimeConfig,
    engine_factory: Any,
    sampling: SamplingParams,
    prompts: list[str],
    trainer_factory: Any,
    *,
    max_engines: int,
    repeats: int,
    seed: int,
) -> dict[str, Any]:
    """Run the probe (see the module docstring) and return its record: ``generation_slowdown``,
    ``training_slowdown``, ``alone_call_s``, ``alone_step_s`` (and per round ``alone_steps_s``), every setting's
    per-round ratios (``rounds_ratios``), the calls of one engine alone (``alone_calls``: `call_shape`) and the
    setting.

    Args:
        prompts: the texts of one call (prompt ids 0..P-1); `trainer_factory` must know those ids (prompts and
            answers), and should train at learning rate 0 (see the module docstring).

    Raises:
        UserError: an actor or the Training Unit could not start, a call or a step failed; ValueError: bad arguments.
    """
    import ray

    if max_engines < 1 or repeats < 1 or not prompts:
        raise ValueError(f"need max_engines >= 1, repeats >= 1 and prompts, got {max_engines}, {repeats}")
    pool = generation_pool(runtime, max_engines, engine_factory, sampling, what="sharing probe", knob="--engines")
    with pool as (handles, _):
        leader, _ranks = build_training_unit(runtime, trainer_factory)
        try:
            error = ray.get(leader.ready.remote())
            if error:
                raise UserError(f"the sharing probe's Training Unit could not start: {error}")
            engines = [handles[a] for a in sorted(handles)]
            warm = _items(prompts, 2, seed)  # a process's first calls are slower (allocators, caches)
            outputs = [out for outs in ray.get([h.generate.remote(warm, None) for h in engines]) for out in outs]
            _call_times(outputs)
            batch = probe_batch(outputs, runtime.global_batch_prompts)
            trainer = TrainerSteps(leader, batch)
            trainer.steps(2)
            log.info("sharing probe: %d engines and the Training Unit warmed up", len(engines))
            ratios: dict[tuple[int, bool], tuple[list[float], list[float]]] = {
                (k, t): ([], []) for k in range(1, max_engines + 1) for t in (False, True)
            }
            alone_steps: list[float] = []
            alone_calls: list[dict[str, float]] = []
            calls_beside = 0
            for r in range(repeats):  # rounds: each setting against the baselines measured just before it
                step_s = float(np.median([e - s for s, e in trainer.steps(2)]))
                base = ray.get(engines[0].generate.remote(_items(prompts, 1, seed + r), None))
                _call_times(base)
                alone_steps.append(step_s)
                alone_calls.extend(call_shape(out) for out in base)
                call_step_s = seconds_per_decode_step(base[0])
                # beside the steps, enough calls that one whole step fits inside the window every engine decodes
                calls_beside = calls_for_steps(float(base[0].gen_s), step_s, 1)
                for k in range(1, max_engines + 1):
                    for training in (False, True):
                        if k == 1 and not training:  # the round's baseline call itself
                            ratios[(1, False)][0].append(1.0)
                            continue
                        n_calls = calls_beside if training else 1
                        items = _items(prompts, n_calls, seed + r)
                        if training:
                            trainer.start()
                            time.sleep(0.05)
                        try:
                            outs = ray.get([h.generate.remote(items, None) for h in engines[:k]])
                        finally:
                            steps = trainer.stop() if training else []
                        calls = [t for out in outs for t in _call_times(out)]
                        lo = max(c[0] for c in calls[::n_calls])
                        hi = min(c[1] for c in calls[n_calls - 1 :: n_calls])
                        per_step = [seconds_per_decode_step(out) for o in outs for out in o]
                        ratios[(k, training)][0].extend(v / call_step_s for v in per_step)
                        ratios[(k, training)][1].extend((e - s) / step_s for s, e in steps if s >= lo and e <= hi)
                log.info("sharing probe: round %d of %d done", r + 1, repeats)
        finally:
            for rank in rank_handles(leader):
                ray.kill(rank)
    gen, train = slowdown_rows(ratios)
    return {
        "generation_slowdown": [[round(v, 4) for v in row] for row in gen],
        "training_slowdown": [round(v, 4) for v in train],
        "alone_call_s": float(np.median([c["seconds"] for c in alone_calls])),
        "alone_step_s": float(np.median(alone_steps)),
        "alone_steps_s": [round(v, 4) for v in alone_steps],  # per round: the machine's drift during the probe
        "rounds_ratios": {
            f"{k}{'+training' if t else ''}": {"calls": [round(v, 4) for v in c], "steps": [round(v, 4) for v in st]}
            for (k, t), (c, st) in ratios.items()
        },
        "engines": max_engines,
        "repeats": repeats,
        "calls_beside_training": calls_beside,
        "prompts_per_call": len(prompts),
        "samples_per_prompt": sampling.n,
        "alone_calls": alone_calls,
        "training_load": {
            "kind": "the GRPO trainer's step (learning rate 0) on the engines' own samples",
            "prompts": batch.num_prompts,
            "sequences": int(batch.lengths.size),
            "response_tokens": int(batch.lengths.sum()),
        },
    }
