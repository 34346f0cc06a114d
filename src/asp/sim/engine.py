"""Discrete-event simulation of the runtime (``runtime.mode`` async or sync) on a simulated clock (no Ray, no sleep).

Every decision of the Control Unit is the runtime's own: this module drives `asp.control.core.ControlCore`, the
core the Ray Control Unit drives too (dispatch units or sync rounds, backpressure, the lag bound, when to train and
what to take, the iteration and summary metrics under the same ``runtime/...`` names as a real run). What the
simulator adds is what Ray and the engines do in a real run:

* a Generation Unit is a FIFO input queue whose idle actors each take the head minibatch unless paused
  (as `asp.runtime.generation.GenerationUnit`); an actor holding older weights than the last announced
  snapshot first reloads (T_load, deferred reload), then decodes;
* decoding takes `GenerationTimeModel.seconds` of the minibatch's realized lengths (`Workload`); when the
  actors share CPU cores (`Resources.cores`, the CPU demo) they progress by processor sharing: with A actors
  decoding on C cores each runs at min(1, C / (A * threads)) of full speed;
* a trainer step takes `TrainingTimeModel.step_seconds(tokens, sequences) + publish_seconds()`; its snapshot is
  announced to every GU when it ends (in sync mode the next round starts then, and every actor reloads first).
  Where the trainer shares the actors' cores (``Resources.trainer_threads`` > 0, `asp.sim.sharing`) a step is one
  more sharer: demand = threads of the decoding actors + the trainer's while it trains, everyone at
  min(1, C / demand) of full speed; with a measured `asp.sim.sharing.ContentionTable` (``Resources.contention``)
  the actors' and the step's rates are the table's instead;
* the Control Unit's loop runs after every event and at least every ``poll_timeout_s`` (as `ray.wait` does).
With partial rollouts (``settings.partial``) a minibatch decodes at most the token budget per response (the call's
time from the capped lengths) and a continuation item decodes its rows' next segments as R prompts of one sample
whose context (prompt + tokens so far) is prefilled again; what is held, pooled and handed out next is the core's.
The GU's coalescing of millisecond minibatches and failures are not modelled (no failures happen). The
inputs and the result (`Workload`, `Resources`, `SimResult`) live in `asp.sim.inputs`; the settings are the
core's plain `asp.control.settings.ControlSettings` (the simulate stage builds them from the params).

    from asp.sim.engine import Resources, Workload, simulate
    result = simulate(plan, workload, gen_model, train_model, settings, Resources(cores=2))
    result.metrics["runtime/summary/mean_iteration_time_s"]

Deterministic: the same inputs give the same result (ties are broken by event order). Tests: tests/sim.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from asp.control.core import ControlCore, GUSlot
from asp.control.database import Database
from asp.control.messages import GUReport, MinibatchOutput, SegmentOutput, WorkItem
from asp.control.plan import WorkPlan
from asp.control.settings import ControlSettings
from asp.rl.lag import duty_cycle
from asp.sim.inputs import Resources, SimResult, Workload

if TYPE_CHECKING:
    from asp.sim.timemodel import GenerationTimeModel, TrainingTimeModel


@dataclass(slots=True)
class _Actor:
    index: int
    gu: int
    version: int = 0
    busy: bool = False
    busy_s: float = 0.0  # decoding seconds of finished minibatches (wall, simulated)
    decoding_since: float | None = None  # start of the minibatch it decodes now
    reload_total_s: float = 0.0


@dataclass(slots=True)
class _GU:
    index: int
    actors: list[_Actor]
    queue: deque = field(default_factory=deque)
    weights: int = 0  # latest announced snapshot version


@dataclass(slots=True)
class _Job:
    actor: _Actor
    item: WorkItem
    lengths: np.ndarray
    prompt_tokens: np.ndarray
    start: float
    reload_s: float
    version: int
    remaining: float = 0.0  # full-speed seconds of decoding left (processor sharing)
    decode_start: float = 0.0
    final: np.ndarray | None = None  # partial rollouts: realized final lengths of what `lengths` generates now


class _Sim:
    """One simulation; `simulate` is the entry point."""

    def __init__(
        self,
        plan: WorkPlan,
        workload: Workload,
        gen: GenerationTimeModel,
        train: TrainingTimeModel,
        cfg: ControlSettings,
        res: Resources,
        record_events: bool = False,
    ) -> None:
        self.workload, self.gen, self.train, self.cfg, self.res = workload, gen, train, cfg, res
        epochs = 1 if cfg.iterations is None else None
        db = Database(plan, _NoTexts(), epochs=epochs, max_attempts=cfg.max_attempts, seed=cfg.seed)
        ids = itertools.count()
        self.gus = [
            _GU(g, [_Actor(next(ids), g) for _ in range(cfg.actors_per_unit)]) for g in range(cfg.generation_units)
        ]
        slots = [GUSlot(g.index, [a.index for a in g.actors], {a.index for a in g.actors}) for g in self.gus]
        self.core = ControlCore(cfg, db, slots, record_events=record_events, on_pause=self.on_pause)
        self.heap: list[tuple[float, int, str, Any]] = []
        self.seq = itertools.count()
        self.now = 0.0
        self.events = 0
        self.inflight: tuple[float, float] | None = None  # (duration, start) of the step being trained
        self.decoding: dict[int, _Job] = {}  # processor sharing: actor -> job
        self.train_left: float | None = None  # processor sharing: full-speed seconds left of the step in flight
        self.ps_epoch = 0
        self.ps_last = 0.0
        self.train_busy = 0.0
        self.last_tick = 0.0
        self.visits: dict[Any, int] = {}  # prompt -> first calls made of it so far (`Workload.revisits`)
        self.task_lengths: dict[int, np.ndarray] = {}  # partial rollouts: task -> its responses' final lengths

    # ---- event plumbing --------------------------------------------------------------------------------
    def push(self, at: float, kind: str, payload: Any) -> None:
        heapq.heappush(self.heap, (at, next(self.seq), kind, payload))

    def done(self) -> bool:
        return self.core.finished() or self.core.stopped()

    def run(self) -> None:
        """The Control Unit's loop: tick, then wait for the next event or `poll_timeout_s`, whichever comes first
        (as `ray.wait(..., timeout=poll_timeout_s)` does); one poll event is kept pending and moved lazily."""
        self.core.begin(0.0)
        self.cu_tick()
        self.push(self.cfg.poll_timeout_s, "poll", None)
        while not self.done():
            self.now, _, kind, payload = heapq.heappop(self.heap)
            if kind == "poll" and self.now < self.last_tick + self.cfg.poll_timeout_s:
                self.push(self.last_tick + self.cfg.poll_timeout_s, "poll", None)  # a tick happened since
                continue
            self.events += kind != "poll"
            getattr(self, f"on_{kind}")(payload)
            self.cu_tick()

    def on_poll(self, _: None) -> None:
        """The loop's timeout wake-up; the run fails like the runtime's stall check when nothing progresses."""
        self.push(self.now + self.cfg.poll_timeout_s, "poll", None)
        self.core.check_stall(self.now, f"(simulated, at {self.now:.3f} s)")

    def cu_tick(self) -> None:
        """What one pass of the Control Unit's loop does: send, then start a step if one can start."""
        self.last_tick = self.now
        if self.done():
            return
        for index, items in self.core.dispatch(self.now).items():
            self.gus[index].queue.extend(items)
            self.feed(self.gus[index])
        self.maybe_train()

    # ---- GUs -------------------------------------------------------------------------------------------
    def on_pause(self, paused: bool) -> None:
        """Backpressure changed: on resume, idle actors take queued minibatches again."""
        if not paused:
            for g in self.gus:
                self.feed(g)

    def feed(self, g: _GU) -> None:
        """Idle actors take the head of the GU's queue unless paused (lowest actor index first)."""
        for actor in g.actors:
            if self.core.bp.paused or not g.queue:
                return
            if not actor.busy:
                self.start(actor, g, g.queue.popleft())

    def start(self, actor: _Actor, g: _GU, item: WorkItem) -> None:
        lengths, prompt_tokens, final = self.job_lengths(item)
        reload_s = 0.0
        if g.weights > actor.version:
            reload_s = self.train.load_s
            actor.version = g.weights
            actor.reload_total_s += reload_s
        actor.busy = True
        job = _Job(actor, item, lengths, prompt_tokens, self.now, reload_s, actor.version, final=final)
        if reload_s > 0:
            self.push(self.now + reload_s, "decode", job)
        else:
            self.on_decode(job)

    def job_lengths(self, item: WorkItem) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """(tokens this call generates (prompts, samples), prompt tokens of the call's context (prompts,), realized
        final lengths when the call is cut by a token budget (partial rollouts), else None).

        A continuation item is R prompts of one sample each whose context is the prompt plus the tokens so far
        (prefilled again: no prefix cache is modelled)."""
        w, budget = self.workload, item.budget
        if item.is_continuation:
            index = [w.index[r.prompt_id] for r in item.rows]
            final = np.asarray([self.task_lengths[r.task_id].flat[r.sample] for r in item.rows], np.int64)
            done = np.asarray([r.generated for r in item.rows], np.int64)
            new = final - done if budget is None else np.minimum(final - done, budget)
            return new.reshape(-1, 1), w.prompt_tokens[index] + done, final.reshape(-1, 1)
        rows = [w.index[p] for p in item.prompt_ids]
        visits = [self.visits.get(p, 0) for p in item.prompt_ids]  # a task sent again is generated again
        self.visits.update((p, v + 1) for p, v in zip(item.prompt_ids, visits, strict=True))
        lengths = w.visit_lengths(rows, visits)
        if budget is None or budget >= w.max_new_tokens:
            return lengths, w.prompt_tokens[rows], None
        self.task_lengths[item.task_id] = lengths  # what its continuations go on to (row r.sample of the task)
        return np.minimum(lengths, budget), w.prompt_tokens[rows], lengths

    def on_decode(self, job: _Job) -> None:
        k, n = job.lengths.shape
        seconds = self.gen.seconds(
            prompts=k,
            n_samples=n,
            max_length=int(job.lengths.max(initial=0)),
            total_tokens=int(job.lengths.sum()),
            prompt_tokens=int(job.prompt_tokens.sum()),
        )
        job.decode_start = job.actor.decoding_since = self.now
        if self.res.cores is None:
            self.push(self.now + seconds, "done", job)
            return
        self.ps_advance()
        job.remaining = seconds
        self.decoding[job.actor.index] = job
        self.ps_schedule()

    # ---- processor sharing on shared cores -------------------------------------------------------------
    def ps_rates(self) -> tuple[float, float]:
        """(decoding actors' rate, the trainer step's rate) of full speed now (`Resources.rates`)."""
        return self.res.rates(len(self.decoding), self.train_left is not None)

    def ps_advance(self) -> None:
        (gen_rate, train_rate), dt = self.ps_rates(), self.now - self.ps_last
        for job in self.decoding.values():
            job.remaining -= dt * gen_rate
        if self.train_left is not None:
            self.train_left -= dt * train_rate
        self.ps_last = self.now

    def ps_schedule(self) -> None:
        """Plan the next completion among the sharers (decoding actors, and the trainer's step when it shares)."""
        self.ps_epoch += 1
        gen_rate, train_rate = self.ps_rates()
        job = min(self.decoding.values(), key=lambda j: (j.remaining, j.actor.index), default=None)
        job_at = None if job is None else max(job.remaining, 0.0) / gen_rate
        if self.train_left is not None and (job_at is None or max(self.train_left, 0.0) / train_rate < job_at):
            self.push(self.now + max(self.train_left, 0.0) / train_rate, "ps_done", (self.ps_epoch, None))
        elif job is not None and job_at is not None:
            self.push(self.now + job_at, "ps_done", (self.ps_epoch, job))

    def on_ps_done(self, payload: tuple[int, _Job | None]) -> None:
        epoch, job = payload
        if epoch != self.ps_epoch:
            return  # the set of sharers changed since this completion was planned
        self.ps_advance()
        if job is None:  # the trainer's step
            self.train_left = None
            self.ps_schedule()
            self.on_step(None)
            return
        del self.decoding[job.actor.index]
        self.ps_schedule()
        self.on_done(job)

    def on_done(self, job: _Job) -> None:
        actor, g = job.actor, self.gus[job.actor.gu]
        actor.busy = False
        actor.busy_s += self.now - job.decode_start
        actor.decoding_since = None
        out = _output(job, g.index, self.now, self.workload.max_new_tokens)
        if self.res.report_latency_s > 0:
            self.push(self.now + self.res.report_latency_s, "ingest", out)
        else:
            self.on_ingest(out)
        self.feed(g)

    # ---- ingestor and trainer --------------------------------------------------------------------------
    def on_ingest(self, out: MinibatchOutput | SegmentOutput) -> None:
        self.core.on_report(GUReport(gu=out.gu, outputs=[out]), self.now)  # actors never die here

    def maybe_train(self) -> None:
        batch = self.core.maybe_train(self.now)
        if batch is None:
            return
        tokens, samples = int(batch.lengths.sum()), int(batch.lengths.size)  # lengths: one per sample
        duration = self.train.step_seconds(tokens, samples) + self.train.publish_seconds()
        self.inflight = (duration, self.now)
        if self.res.trainer_shares:
            self.ps_advance()
            self.train_left = duration
            self.ps_schedule()
            return
        self.push(self.now + duration, "step", None)

    def on_step(self, _: None) -> None:
        assert self.inflight is not None  # a "step" event is pushed only with a step in flight
        full_speed, start = self.inflight
        # the modelled time: longer than full speed where the step shared the cores
        duration = self.now - start if self.res.trainer_shares else full_speed
        self.inflight = None
        self.train_busy += duration
        step = self.core.step + 1
        self.core.on_step(step, step, duration, self.now)
        for g in self.gus:
            g.weights = step

    # ---- summary ---------------------------------------------------------------------------------------
    def summary(self) -> dict[str, float]:
        metrics = self.core.summary_metrics()
        metrics.update(self.sim_metrics())
        return metrics

    def sim_metrics(self) -> dict[str, float]:
        core = self.core
        wall = core.last_step_end or 0.0
        actors = [a for g in self.gus for a in g.actors]
        lag_mean = core.lag_sum / core.lag_count if core.lag_count else float("nan")
        gen = float(np.mean([r["gen_s"] for r in core.records])) if core.records else float("nan")
        arrivals = [r["depth_at_arrival_batches"] for r in core.records]
        steps = [it["runtime/train_step_s"] for it in core.iterations]
        t_train = float(np.mean(steps)) if steps else float("nan")
        refresh = self.train.save_s + self.train.convert_s + self.train.load_s
        ongoing = [wall - a.decoding_since for a in actors if a.decoding_since is not None]
        gen_busy = sum(a.busy_s for a in actors) + sum(max(0.0, t) for t in ongoing)
        return {
            "sim/policy_lag_mean": lag_mean,
            "sim/policy_lag_max": core.lag_max,
            "sim/d_off_estimate": (float(np.mean(arrivals)) + (refresh + gen) / t_train)
            if arrivals and t_train > 0
            else float("nan"),
            "sim/duty_cycle": duty_cycle(gen_busy, sum(a.reload_total_s for a in actors)),
            "sim/generation_utilization": gen_busy / (wall * len(actors)) if wall > 0 else float("nan"),
            "sim/training_utilization": self.train_busy / wall if wall > 0 else float("nan"),
            "sim/events": float(self.events),
            "sim/simulated_s": wall,
        }


