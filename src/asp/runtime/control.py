"""The Control Unit (paper appendix B.2): Generation Sender, Ingestor and the training loop, in the driver.

One single-threaded event loop, co-located with the Training Queue (so backpressure reads the depth
directly) and the only place that logs:

* **Sender** keeps each GU's outstanding work at ``gu_queue_target + live actors`` minibatches, handing out
  whole batch groups (retries first) to the least-loaded GU (`asp.runtime.sender.plan_dispatch`), unless
  backpressure pauses it; pause/resume and new weight snapshots are broadcast to the GUs.
* **Ingestor** takes each GU's batched report: completed minibatches are recorded once in the Database
  (duplicates dropped) and put in the Training Queue, recording depth at arrival and send/receive events;
  failures go back to the Database for re-issue; a GU whose actors all died has its work re-issued.
* **Training** hands one global batch at a time to the Training Unit actor; each finished step produces
  the iteration's metric dict, marks its prompts trained, and is checkpointed every interval.

**Synchronous mode** (``runtime.mode: sync``, the baseline of the paper's Table 3): rounds of single minibatches
(`asp.runtime.sender.plan_round`) up to one global batch, none while a step trains; once the whole round is back
the trainer takes the whole queue (lag 0), and the snapshot reaches every GU before the next round. No
backpressure. Details: docs/runtime.md.

**Watching and steering** (drift): an `observer` sees every first completion; it may `replan` the pending work
(`Database.replan`, no pause needed: only never-issued tasks change) or `request_stop`, after which nothing new
is dispatched or trained, the loop ends once the step in flight finished and an unfinished checkpoint is
written (the queued, untrained minibatches are pending again on resume, as after a crash).

**Logging once per step.** A resumed run trains the steps after its last checkpoint again, so the iteration
metrics are held back until the checkpoint that covers them is written (and at the end of a finished run) and
only then go to the logger, in step order: steps a resume repeats were never logged, and every step reaches
the tracker exactly once. Without a checkpointer (nothing can resume) each step is logged as it finishes.

**The whole run across resumes** (`asp.runtime.runlog`): before each position is saved, the steps, minibatch records,
queue-depth changes and counters since the previous one are appended to the run log; a resumed session starts from
what the log says about its position (and logs the steps of that position whose metrics a kill kept from the logger),
so the summary, the iteration list and the minibatch records (with a ``session`` number, times in run time) cover the
whole run, not only the last session.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import ray

from asp.rl.lag import policy_lags
from asp.runtime import wholerun
from asp.runtime.checkpoint import Checkpointer
from asp.runtime.config import RuntimeConfig
from asp.runtime.database import Database
from asp.runtime.messages import GUReport, MinibatchOutput, StepResult, WeightUpdate, WorkItem
from asp.runtime.metrics import RunSummary, Window, iteration_metrics, minibatch_record
from asp.runtime.plan import WorkPlan
from asp.runtime.queue import Backpressure, TrainingQueue
from asp.runtime.runlog import RunHistory, RunLog
from asp.runtime.sender import GULoad, enforce_lag_bound, plan_dispatch, plan_round, round_complete
from asp.runtime.testhooks import kill_point

log = logging.getLogger(__name__)


class RuntimeFailure(RuntimeError):
    """The run cannot continue (a minibatch failed on every attempt, all actors died, or it stalled)."""


@dataclass(slots=True)
class GUState:
    """The Control Unit's view of one Generation Unit."""

    index: int
    handle: Any
    actor_ids: list[int]
    alive: set[int]
    outstanding: int = 0
    dead: bool = False
    collect_ref: Any = None


@dataclass(slots=True)
class _Inflight:
    ref: Any
    consumed: list[tuple[int, int]]
    lags: np.ndarray


