"""Discrete-event simulation of the asynchronous runtime on a simulated clock (no Ray, no sleeping).

The Control Unit's logic is the runtime's own: `asp.runtime.database.Database` (what is issued, completed,
retried), `asp.runtime.sender.plan_dispatch` (which GU gets which dispatch unit), `TrainingQueue` and
`Backpressure` (global batches, depth at arrival, pause/resume), `enforce_lag_bound` (max_policy_lag) and
`asp.runtime.metrics` (the iteration and summary metrics, under the same ``runtime/...`` names as a real
run). What the simulator adds is what Ray and the engines do in a real run:

* a Generation Unit is a FIFO input queue whose idle actors each take the head minibatch unless paused
  (as `asp.runtime.generation.GenerationUnit`); an actor holding older weights than the last announced
  snapshot first reloads (T_load, deferred reload), then decodes;
* decoding takes `GenerationTimeModel.seconds` of the minibatch's realized lengths (`Workload`); when the
  actors share CPU cores (`Resources.cores`, the CPU demo) they progress by processor sharing: with A actors
  decoding on C cores each runs at min(1, C / (A * threads)) of full speed;
* a trainer step takes `TrainingTimeModel.step_seconds(tokens) + publish_seconds()`; its snapshot is
  announced to every GU when it ends.
The GU's coalescing of millisecond minibatches and failures are not modelled (no failures happen). The
inputs and the result (`Workload`, `Resources`, `SimResult`) live in `asp.sim.inputs`.

    from asp.sim.engine import Resources, Workload, simulate
    result = simulate(plan, workload, gen_model, train_model, RuntimeConfig(...), Resources(cores=2))
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

from asp.rl.lag import duty_cycle, lag_stats, policy_lags
from asp.runtime.config import RuntimeConfig
from asp.runtime.database import Database
from asp.runtime.messages import MinibatchOutput, WorkItem
from asp.runtime.metrics import Window, iteration_metrics, minibatch_record, summary_metrics
from asp.runtime.plan import WorkPlan
from asp.runtime.queue import Backpressure, TrainingQueue
from asp.runtime.sender import GULoad, enforce_lag_bound, plan_dispatch
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
    outstanding: int = 0
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


class _Sim:
    """One simulation; `simulate` is the entry point."""

    def __init__(
        self,
        plan: WorkPlan,
        workload: Workload,
        gen: GenerationTimeModel,
        train: TrainingTimeModel,
        cfg: RuntimeConfig,
        res: Resources,
    ) -> None:
        self.workload, self.gen, self.train, self.cfg, self.res = workload, gen, train, cfg, res
        epochs = 1 if cfg.iterations is None else None
        self.db = Database(plan, _NoTexts(), epochs=epochs, max_attempts=cfg.max_attempts, seed=cfg.seed)
        self.tq = TrainingQueue(cfg.global_batch_prompts, cfg.n_samples)
        self.bp = Backpressure(cfg.q_max, cfg.resume_depth)
        ids = itertools.count()
        self.gus = [
            _GU(g, [_Actor(next(ids), g) for _ in range(cfg.actors_per_unit)]) for g in range(cfg.generation_units)
        ]
        self.heap: list[tuple[float, int, str, Any]] = []
        self.seq = itertools.count()
        self.now = 0.0
        self.events = 0
        self.step = self.version = 0
        self.inflight: tuple[list[tuple[int, int]], np.ndarray, float, float] | None = None
        self.decoding: dict[int, _Job] = {}  # processor sharing: actor -> job
        self.ps_epoch = 0
        self.ps_last = 0.0
        self.window = Window(start=0.0)
        self.iterations: list[dict[str, float]] = []
        self.records: list[dict[str, Any]] = []
        self.iter_times: list[float] = []
        self.by_gu: dict[int, int] = {}
        self.by_actor: dict[int, int] = {a.index: 0 for g in self.gus for a in g.actors}
        self.tokens = self.prompts_trained = self.stale_dropped = self.stale_regenerated = 0
        self.train_busy = 0.0
        self.lags: list[np.ndarray] = []
        self.last_step_end = 0.0
        self.last_tick = self.last_progress = 0.0

    # ---- event plumbing --------------------------------------------------------------------------------
    def push(self, at: float, kind: str, payload: Any) -> None:
        heapq.heappush(self.heap, (at, next(self.seq), kind, payload))

    def run(self) -> None:
        """The Control Unit's loop: tick, then wait for the next event or `poll_timeout_s`, whichever comes first
        (as `ray.wait(..., timeout=poll_timeout_s)` does); one poll event is kept pending and moved lazily."""
        self.cu_tick()
        self.push(self.cfg.poll_timeout_s, "poll", None)
        while not self.finished():
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
        if self.now - self.last_progress > self.cfg.stall_timeout_s:
            raise RuntimeError(
                f"simulation stalled at {self.now:.3f} s: nothing generated or trained for "
                f"{self.now - self.last_progress:.0f} s (runtime.stall_timeout_s); pending={len(self.db.pending)} "
                f"issued={self.db.n_issued} queue={self.tq.depth} paused={self.bp.paused}"
            )

    def finished(self) -> bool:
        if self.cfg.iterations is not None and self.step >= self.cfg.iterations:
            return True
        return self.db.exhausted and self.tq.depth == 0 and self.inflight is None

    def cu_tick(self) -> None:
        """What one pass of the Control Unit's loop does: send, then start a step if one can start."""
        self.last_tick = self.now
        if self.finished():
            return
        self.dispatch()
        self.maybe_train()

    # ---- sender and GUs --------------------------------------------------------------------------------
    def dispatch(self) -> None:
        if self.bp.paused:
            return
        loads = [GULoad(g.index, g.outstanding, self.cfg.gu_queue_target + len(g.actors)) for g in self.gus]
        sent = plan_dispatch(self.db, loads)
        for g, load in zip(self.gus, loads, strict=True):
            g.outstanding = load.outstanding
        for index, items in sent.items():
            self.gus[index].queue.extend(items)
            self.feed(self.gus[index])

    def feed(self, g: _GU) -> None:
        """Idle actors take the head of the GU's queue unless paused (lowest actor index first)."""
        for actor in g.actors:
            if self.bp.paused or not g.queue:
                return
            if not actor.busy:
                self.start(actor, g, g.queue.popleft())

    def start(self, actor: _Actor, g: _GU, item: WorkItem) -> None:
        rows = [self.workload.index[p] for p in item.prompt_ids]
        lengths = self.workload.lengths[rows]
        reload_s = 0.0
        if g.weights > actor.version:
            reload_s = self.train.load_s
            actor.version = g.weights
            actor.reload_total_s += reload_s
        actor.busy = True
        job = _Job(actor, item, lengths, self.workload.prompt_tokens[rows], self.now, reload_s, actor.version)
        if reload_s > 0:
            self.push(self.now + reload_s, "decode", job)
        else:
            self.on_decode(job)

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
    def ps_rate(self) -> float:
        demand = len(self.decoding) * self.res.threads_per_actor
        return min(1.0, self.res.cores / demand) if demand else 1.0

    def ps_advance(self) -> None:
        rate, dt = self.ps_rate(), self.now - self.ps_last
        for job in self.decoding.values():
            job.remaining -= dt * rate
        self.ps_last = self.now

    def ps_schedule(self) -> None:
        self.ps_epoch += 1
        if self.decoding:
            job = min(self.decoding.values(), key=lambda j: (j.remaining, j.actor.index))
            self.push(self.now + max(job.remaining, 0.0) / self.ps_rate(), "ps_done", (self.ps_epoch, job))

    def on_ps_done(self, payload: tuple[int, _Job]) -> None:
        epoch, job = payload
        if epoch != self.ps_epoch:
            return  # the set of decoding actors changed since this completion was planned
        self.ps_advance()
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

    # ---- ingestor --------------------------------------------------------------------------------------
    def on_ingest(self, out: MinibatchOutput) -> None:
        g = self.gus[out.gu]
        g.outstanding -= 1
        if not self.db.complete(out.task_id):
            return
        self.last_progress = self.now
        before = self.tq.put(out, self.now)
        depth = before / self.cfg.global_batch_prompts
        self.window.add(out, depth)
        self.by_gu[out.gu] = self.by_gu.get(out.gu, 0) + out.num_prompts
        self.by_actor[out.actor] += out.num_prompts
        self.tokens += out.total_tokens
        self.records.append(minibatch_record(out, self.now, depth, t0=0.0))
        self.update_pause()

    def update_pause(self) -> None:
        if self.bp.update(self.tq.depth) and not self.bp.paused:
            for g in self.gus:
                self.feed(g)

    # ---- trainer ---------------------------------------------------------------------------------------
    def maybe_train(self) -> None:
        if self.inflight is not None:
            return
        dropped, regenerated = enforce_lag_bound(
            self.tq, self.db, self.version, self.cfg.max_policy_lag, self.cfg.stale_samples, self.now
        )
        self.stale_dropped += dropped
        self.stale_regenerated += regenerated
        self.update_pause()
        if self.tq.ready():
            limit = None
        elif self.tq.depth and self.db.exhausted:
            limit = self.tq.depth
        else:
            return
        batch, consumed = self.tq.take(self.step + 1, self.now, limit)
        duration = self.train.step_seconds(int(batch.lengths.sum())) + self.train.publish_seconds()
        self.inflight = (consumed, policy_lags(self.version, batch.versions), duration, self.now)
        self.update_pause()
        self.push(self.now + duration, "step", None)

    def on_step(self, _: None) -> None:
        consumed, lags, duration, _start = self.inflight
        self.inflight = None
        for task_id, count in consumed:
            self.db.mark_consumed(task_id, count)
            self.prompts_trained += count
        self.step += 1
        self.version = self.step
        self.last_progress = self.now
        self.train_busy += duration
        self.lags.append(lags)
        for g in self.gus:
            g.weights = self.version
        metrics = iteration_metrics(
            self.window,
            self.now,
            queue_depth=self.tq.depth,
            n_samples=self.cfg.n_samples,
            actor_ids=sorted(self.by_actor),
            prompts_by_gu=self.by_gu,
            prompts_by_actor=self.by_actor,
            lags=lags,
            paused=self.bp.paused,
        )
        metrics["runtime/train_step_s"] = duration
        metrics["runtime/policy_version"] = float(self.version)
        self.iter_times.append(metrics["runtime/iteration_time_s"])
        self.iterations.append({"step": self.step, **metrics})
        self.window = Window(start=self.now)
        self.last_step_end = self.now

    # ---- summary ---------------------------------------------------------------------------------------
    def summary(self) -> dict[str, float]:
        base = summary_metrics(
            self.iter_times,
            self.tq.trace,
            [r["depth_at_arrival_batches"] for r in self.records],
            [r["gen_s"] for r in self.records],
            [r["padding_rate"] for r in self.records],
            self.by_actor,
            n_samples=self.cfg.n_samples,
            tokens=self.tokens,
            wall_s=self.last_step_end,
            end=self.last_step_end,
        )
        base["runtime/minibatches"] = float(len(self.records))
        base["runtime/prompts_trained"] = float(self.prompts_trained)
        base["runtime/pauses"] = float(self.bp.pauses)
        base["runtime/stale_dropped_prompts"] = float(self.stale_dropped)
        base["runtime/stale_regenerated_prompts"] = float(self.stale_regenerated)
        metrics = {k.replace("runtime/", "runtime/summary/", 1): v for k, v in base.items()}
        metrics.update(self.sim_metrics())
        return metrics

    def sim_metrics(self) -> dict[str, float]:
        wall = self.last_step_end
        actors = [a for g in self.gus for a in g.actors]
        lag_mean, lag_max = lag_stats(np.concatenate(self.lags) if self.lags else np.zeros(0))
        gen = float(np.mean([r["gen_s"] for r in self.records])) if self.records else float("nan")
        arrivals = [r["depth_at_arrival_batches"] for r in self.records]
        steps = [it["runtime/train_step_s"] for it in self.iterations]
        t_train = float(np.mean(steps)) if steps else float("nan")
        refresh = self.train.save_s + self.train.convert_s + self.train.load_s
        ongoing = [wall - a.decoding_since for a in actors if a.decoding_since is not None]
        gen_busy = sum(a.busy_s for a in actors) + sum(max(0.0, t) for t in ongoing)
        return {
            "sim/policy_lag_mean": lag_mean,
            "sim/policy_lag_max": lag_max,
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
    """The Database wants prompt texts for its work items; the simulator never reads them."""

    def __missing__(self, key: Any) -> str:
        return ""


def _output(job: _Job, gu: int, now: float, cap: int) -> MinibatchOutput:
    item, flat = job.item, job.lengths.reshape(-1)
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
        stopped=flat < cap,
        token_ids=np.zeros(0, np.int32),
        logprobs=np.zeros(0, np.float32),
        prompt_tokens=np.asarray(job.prompt_tokens, np.int32),
        texts=[],
        gen_start=job.decode_start,
        gen_end=now,
        reload_s=job.reload_s,
    )