class _NoTexts(dict):
    """The Database wants prompt texts for its work items, and a text for every prompt of a new plan (a replan, a
    history-aware pass); the simulator never reads them, so every prompt has a placeholder."""

    def __contains__(self, key: object) -> bool:
        return True

    def __missing__(self, key: Any) -> str:
        return "-"


def _segment(job: _Job, gu: int, now: float, cap: int) -> SegmentOutput:
    """A continuation job's `SegmentOutput` (lengths only, as in `_output`)."""
    item, new = job.item, job.lengths.reshape(-1)
    assert job.final is not None  # a continuation job always knows its rows' final lengths
    final = job.final.reshape(-1)
    finished = np.asarray([r.generated for r in item.rows]) + new >= final
    return SegmentOutput(
        cont_id=item.task_id,
        attempt=item.attempt,
        gu=gu,
        actor=job.actor.index,
        policy_version=job.version,
        task_ids=np.asarray([r.task_id for r in item.rows], np.int64),
        samples=np.asarray([r.sample for r in item.rows], np.int64),
        lengths=new.astype(np.int32),
        finished=finished,
        stopped=finished & (final < cap),
        token_ids=np.zeros(0, np.int32),
        logprobs=np.zeros(0, np.float32),
        texts=[],
        gen_start=job.decode_start,
        gen_end=now,
        reload_s=job.reload_s,
    )