@dataclass
class ControlUnit:
    """Driver-side Control Unit; build it with handles from `run.build_runtime` and call `run()`."""

    config: RuntimeConfig
    db: Database
    gus: list[GUState]
    trainer: Any
    logger: Any = None
    checkpointer: Checkpointer | None = None
    on_iteration: Callable[[ControlUnit, dict[str, float]], None] | None = None
    step: int = 0
    version: int = 0
    trainer_state: dict[str, Any] = field(default_factory=dict)
    actor_handles: dict[int, Any] = field(default_factory=dict)
    observer: Callable[[ControlUnit, MinibatchOutput], None] | None = None  # sees every first completion
    runlog: RunLog | None = None  # the run's log beside the checkpoint (`asp.runtime.runlog`)

    def __post_init__(self) -> None:
        cfg = self.config
        self.tq = TrainingQueue(cfg.global_batch_prompts, cfg.n_samples)
        self.bp = Backpressure(cfg.q_max, cfg.resume_depth)
        self.start_step = self.step
        self.inflight: _Inflight | None = None
        self.iterations: list[dict[str, float]] = []
        self.records: list[dict[str, Any]] = []
        self.events: list[tuple[float, str, int, int, int, int]] = []
        self.by_gu: dict[int, int] = defaultdict(int)
        self.by_actor: dict[int, int] = {a: 0 for g in self.gus for a in g.actor_ids}
        self.tokens = 0
        self.dead_actors = 0
        self.prompts_trained = 0
        self.stale_dropped = 0  # prompts removed for exceeding max_policy_lag (stale_samples = drop)
        self.stale_regenerated = 0  # prompts sent again for it (stale_samples = regenerate)
        self.reload_failures = 0  # minibatches whose actor could not load the offered snapshot
        self.last_step_end: float | None = None
        self.unlogged: list[tuple[int, dict[str, float]]] = []  # (step, metrics) awaiting the next checkpoint
        self.sync = cfg.mode == "sync"
        self.warned_unpublished = False
        self.round_prompts = 0  # sync: new prompts issued in the current round
        self.lag_sum, self.lag_count, self.lag_max = 0.0, 0, float("nan")  # over every trained prompt
        self.stop_reason = ""
        self.t0 = time.time()  # reset by run(); replans before it (on_start) are stamped from here
        self.earlier = RunHistory()  # the run before this session (`resume_history`)
        self.session = 0  # sessions of this run before this one
        self.base_wall = 0.0  # run time at the position this session resumed from
        self.resume_reason = ""
        self.flushed = (0, 0)  # records and depth-trace entries already in the run log

    # ---- the whole run (asp.runtime.wholerun) ----------------------------------------------------------------
    def resume_history(self, history: RunHistory) -> None:
        """Continue the run `history` describes (see `asp.runtime.wholerun.resume`)."""
        wholerun.resume(self, history)

    def _run_time(self, t: float) -> float:
        return wholerun.run_time(self, t)

    def _segment(self, finished: bool) -> dict[str, Any]:
        return wholerun.segment(self, finished)

    # ---- loop ------------------------------------------------------------------------------------------
    def finished(self) -> bool:
        if self.config.iterations is not None and self.step >= self.config.iterations:
            return True
        return self.db.exhausted and self.tq.depth == 0 and self.inflight is None

    def run(self) -> RunSummary:
        """Run until the configured iterations (or the whole schedule) are trained; return the summary."""
        self.t0 = self.last_progress = time.time()
        self.window = Window(start=self.t0)
        self.iter_times: list[float] = []
        for g in self.gus:
            g.collect_ref = g.handle.collect.remote(self.config.poll_timeout_s)
        while not self.finished() and not self._stopped():
            self._dispatch()
            self._maybe_train()
            refs = [g.collect_ref for g in self.gus if not g.dead]
            refs += [self.inflight.ref] if self.inflight else []
            ready, _ = ray.wait(refs, num_returns=1, timeout=self.config.poll_timeout_s)
            for ref in ready:
                if self.inflight is not None and ref == self.inflight.ref:
                    self._on_step(self._step_result(ref))
                else:
                    self._on_report(next(g for g in self.gus if g.collect_ref == ref))
            self._check_stall()
        if self.stop_reason and not self.finished():
            self.save_checkpoint()  # unfinished: the run resumes from here
        self.flush_metrics()  # the final checkpoint already did, unless there is none
        return self._summary()

    def request_stop(self, reason: str) -> None:
        """End the session early, at the next checkpoint: the run trains on until its step is a multiple of
        `checkpoint_interval` (where the trainer writes its own checkpoint too, so weights and position match), then
        nothing new is dispatched or trained and the loop ends with an unfinished checkpoint. A step that is
        already there (or a run without checkpoints) stops after the step in flight. The first reason is kept
        (`RunSummary.stopped`)."""
        if not self.stop_reason:
            self.stop_reason = reason or "stop requested"
            self.events.append((time.time() - self.t0, "stop", -1, -1, self.step, -1))
            log.warning("runtime: stopping at the next checkpoint: %s", self.stop_reason)

    def _at_checkpoint(self) -> bool:
        """True when the position reached can be saved with matching trainer weights: a checkpoint step, the step
        the session started from (its position is already saved), or no checkpointer at all."""
        return (
            self.checkpointer is None
            or self.step == self.start_step
            or self.step % self.config.checkpoint_interval == 0
        )

    def _stopped(self) -> bool:
        """A stop was requested and the run reached a point to stop at (no step in flight, at a checkpoint)."""
        return bool(self.stop_reason) and self.inflight is None and self._at_checkpoint()

    def replan(self, rest: WorkPlan | None, full: WorkPlan | None = None) -> int:
        """Swap the pending work for `rest` (later passes use `full`); see `Database.replan`. Returns the new
        plan version."""
        version = self.db.replan(rest, full)
        self.events.append((time.time() - self.t0, "replan", -1, -1, version, -1))
        return version

    def _check_stall(self) -> None:
        idle = time.time() - self.last_progress
        if idle > self.config.stall_timeout_s:
            raise RuntimeFailure(
                f"no minibatch arrived and no step finished for {idle:.0f} s (runtime.stall_timeout_s); "
                f"pending={len(self.db.pending)} issued={self.db.n_issued} queue={self.tq.depth} prompts "
                f"paused={self.bp.paused}. Check the generation actors' logs."
            )

    # ---- sender ----------------------------------------------------------------------------------------
    def _target(self, g: GUState) -> int:
        return self.config.gu_queue_target + len(g.alive)

    def _dispatch(self) -> None:
        if self._stopped():
            return
        if self.sync:
            self._dispatch_round()
            return
        if self.bp.paused:
            return
        live = [g for g in self.gus if not g.dead]
        loads = [GULoad(g.index, g.outstanding, self._target(g)) for g in live]
        batches = plan_dispatch(self.db, loads)
        self._submit(live, loads, batches)

    def _dispatch_round(self) -> None:
        """Sync mode: fill the current round (and re-issue its failures), never while a step trains."""
        if self.inflight is not None:
            return
        live = [g for g in self.gus if not g.dead]
        loads = [GULoad(g.index, g.outstanding, len(g.alive)) for g in live]
        batches, issued = plan_round(self.db, loads, self.config.global_batch_prompts - self.round_prompts)
        self.round_prompts += issued
        self._submit(live, loads, batches)

    def _submit(self, live: list[GUState], loads: list[GULoad], batches: dict[int, list[WorkItem]]) -> None:
        for g, load in zip(live, loads, strict=True):
            g.outstanding = load.outstanding
        now = time.time() - self.t0
        for index, items in batches.items():
            self.gus[index].handle.submit.remote(items)
            self.events.extend((now, "send", index, -1, it.task_id, it.attempt) for it in items)

    def _update_backpressure(self) -> None:
        """Feed the queue depth to backpressure (async mode only; a sync round is bounded by itself)."""
        if not self.sync and self.bp.update(self.tq.depth):
            self._set_paused()

    def _set_paused(self) -> None:
        kind = "pause" if self.bp.paused else "resume"
        self.events.append((time.time() - self.t0, kind, -1, -1, -1, -1))
        for g in self.gus:
            if not g.dead:
                g.handle.set_paused.remote(self.bp.paused)

    # ---- ingestor --------------------------------------------------------------------------------------
    def _on_report(self, g: GUState) -> None:
        try:
            report: GUReport = ray.get(g.collect_ref)
        except ray.exceptions.RayActorError as exc:
            self._gu_lost(g, f"generation unit {g.index} died: {exc!s:.300}")
            return
        now = time.time()
        for out in report.outputs:
            g.outstanding -= 1
            self._ingest(out, now)
        for fail in report.failures:
            g.outstanding -= 1
            self.events.append((now - self.t0, "fail", g.index, fail.actor, fail.task_id, fail.attempt))
            if not self.db.fail(fail.task_id, fail.attempt, fail.reason):
                raise RuntimeFailure(
                    f"minibatch task {fail.task_id} failed {self.config.max_attempts} times "
                    f"(runtime.max_attempts); last error: {fail.reason}"
                )
        for actor in report.dead_actors:
            g.alive.discard(actor)
            self.dead_actors += 1
        if not g.alive:
            self._gu_lost(g, f"all generation actors of unit {g.index} died")
            return
        g.collect_ref = g.handle.collect.remote(self.config.poll_timeout_s)

    def _ingest(self, out: MinibatchOutput, now: float) -> None:
        if not self.db.complete(out.task_id):
            self.events.append((now - self.t0, "dup", out.gu, out.actor, out.task_id, out.attempt))
            return
        self.last_progress = now
        before = self.tq.put(out, now)
        depth_batches = before / self.config.global_batch_prompts
        self.window.add(out, depth_batches)
        self.by_gu[out.gu] += out.num_prompts
        self.by_actor[out.actor] = self.by_actor.get(out.actor, 0) + out.num_prompts
        self.tokens += out.total_tokens
        self.reload_failures += bool(out.reload_error)
        self.events.append((now - self.t0, "recv", out.gu, out.actor, out.task_id, out.attempt))
        version = self.db.plan_version(out.task_id)
        record = minibatch_record(out, self._run_time(now), depth_batches, self.t0 - self.base_wall, version)
        self.records.append({**record, "session": self.session})
        self._update_backpressure()
        if self.observer is not None:
            self.observer(self, out)

    def _gu_lost(self, g: GUState, reason: str) -> None:
        g.dead = True
        for task in self.db.issued_to(g.index):
            if not self.db.fail(task.task_id, task.attempt, reason):
                raise RuntimeFailure(f"minibatch task {task.task_id} failed on every attempt; last error: {reason}")
        for handle in [g.handle, *(self.actor_handles[a] for a in g.actor_ids if a in self.actor_handles)]:
            with contextlib.suppress(Exception):
                ray.kill(handle, no_restart=True)
        if all(x.dead for x in self.gus):
            raise RuntimeFailure(f"no generation unit is left: {reason}")

    # ---- training --------------------------------------------------------------------------------------
    def _evict_stale(self) -> None:
        """Enforce `max_policy_lag` on what the next batch can contain (the version is fixed until it trains)."""
        cfg = self.config
        dropped, regenerated = enforce_lag_bound(
            self.tq, self.db, self.version, cfg.max_policy_lag, cfg.stale_samples, time.time()
        )
        self.stale_dropped += dropped
        self.stale_regenerated += regenerated
        self._update_backpressure()

    def _maybe_train(self) -> None:
        if self.inflight is not None or self._stopped() or self.finished():
            return
        self._evict_stale()
        take = self._round_take() if self.sync else self._async_take()
        if take <= 0:
            return
        now = time.time()
        batch, consumed = self.tq.take(self.step + 1, now, take)
        lags = policy_lags(self.version, batch.versions)
        self.inflight = _Inflight(self.trainer.step.remote(batch), consumed, lags)
        self.events.append((now - self.t0, "train", -1, -1, self.step + 1, -1))
        self._update_backpressure()

    def _async_take(self) -> int:
        """Prompts the next step takes: a global batch once queued, the short rest at the end of a pass, else 0."""
        if self.tq.ready():
            return self.config.global_batch_prompts
        return self.tq.depth if self.db.exhausted else 0  # the last, short batch of a single pass

    def _round_take(self) -> int:
        """Sync mode: the whole queue once the round is complete (all of it from the current policy), else 0."""
        if not round_complete(self.db, self.round_prompts, self.config.global_batch_prompts):
            return 0
        self.round_prompts = 0  # the next round is issued once this step has finished
        return self.tq.depth

    def _step_result(self, ref: Any) -> StepResult:
        """The finished step, or `RuntimeFailure` naming the trainer's own error (e.g. NaN losses in a row)."""
        try:
            return ray.get(ref)
        except ray.exceptions.RayTaskError as exc:
            cause = exc.cause if getattr(exc, "cause", None) is not None else exc
            raise RuntimeFailure(
                f"the Training Unit failed at step {self.step + 1}: {type(cause).__name__}: {cause!s:.1000}"
            ) from exc

    def _on_step(self, result: StepResult) -> None:
        inflight, self.inflight = self.inflight, None
        for task_id, count in inflight.consumed:
            self.db.mark_consumed(task_id, count)
            self.prompts_trained += count
        self._warn_unpublished(result)
        self.step, self.version, self.trainer_state = result.step, result.version, dict(result.state)
        if result.weights is not None:
            self._publish(result.weights)
        end = self.last_progress = self.last_step_end = time.time()
        self.events.append((end - self.t0, "trained", -1, -1, self.step, -1))
        self._count_lags(inflight.lags)
        metrics = iteration_metrics(
            self.window,
            end,
            queue_depth=self.tq.depth,
            n_samples=self.config.n_samples,
            actor_ids=sorted(self.by_actor),
            prompts_by_gu=dict(self.by_gu),
            prompts_by_actor=self.by_actor,
            lags=inflight.lags,
            paused=self.bp.paused,
        )
        metrics["runtime/train_step_s"] = result.duration_s
        metrics["runtime/policy_version"] = float(self.version)
        metrics.update(self._lag_counters())
        metrics.update(result.metrics)
        self.iter_times.append(metrics["runtime/iteration_time_s"])
        self.window = Window(start=end)
        self.unlogged.append((self.step, metrics))
        self.iterations.append({"step": self.step, **metrics})
        if self.checkpointer is None:
            self.flush_metrics()
        elif self.step % self.config.checkpoint_interval == 0 or self.finished():
            self.save_checkpoint()
        if self.on_iteration is not None:
            self.on_iteration(self, metrics)

    def _publish(self, update: WeightUpdate) -> None:
        """Announce a snapshot to every live GU; in sync mode wait until they hold it, so that the next round's
        minibatches (issued right after) are decoded with it."""
        refs = [g.handle.set_weights.remote(update) for g in self.gus if not g.dead]
        if self.sync:
            for ref in refs:
                with contextlib.suppress(ray.exceptions.RayActorError):  # a dead GU is handled by its collect
                    ray.get(ref)

    def _warn_unpublished(self, result: StepResult) -> None:
        """Sync mode expects a snapshot after every update (lag 0); say so once when the trainer skips one."""
        if self.sync and result.weights is None and result.version != self.version and not self.warned_unpublished:
            self.warned_unpublished = True
            log.warning(
                "runtime.mode sync: step %d changed the policy without publishing weights (snapshot_interval > 1?); "
                "the next round is generated by an older policy, so its lag is not 0",
                result.step,
            )

    def _count_lags(self, lags: np.ndarray) -> None:
        if lags.size:
            self.lag_sum += float(lags.sum())
            self.lag_count += int(lags.size)
            self.lag_max = float(np.nanmax([self.lag_max, float(lags.max())]))

    def save_checkpoint(self) -> None:
        """Write the run-log segment and the position reached (only trained prompts count as done), then log the
        steps it covers and note that in the run log."""
        if self.checkpointer is None:
            self.flush_metrics()
            return
        finished = self.finished()
        if self.runlog is not None:
            self.runlog.append(self._segment(finished))
        self.checkpointer.save(
            database=self.db.state(),
            trainer_step=self.step,
            policy_version=self.version,
            trainer_state=self.trainer_state,
            finished=finished,
        )
        kill_point(f"checkpoint@{self.step}")
        logged = bool(self.unlogged)
        self.flush_metrics()
        if logged and self.runlog is not None:
            self.runlog.mark("logged", self.step)

    def flush_metrics(self) -> None:
        """Hand the held-back iteration metrics to the logger, one call per step in step order."""
        pending, self.unlogged = self.unlogged, []
        if self.logger is not None:
            for step, metrics in pending:
                self.logger.log_metrics(metrics, step=step)

    # ---- summary ---------------------------------------------------------------------------------------
    def _lag_counters(self) -> dict[str, float]:
        """Cumulative over the whole run (earlier sessions included)."""
        return wholerun.lag_counters(self)

    def _summary(self) -> RunSummary:
        """The summary of the whole run: earlier sessions (from the run log) and this one."""
        return wholerun.summary(self)
