"""DVC stage `trainer_alone`: the GRPO trainer's step timed alone on this machine's cores, in the pipeline's sitting.

The simulator's CPU time model takes full speed from what ran alone and the slowdowns from the sharing probe
(`asp simulate probe-sharing`, metrics/sharing_probe.json, committed once for a machine). Generation at full speed
is the profile's fit, timed with every pipeline run. The trainer's step alone used to be the probe's, moved onto the
profile's clock by how much faster the profile ran the same engine (`asp.sim.sharing.on_profile_clock`); but one
machine's speed moves between sittings, and not by the same factor for an engine's decode and a trainer's backward
pass (four hf probes of 2026-12-07: step alone 0.74-0.88 s, its ratio to the same engine's calls 1.33-1.53). This
stage times the step in the sitting the launch runs in, as the probe times its baseline: `runtime.global_batch_prompts`
of the profile prompts decoded in this process by an hf engine with ``profile.engine``'s device, dtype and threads
(the launch's sampling), then the launch's GRPO trainer (``runtime.grpo``, learning rate 0, so every step does the
same work on the same weights) stepping on that batch, `WARMUP` steps untimed and `STEPS` timed
(`StepResult.duration_s`: rewards, advantages, forward and backward, the AdamW update, the weight export). The
simulate stage takes the median as the step's full speed under ``simulate.full_speed: auto``
(``simulate/gen_fit/trainer_alone_s``), the probe's slowdowns on top.

Timed only where the simulator would use it (`why_untimed`): a GRPO trainer on one CPU rank, ``simulate.cores``
shared, ``simulate.sharing: measured``, ``simulate.full_speed: auto``, the fitted time model, a generated profile;
otherwise metrics/trainer_alone.json holds ``trainer_alone/timed: 0`` and the stage says why (the simulate stage then
keeps the probe's step on the profile's clock, or simulate.training). About 10-20 s on the demo.

Writes metrics/trainer_alone.json (``trainer_alone/step_s`` with its min and max, the batch's sequences, response
tokens and prompts) and logs the same to the stage's MLflow run.

Run: `asp stage trainer_alone` (dvc.yaml calls this; its deps, params and outs are listed there).
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from asp.config import Params
from asp.control.messages import GlobalBatch, WorkItem
from asp.env import torch_threads
from asp.errors import UserError
from asp.io import write_json
from asp.rollout.base import SamplingParams, timed_generate
from asp.runtime import EngineSpec
from asp.runtime.config import RuntimeConfig
from asp.runtime.contention import probe_batch
from asp.runtime.generation import pack_output
from asp.runtime.trainer import Trainer
from asp.sim.presets import FIT
from asp.steps.engine import engine_options
from asp.steps.loaders import policy_model_path
from asp.steps.paths import TrainerAlonePaths as Paths
from asp.steps.probe_trainer import first_profile_prompts, timing_trainer_factory
from asp.tracking import Tracker

__all__ = ["Paths", "run", "why_untimed", "step_times", "alone_metrics"]

WARMUP = 2  # a process's first steps are slower (allocators, the optimizer's state, caches): untimed
STEPS = 5  # timed steps: their median is the step's full speed


def why_untimed(params: Params) -> str:
    """Why the simulator would not use a trainer step timed here ('' when it would), naming the setting (pure)."""
    sim, rt = params.simulate, params.runtime
    reasons = [
        (not sim.enabled, "simulate.enabled is false"),
        (params.profile.source == "file", "profile.source: file (no generation is timed in this pipeline)"),
        (sim.time_model != FIT, f"simulate.time_model is the preset {sim.time_model!r}, not times of this machine"),
        (sim.full_speed != "auto", "simulate.full_speed: params takes the step's full speed from simulate.training"),
        (sim.cores is None, "simulate.cores is null: no shared CPU cores, full speed is simulate.training"),
        (sim.sharing != "measured", "simulate.sharing: processor models sharing by thread demand, not by the probe"),
        (rt.trainer.kind != "grpo", "runtime.trainer.kind: simulated computes nothing on the cores"),
        (
            rt.grpo.device != "cpu" or rt.grpo.needs_process_group,
            "runtime.grpo is not one CPU rank (the sharing model is for the one-machine CPU demo)",
        ),
    ]
    return "; ".join(why for cond, why in reasons if cond)


def step_times(trainer: Trainer, batch: GlobalBatch, warmup: int = WARMUP, steps: int = STEPS) -> list[float]:
    """`steps` back-to-back steps of `trainer` on `batch` after `warmup` untimed ones: each step's
    `StepResult.duration_s` (the trainer's own clock, as the sharing probe reads it).

    Raises:
        ValueError: `steps` < 1 or `warmup` < 0.
    """
    if steps < 1 or warmup < 0:
        raise ValueError(f"need steps >= 1 and warmup >= 0, got {steps} and {warmup}")
    for _ in range(warmup):
        trainer.step(batch)
    return [float(trainer.step(batch).duration_s) for _ in range(steps)]


def alone_metrics(durations: list[float], batch: GlobalBatch) -> dict[str, float]:
    """The stage's metrics from the timed steps and their batch (pure)."""
    return {
        "trainer_alone/timed": 1,
        "trainer_alone/step_s": float(np.median(durations)),
        "trainer_alone/step_min_s": float(min(durations)),
        "trainer_alone/step_max_s": float(max(durations)),
        "trainer_alone/steps": len(durations),
        "trainer_alone/prompts": batch.num_prompts,
        "trainer_alone/sequences": int(batch.lengths.size),
        "trainer_alone/response_tokens": int(batch.lengths.sum()),
    }


@dataclass(frozen=True)
class _Prompts:
    texts: list[str]
    answers: list[str]


def batch_prompts(paths: Paths, prompts: int) -> _Prompts:
    """The first `prompts` profile prompts with their answers (the probe's too)."""
    texts, answers = first_profile_prompts(paths.prompts, prompts)
    if not texts:
        raise UserError(f"{paths.prompts}: holds no prompt; check prepare.profile_prompts.")
    return _Prompts(texts, answers)


def decode_batch(params: Params, paths: Paths, prompts: _Prompts) -> GlobalBatch:
    """One call of an hf engine (``profile.engine``'s options) on `prompts` with the launch's sampling, as a global
    batch."""
    s, seed = params.runtime.sampling, params.common.seed
    sampling = SamplingParams(s.n_samples, s.max_new_tokens, s.temperature, s.top_p, seed=seed)
    # the hf engine whatever profile.engine.kind says (its device, dtype and threads): any engine of the policy gives
    # the trainer the same kind of batch (the step is costed per token), and an hf engine starts in a second
    hf = params.profile.engine.model_copy(update={"kind": "hf"})
    engine = EngineSpec("hf", str(policy_model_path(paths.policy)), engine_options(hf, seed=seed))()
    try:
        result = timed_generate(engine, prompts.texts, sampling)
    finally:
        getattr(engine, "close", lambda: None)()
    ids = list(range(len(prompts.texts)))
    item = WorkItem(0, 0, 0, 0, ids, prompts.texts, seed)
    out = pack_output(item, result.results, sampling.n, gu=0, actor=0, version=0, start=0.0, end=0.0)
    return probe_batch([out], len(ids))


def build_trainer(params: Params, paths: Paths, prompts: _Prompts) -> Trainer:
    """The launch's GRPO trainer at learning rate 0, built in this process."""
    model = policy_model_path(paths.policy)
    runtime = RuntimeConfig.from_params(params)
    return timing_trainer_factory(params, runtime, model, prompts.texts, prompts.answers)()


def run(params: Params, paths: Paths, tracker: Tracker) -> dict[str, Any]:
    """Time the step (see the module docstring), or record why not; write and log the metrics."""
    tracker.log_params({"trainer_alone.warmup": WARMUP, "trainer_alone.steps": STEPS})
    if why := why_untimed(params):
        print(f"trainer_alone: not timed: {why}", file=sys.stderr, flush=True)
        metrics: dict[str, Any] = {"trainer_alone/timed": 0}
    else:
        t0 = time.perf_counter()
        prompts = batch_prompts(paths, params.runtime.global_batch_prompts)
        batch = decode_batch(params, paths, prompts)
        with torch_threads(None):  # the trainer sets runtime.grpo.num_threads for its process: put them back after
            durations = step_times(build_trainer(params, paths, prompts), batch)
        metrics = alone_metrics(durations, batch) | {"trainer_alone/wall_s": time.perf_counter() - t0}
        print(
            f"trainer_alone: the GRPO step alone {metrics['trainer_alone/step_s']:.3f} s (median of {STEPS}, "
            f"{min(durations):.3f}-{max(durations):.3f} s) on {batch.lengths.size} sequences of "
            f"{int(batch.lengths.sum())} response tokens",
            file=sys.stderr,
            flush=True,
        )
    write_json(metrics, paths.metrics)
    tracker.log_metrics(metrics)
    return metrics