def _output(job: _Job, gu: int, now: float, cap: int) -> MinibatchOutput | SegmentOutput:
    if job.item.is_continuation:
        return _segment(job, gu, now, cap)
    item, flat = job.item, job.lengths.reshape(-1)
    finished = np.zeros(0, bool) if job.final is None else job.final.reshape(-1) <= flat
    return MinibatchOutput(
        task_id=item.task_id,
        minibatch_id=item.minibatch_id,
        attempt=item.attempt,
        gu=gu,
        actor=job.actor.index,
        policy_version=job.version,
        prompt_ids=list(item.prompt_ids),
        n=job.lengths.shape[1],
        lengths=flat,
        stopped=(flat < cap) if job.final is None else finished & (flat < cap),
        token_ids=np.zeros(0, np.int32),
        logprobs=np.zeros(0, np.float32),
        prompt_tokens=np.asarray(job.prompt_tokens, np.int32),
        texts=[],
        gen_start=job.decode_start,
        gen_end=now,
        reload_s=job.reload_s,
        finished=finished,
    )


def simulate(
    plan: WorkPlan,
    workload: Workload,
    gen: GenerationTimeModel,
    train: TrainingTimeModel,
    settings: ControlSettings,
    resources: Resources | None = None,
    *,
    record_decisions: bool = False,
) -> SimResult:
    """Simulate one run over `plan` (see the module docstring).

    Args:
        plan: the schedule in dispatch order (e.g. `asp.runtime.WorkPlan.from_frame` of a condition).
        workload: realized lengths of every scheduled prompt.
        gen, train: the time models.
        settings: the Control Unit's settings (mode, layout, batch, q_max, lag bound, iterations); the trainer
            kind and engine settings are not among them (the time models stand for them).
        resources: shared cores etc. (default: one device per actor).
        record_decisions: keep the core's decision log (`SimResult.decisions`; memory grows with the run).

    Returns:
        The `SimResult`.

    Raises:
        ValueError: a scheduled prompt has no realized lengths, or their n differs from `settings.n_samples`.
    """
    missing = [p for p in plan.prompt_ids() if p not in workload.index]
    if missing:
        raise ValueError(
            f"{len(missing)} scheduled prompts have no lengths in the workload, e.g. {missing[:3]}; the schedule "
            "does not match the predictions it was built from"
        )
    if workload.lengths.shape[1] != settings.n_samples:
        raise ValueError(
            f"workload has n={workload.lengths.shape[1]} samples per prompt, runtime.sampling.n_samples is "
            f"{settings.n_samples}"
        )
    sim = _Sim(plan, workload, gen, train, settings, resources or Resources(), record_decisions)
    sim.run()
    core = sim.core
    return SimResult(sim.summary(), core.iterations, core.records, sim.events, core.events)
