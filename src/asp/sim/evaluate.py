"""Simulated evaluation of planner candidates: `Evaluator` runs `asp.sim.engine.simulate` for a `Candidate`
(schedules cached per (b, k), results per candidate) and measures the B.6 `Rates` from the time models.

    # settings: ControlSettings; kappa, iterations: the schedule params
    ev = make_evaluator(ids, predicted, workload, gen, train, settings, cluster=cluster, kappa=2,
                        condition="C4", method="asp", iterations=200_000)
    ev(candidate)["runtime/summary/mean_iteration_time_s"]

Tests: ``.venv/bin/python -m pytest tests/sim/test_planner.py -q``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from asp.control.plan import WorkPlan
from asp.schedule.conditions import condition_schedule
from asp.sim.engine import Resources, Workload, simulate
from asp.sim.planner import Candidate, Cluster, objective_s
from asp.sim.presets import scaled_models

if TYPE_CHECKING:
    from asp.control.settings import ControlSettings
    from asp.schedule.schedule import Schedule
    from asp.sim.presets import Scale
    from asp.sim.timemodel import GenerationTimeModel, TrainingTimeModel


@dataclass
class Evaluator:
    """Simulates candidates (call it) and measures B.6's `Rates`; build it with `make_evaluator`.

    Schedules are built once per (b, k), results once per candidate. A candidate runs `base` with its GUs,
    actors per GU and q_max, the training step time scaled by `Cluster.train_factor`(tu_devices) (publish and
    reload times unchanged). The rates assume one device per actor (no shared cores) and omit reloads.
    """

    prompt_ids: np.ndarray
    predicted: np.ndarray
    workload: Workload
    gen: GenerationTimeModel
    train: TrainingTimeModel
    base: ControlSettings
    cluster: Cluster
    resources: Resources | None = None
    schedule_kwargs: dict[str, Any] = field(default_factory=dict)
    _schedules: dict[tuple[int, int], tuple[Schedule, WorkPlan]] = field(default_factory=dict, repr=False)
    _results: dict[Candidate, dict[str, float]] = field(default_factory=dict, repr=False)

    @property
    def global_batch_prompts(self) -> int:
        return self.base.global_batch_prompts

    def schedule(self, b: int, k: int) -> tuple[Schedule, WorkPlan]:
        """(Schedule, WorkPlan) of the (b, k) schedule (cached)."""
        if (b, k) not in self._schedules:
            sched = condition_schedule(self.prompt_ids, self.predicted, b=b, k=k, **self.schedule_kwargs)
            self._schedules[b, k] = (sched, WorkPlan.from_schedule(sched))
        return self._schedules[b, k]

    def config(self, c: Candidate) -> ControlSettings:
        """`base` with the candidate's layout and q_max (its q_resume kept only where it stays valid)."""
        resume = self.base.q_resume
        if resume is not None and not self.global_batch_prompts - 1 <= resume <= c.q_max:
            resume = None
        units, actors = c.generation_units, c.actors_per_unit
        return replace(self.base, generation_units=units, actors_per_unit=actors, q_max=c.q_max, q_resume=resume)

    def __call__(self, c: Candidate) -> dict[str, float]:
        if c not in self._results:
            f = self.cluster.train_factor(c.tu_devices)
            t = self.train
            train = replace(
                t,
                step_base_s=t.step_base_s * f,
                step_per_token_s=t.step_per_token_s * f,
                step_per_sample_s=t.step_per_sample_s * f,
            )
            result = simulate(
                self.schedule(c.b, c.k)[1], self.workload, self.gen, train, self.config(c), self.resources
            )
            self._results[c] = {**result.metrics, "planner/train_factor": f}
        return dict(self._results[c])

    def actor_prompts_per_s(self, b: int, k: int) -> float:
        """Scheduled prompts / summed `gen.seconds` of every minibatch of the (b, k) schedule."""
        sched, _ = self.schedule(b, k)
        seconds = 0.0
        for mb in sched.minibatches():
            rows = [self.workload.index[p] for p in mb.tolist()]
            lengths, prompt_tokens = self.workload.lengths[rows], int(self.workload.prompt_tokens[rows].sum())
            max_length, tokens = int(lengths.max(initial=0)), int(lengths.sum())
            seconds += self.gen.seconds(len(rows), lengths.shape[1], max_length, tokens, prompt_tokens)
        return sched.n_prompts / seconds

    def train_step_s(self) -> tuple[float, float]:
        """(step seconds at the TU minimum for G prompts of mean response tokens, publish seconds)."""
        rows = [self.workload.index[p] for p in self.prompt_ids.tolist()]
        tokens = self.global_batch_prompts * float(self.workload.lengths[rows].sum(axis=1).mean())
        samples = self.global_batch_prompts * self.workload.lengths.shape[1]
        return self.train.step_seconds(tokens, samples), self.train.publish_seconds()


def make_evaluator(
    prompt_ids: Sequence[Any],
    predicted: Sequence[float],
    workload: Workload,
    gen: GenerationTimeModel,
    train: TrainingTimeModel,
    base_config: ControlSettings,
    *,
    cluster: Cluster,
    resources: Resources | None = None,
    condition: str,
    iterations: int,
    **schedule: Any,
) -> Evaluator:
    """An `Evaluator` over `condition_schedule(prompt_ids, predicted, condition, b=, k=, ...)` per (b, k).

    Args:
        prompt_ids, predicted: (P,) prompt ids and predicted lengths (tokens).
        workload: realized lengths of every prompt (e.g. `asp.sim.lengths.sample_lengths` of the calibrated
            expected lengths); gen, train: the time models, train at the TU's minimum size.
        base_config: the Control Unit settings every candidate starts from (iterations, batch, lag bound, seed;
            `RuntimeConfig.control_settings()` of the params).
        cluster: the TU's Amdahl scaling; resources: the simulator's `Resources` (default: one device per actor).
        condition: C0..C4; iterations: C4's annealing iterations (`schedule.iterations`); **schedule: more
            `condition_schedule` keywords (kappa, required; method, required for C4; seed (default:
            base_config.seed), calibration, loads).
    """
    kwargs = {"condition": condition, "iterations": iterations, "seed": base_config.seed, **schedule}
    ids, pred = np.asarray(prompt_ids), np.asarray(predicted, np.float64)
    return Evaluator(ids, pred, workload, gen, train, base_config, cluster, resources, kwargs)


def scaled_evaluator(ev: Evaluator, scale: Scale) -> Evaluator:
    """`ev` with its time models scaled by `scale` (`asp.sim.presets.scaled_models`), sharing `ev`'s schedules."""
    gen, train = scaled_models(ev.gen, ev.train, scale)
    return replace(ev, gen=gen, train=train, _schedules=ev._schedules, _results={})


def layout_ranges(
    ev: Evaluator, candidates: Sequence[Candidate], scales: Sequence[Scale]
) -> tuple[list[float], list[float], list[int]]:
    """Each candidate's objective (mean iteration time excl. the first) over the time models scaled by every
    `scales` point: (min per candidate, max per candidate, at how many points it is the fastest of `candidates`;
    ties count for every tied candidate). Costs len(candidates) x len(scales) simulations."""
    table = np.array([[objective_s(scaled_evaluator(ev, s)(c)) for c in candidates] for s in scales])
    wins = (table <= table.min(axis=1, keepdims=True)).sum(axis=0)
    return table.min(axis=0).tolist(), table.max(axis=0).tolist(), [int(w) for w in wins]