def simulate(
    plan: WorkPlan,
    workload: Workload,
    gen: GenerationTimeModel,
    train: TrainingTimeModel,
    config: RuntimeConfig,
    resources: Resources | None = None,
) -> SimResult:
    """Simulate one run of `config` over `plan` (see the module docstring).

    Args:
        plan: the schedule in dispatch order (e.g. `asp.runtime.WorkPlan.from_frame` of a condition).
        workload: realized lengths of every scheduled prompt.
        gen, train: the time models.
        config: the runtime settings (layout, batch, q_max, lag bound, iterations); the trainer kind and
            engine settings are ignored (the time models stand for them).
        resources: shared cores etc. (default: one device per actor).

    Returns:
        The `SimResult`.

    Raises:
        ValueError: a scheduled prompt has no realized lengths, or their n differs from `config.n_samples`.
    """
    missing = [p for p in plan.prompt_ids() if p not in workload.index]
    if missing:
        raise ValueError(
            f"{len(missing)} scheduled prompts have no lengths in the workload, e.g. {missing[:3]}; the schedule "
            "does not match the predictions it was built from"
        )
    if workload.lengths.shape[1] != config.n_samples:
        raise ValueError(
            f"workload has n={workload.lengths.shape[1]} samples per prompt, runtime.n_samples is {config.n_samples}"
        )
    sim = _Sim(plan, workload, gen, train, config, resources or Resources())
    sim.run()
    return SimResult(sim.summary(), sim.iterations, sim.records, sim.events)
