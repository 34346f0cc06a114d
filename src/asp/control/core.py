"""`ControlCore`: every decision of the Control Unit (paper appendix B.2), on whatever clock its driver keeps.

Two drivers run it: the Ray Control Unit (`asp.runtime.control`, wall clock, Ray futures) and the discrete-event
simulator (`asp.sim.engine`, simulated clock, time models). The core owns the Database, the Training Queue,
backpressure, the step counter, the sync round and the run's records; a driver owns only how work reaches the
Generation Units and how steps run. A driver calls, with its own `now` (seconds on its clock):

* `begin(now)` once at the start of the loop;
* each pass of its loop: `dispatch(now)` (work items per GU index to submit; the core counts them outstanding),
  then `maybe_train(now)` (the `GlobalBatch` to hand to the trainer, or None); then it waits for something;
* `on_report(report, now)` for what a Generation Unit sent back (`GUReport`: completed minibatches, failures, dead
  actors); False means the GU has no live actor left and the driver calls `lose_gu(index, reason)`;
* `on_step(step, version, duration_s, now, metrics)` when the step in flight finished; it returns the iteration's
  metric dict;
* `request_stop(reason, now)` / `replan(rest, full, now)` from an observer; `check_stall(now)` on a timeout;
* `finished()` / `stopped()` to end its loop, then `summary_metrics()` for the run summary.

The core calls back `on_pause(paused)` when backpressure flips (the runtime tells its GUs; the simulator lets idle
actors start again) and `observer(out)` for every first completion. Decisions:

* **dispatch** (async): keep each live GU at ``gu_queue_target + live actors`` outstanding minibatches, whole
  dispatch units from the Database (`plan_dispatch`), nothing while backpressure pauses; **sync**: rounds of single
  minibatches up to one global batch (`plan_round`), none while a step trains;
* **lag bound**: before a batch is cut, evict queued minibatches older than ``max_policy_lag`` (`enforce_lag_bound`);
  before continuation items are handed out, held tasks whose oldest segment would be over the bound when the
  continuation came back (trainer version, plus one while a step trains) are dropped or regenerated instead
  (`_retire_stale`): no engine time on responses that cannot train. Both count prompts per length bucket
  (``runtime/summary/stale_{dropped,regenerated}_prompts_<q1..q4>``, quarters of ``max_new_tokens`` by the prompt's
  longest response so far) and the tokens they had generated (``stale_wasted_tokens``: decoded, never trained);
* **when to train, what to take**: async: a global batch once queued, the short rest at the end of a pass; sync:
  the whole queue once the round is back (`round_complete`);
* **backpressure**: the queue depth after every change (async only);
* **partial rollouts** (``settings.partial``, `asp.control.partial`): a minibatch's first output with unfinished
  responses is held by the Database; its unfinished responses are continued in continuation items (rows of several
  tasks, ordered by the online length correction or in arrival order), which go out before new minibatches and count
  as outstanding work; a task whose responses all finished enters the Training Queue whole. A lost GU's or failed
  continuation item's rows are pooled again (a task whose continuations failed ``max_attempts`` times stops the run);
* **history-aware passes** (``settings.history``, `asp.control.history`): every trained prompt's realized lengths
  (n samples, generating policy version) go into the Database's `LengthHistory` when its step finishes (so the
  checkpoint has exactly the trained ones); at each pass boundary the next pass is scheduled again on
  history-aware loads (`plan_next_pass`) and installed as a replan of the later passes, without stopping; once
  what was in flight at the boundary is trained, the part of the pass not issued yet is planned again
  (``catch_up``, a replan of the pending tasks);
* **stop / replan**: after a stop nothing new is dispatched or trained; the loop ends at a checkpoint step (when the
  driver checkpoints) once no step is in flight;
* **the run summary** (`summary_metrics`): Table 4(b) columns and counters over the whole run (earlier sessions of a
  resumed run included through the core's `asp.control.accounts.RunAccounts`, which a driver fills with `resume`
  and reads the run log's segments from with `take_segment`).

Pure: no Ray, no config, no I/O, no tracking. Tests: tests/control.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from asp.control.accounts import RunAccounts
from asp.control.database import Database, task_seed
from asp.control.history import CATCH_UP_REASON, PASS_REASON, loads_used, pass_load_taus, plan_next_pass
from asp.control.messages import ContinuationRow, GlobalBatch, GUReport, MinibatchOutput, SegmentOutput, WorkItem
from asp.control.metrics import (
    Window,
    comparison_summary,
    iteration_metrics,
    minibatch_record,
    split_share,
    summary_metrics,
)
from asp.control.partial import LENGTH_BUCKETS, prompt_buckets
from asp.control.plan import WorkPlan
from asp.control.queue import Backpressure, TrainingQueue
from asp.control.sender import GULoad, enforce_lag_bound, plan_dispatch, plan_round, round_complete
from asp.control.settings import ControlSettings
from asp.rl.lag import policy_lags

_BUCKET_KEYS = tuple(f"{kind}_{b}" for kind in ("dropped", "regenerated") for b in LENGTH_BUCKETS)
Event = tuple[float, str, int, int, int, int]  # (session time, kind, gu, actor, task id | step | version, attempt)


class RuntimeFailure(RuntimeError):
    """The run cannot continue (a minibatch failed on every attempt, all actors died, or it stalled)."""


@dataclass(slots=True)
class GUSlot:
    """The core's view of one Generation Unit: its actors, which are alive, and its outstanding minibatches."""

    index: int
    actor_ids: list[int]
    alive: set[int]
    outstanding: int = 0
    dead: bool = False


@dataclass(slots=True)
class InFlight:
    """The step being trained: per contributing task (task id, prompts taken), and each prompt's policy lag."""

    consumed: list[tuple[int, int]]
    lags: np.ndarray
    observed: tuple[list[Any], np.ndarray, np.ndarray] | None = None  # prompt ids, (B, n) lengths, (B,) versions
    used: list[tuple[int, float, float]] = field(default_factory=list)  # (pass, load balanced, realized mean)


@dataclass
class ControlCore:
    """The Control Unit's decisions and book-keeping (see the module docstring).

    Args:
        settings: the decisions' parameters.
        db: the Database of the run's plan.
        gus: one `GUSlot` per Generation Unit, index = position.
        checkpointing: whether the driver saves positions (a stop then waits for a checkpoint step).
        record_events: keep the `events` list (the simulator turns it off for long runs).
    """

    settings: ControlSettings
    db: Database
    gus: list[GUSlot]
    checkpointing: bool = False
    record_events: bool = True
    on_pause: Callable[[bool], None] | None = None
    observer: Callable[[MinibatchOutput], None] | None = None
    step: int = 0
    version: int = 0
    events: list[Event] = field(default_factory=list)

    def __post_init__(self) -> None:
        s = self.settings
        self.tq = TrainingQueue(s.global_batch_prompts, s.n_samples)
        self.bp = Backpressure(s.q_max, s.resume_depth)
        self.sync = s.sync
        self.start_step = self.step
        self.inflight: InFlight | None = None
        self.round_prompts = 0  # sync: new prompts issued in the current round
        self.stop_reason = ""
        self.iterations: list[dict[str, float]] = []  # this session's steps
        self.records: list[dict[str, Any]] = []  # this session's minibatch records
        # the whole run across sessions: prompts per GU and actor, policy lags, earlier sessions of a resumed run
        self.accounts = RunAccounts(actor_ids=[a for g in self.gus for a in g.actor_ids])
        self.tokens = self.dead_actors = self.prompts_trained = 0
        self.stale_dropped = self.stale_regenerated = self.reload_failures = 0
        self.reloads, self.reload_s = 0, 0.0  # every engine call's weight reload (a minibatch's or a continuation's)
        self.t0 = 0.0  # the session's start on the driver's clock
        self.last_progress = 0.0
        self.last_step_end: float | None = None
        self.window = Window(start=0.0)
        # partial rollouts: continuation items out at GUs (id -> GU index, rows) and their count
        self.cont_out: dict[int, tuple[int, list[ContinuationRow]]] = {}
        self.continuations = 0
        self.db.partials.cap = s.max_new_tokens
        self.db.partials.age_first = s.partial.oldest_first and s.max_policy_lag is not None
        self.stale_held = 0  # prompts of held tasks retired (dropped or regenerated) before continuation
        self.stale_tokens = 0  # tokens generated for prompts that were then dropped or regenerated (never trained)
        self.stale_buckets: dict[str, float] = {}  # "dropped_q1" ... "regenerated_q4" -> prompts
        self.cont_rows = s.partial.max_rows or max(len(mb) for mb in self.db.original.minibatches) * s.n_samples
        self.prior: dict[Any, float] = dict(self.db.original.predicted)  # predictions history-aware loads start from
        self.now = 0.0  # the driver's clock at the latest dispatch (stamps a pass plan made inside it)
        self.loads_used: list[tuple[int, float, float]] = []  # this session's trained prompts: pass, load, realized
        if s.history is not None:
            self.db.on_new_pass = self._next_pass

    # ---- clock -----------------------------------------------------------------------------------------
    def begin(self, now: float) -> None:
        """Start the session's clock (events are stamped from here; replans before it from the construction)."""
        self.t0 = self.last_progress = now
        self.window = Window(start=now)

    def run_time(self, t: float) -> float:
        """A time on the driver's clock as run time (seconds over the run's sessions)."""
        return t - self.t0 + self.accounts.base

    def _event(self, now: float, kind: str, gu: int = -1, actor: int = -1, ident: int = -1, attempt: int = -1) -> None:
        if self.record_events:
            self.events.append((now - self.t0, kind, gu, actor, ident, attempt))

    # ---- state -----------------------------------------------------------------------------------------
    def finished(self) -> bool:
        """The configured iterations are trained, or (one pass) every task is done and trained."""
        if self.settings.iterations is not None and self.step >= self.settings.iterations:
            return True
        return self.db.exhausted and self.tq.depth == 0 and self.inflight is None

    def at_checkpoint(self) -> bool:
        """True when the position reached can be saved with matching trainer weights: a checkpoint step, the step
        the session started from (its position is already saved), or a driver that does not checkpoint."""
        return (
            not self.checkpointing
            or self.step == self.start_step
            or self.step % self.settings.checkpoint_interval == 0
        )

    def stopped(self) -> bool:
        """A stop was requested and the run reached a point to stop at (no step in flight, at a checkpoint)."""
        return bool(self.stop_reason) and self.inflight is None and self.at_checkpoint()

    def request_stop(self, reason: str, now: float) -> bool:
        """Stop dispatching and training at the next point to stop at; the first reason is kept. True when this
        call stopped the run (False when it was stopping already)."""
        if self.stop_reason:
            return False
        self.stop_reason = reason or "stop requested"
        self._event(now, "stop", ident=self.step)
        return True

    def restore_position(self, step: int, version: int) -> None:
        """Start this session at a checkpointed position: trainer step `step` (also the session's start step) and
        policy `version`; call it before `begin`."""
        self.step = self.start_step = step
        self.version = version

    def replan(self, rest: WorkPlan | None, full: WorkPlan | None, now: float) -> int:
        """Swap the pending work for `rest` (later passes use `full`); see `Database.replan`. Returns the new
        plan version."""
        version = self.db.replan(rest, full)
        if full is not None and full.predicted:
            self.prior = dict(full.predicted)
        self._event(now, "replan", ident=version)
        return version

    def _next_pass(self) -> None:
        """History-aware passes: at a pass boundary, schedule the next pass on history-aware loads (see the module
        docstring); nothing when ``settings.history`` is off or there is nothing to go on."""
        history = self.settings.history
        if history is None or not self.db.pass_due(PASS_REASON):
            return
        plan = plan_next_pass(
            self.db.plan.prompt_ids(), self.prior, self.db.history, self.version, history, self.db.epochs_created
        )
        if plan is not None:
            version = self.db.replan(None, plan, reason=PASS_REASON)
            self._event(self.now, "pass_plan", ident=version)

    def _catch_up(self, now: float) -> None:
        """History-aware passes: once what was in flight at the newest pass boundary is trained, schedule the part
        of the pass not issued yet again on the loads the history gives now (``runtime.history.catch_up``)."""
        history = self.settings.history
        if history is None or not history.catch_up:
            return
        if not self.db.catch_up_due(PASS_REASON, CATCH_UP_REASON, min_tasks=history.spec.k):
            return
        pass_index = self.db.epochs_created - 1
        prompts = self.db.pending_prompts()
        plan = plan_next_pass(prompts, self.prior, self.db.history, self.version, history, pass_index)
        if plan is not None:
            version = self.db.replan(plan, None, reason=CATCH_UP_REASON)
            self._event(now, "catch_up_plan", ident=version)

    def check_stall(self, now: float, hint: str = "") -> None:
        """Raise `RuntimeFailure` when nothing arrived and no step finished for ``stall_timeout_s``."""
        idle = now - self.last_progress
        if idle > self.settings.stall_timeout_s:
            raise RuntimeFailure(
                f"no minibatch arrived and no step finished for {idle:.0f} s (runtime.control.stall_timeout_s); "
                f"pending={len(self.db.pending)} issued={self.db.n_issued} queue={self.tq.depth} prompts "
                f"paused={self.bp.paused}.{' ' + hint if hint else ''}"
            )

    # ---- sender ----------------------------------------------------------------------------------------
    def dispatch(self, now: float) -> dict[int, list[WorkItem]]:
        """The work items to submit now, per GU index (in order); empty when stopped, paused (async) or while a
        step trains (sync)."""
        if self.stopped():
            return {}
        self.now = now
        live = [g for g in self.gus if not g.dead]
        if self.sync:
            if self.inflight is not None:
                return {}
            loads = [GULoad(g.index, g.outstanding, len(g.alive)) for g in live]
            batches, issued = plan_round(self.db, loads, self.settings.global_batch_prompts - self.round_prompts)
            self.round_prompts += issued
        else:
            self._retire_stale(now)
            if self.bp.paused:
                return {}
            loads = [GULoad(g.index, g.outstanding, self.settings.gu_queue_target + len(g.alive)) for g in live]
            batches = self._plan_continuations(loads)
            for index, items in plan_dispatch(self.db, loads).items():
                batches.setdefault(index, []).extend(self._with_budget(it) for it in items)
        for g, load in zip(live, loads, strict=True):
            g.outstanding = load.outstanding
        for index, items in batches.items():
            for it in items:
                self._event(now, "send", index, -1, it.task_id, it.attempt)
        return batches

    def _with_budget(self, item: WorkItem) -> WorkItem:
        item.budget = self.settings.partial.budget
        return item

    def _plan_continuations(self, loads: list[GULoad]) -> dict[int, list[WorkItem]]:
        """Partial rollouts: pooled rows as continuation items, to the GU furthest below its target, before any new
        minibatch; each item takes up to `cont_rows` rows in the configured order."""
        sent: dict[int, list[WorkItem]] = {}
        partial = self.settings.partial
        stale = self._stale  # tasks with rows still out; the others were retired by `_retire_stale`
        while loads and self.db.partials.pool:
            if partial.wait_for_full and len(self.db.partials.pool) < self.cont_rows and self.db.has_new_work:
                break
            g = min(loads, key=lambda x: x.outstanding - x.target)
            if g.outstanding >= g.target:
                break
            rows = self.db.partials.take(self.cont_rows, partial.continuation_order, self.db.prompts, stale)
            if not rows:
                break
            cont_id, self.continuations = self.continuations, self.continuations + 1
            self.cont_out[cont_id] = (g.index, rows)
            seed = task_seed(self.settings.seed, -1 - cont_id)
            sent.setdefault(g.index, []).append(WorkItem(cont_id, -1, -1, 0, [], [], seed, partial.budget, rows))
            g.outstanding += 1
        return sent

    @property
    def _stale(self) -> frozenset[int]:
        """Held tasks that could not train once a continuation handed out now came back (see `_retire_stale`)."""
        lead = int(self.inflight is not None)  # the step in flight ends before anything handed out now returns
        return frozenset(self.db.partials.stale_tasks(self.version + lead, self.settings.max_policy_lag))

    def _retire_stale(self, now: float) -> None:
        """Drop (``stale_samples: drop``) or regenerate the held tasks in `_stale` that have no rows at an actor (the
        others are retired once those rows are back; their pooled rows are not handed out meanwhile)."""
        regenerate = self.settings.stale_samples == "regenerate"
        for task_id in sorted(self._stale):
            if self.db.partials.tasks[task_id].out:
                continue
            held = self.db.retire_held(task_id, regenerate)
            prompts = len(held.head.prompt_ids)
            self._count_stale(prompt_buckets(held.lengths, held.n, self.settings.max_new_tokens), regenerate)
            self.stale_held += prompts
            self.stale_tokens += int(held.lengths.sum())
            self._event(now, "stale", held.head.gu, held.head.actor, task_id, held.head.attempt)

    def _count_stale(self, buckets: dict[str, int], regenerate: bool) -> None:
        """Add prompts per length bucket to the dropped (or regenerated) counters."""
        kind = "regenerated" if regenerate else "dropped"
        for bucket, count in buckets.items():
            self.stale_buckets[f"{kind}_{bucket}"] = self.stale_buckets.get(f"{kind}_{bucket}", 0.0) + count
        if regenerate:
            self.stale_regenerated += sum(buckets.values())
        else:
            self.stale_dropped += sum(buckets.values())

    def _update_backpressure(self, now: float) -> None:
        """Feed the queue depth to backpressure (async mode only; a sync round is bounded by itself)."""
        if not self.sync and self.bp.update(self.tq.depth):
            self._event(now, "pause" if self.bp.paused else "resume")
            if self.on_pause is not None:
                self.on_pause(self.bp.paused)

    # ---- ingestor --------------------------------------------------------------------------------------
    def on_report(self, report: GUReport, now: float) -> bool:
        """Take one GU's report: record completions (duplicates dropped) in the queue, send failures back to the
        Database, mark dead actors. Returns False when the GU has no live actor left (call `lose_gu`).

        Raises:
            RuntimeFailure: a minibatch failed ``max_attempts`` times.
        """
        g = self.gus[report.gu]
        for out in report.outputs:
            g.outstanding -= 1
            if out.reload_s > 0:  # the engine's time, even for a duplicate
                self.reloads += 1
                self.reload_s += out.reload_s
            if isinstance(out, SegmentOutput):
                self._ingest_segment(out, now)
            elif not out.complete:
                self._hold(out, now)
            else:
                self._ingest(out, now)
        for fail in report.failures:
            g.outstanding -= 1
            if fail.continuation:
                self._continuation_failed(fail.task_id, fail.reason, now)
                continue
            self._event(now, "fail", g.index, fail.actor, fail.task_id, fail.attempt)
            if not self.db.fail(fail.task_id, fail.attempt, fail.reason):
                raise RuntimeFailure(
                    f"minibatch task {fail.task_id} failed {self.settings.max_attempts} times "
                    f"(runtime.control.max_attempts); last error: {fail.reason}"
                )
        for actor in report.dead_actors:
            g.alive.discard(actor)
            self.dead_actors += 1
        return bool(g.alive)

    def _ingest(self, out: MinibatchOutput, now: float) -> None:
        if not self.db.complete(out.task_id):
            self._event(now, "dup", out.gu, out.actor, out.task_id, out.attempt)
            return
        self.last_progress = now
        before = self.tq.put(out, now)
        depth_batches = before / self.settings.global_batch_prompts
        self.window.add(out, depth_batches)
        self.accounts.count_prompts(out.gu, out.actor, out.num_prompts)
        self.tokens += out.total_tokens
        self.reload_failures += bool(out.reload_error)
        self._event(now, "recv", out.gu, out.actor, out.task_id, out.attempt)
        version = self.db.plan_version(out.task_id)
        record = minibatch_record(out, self.run_time(now), depth_batches, self.t0 - self.accounts.base, version)
        self.records.append({**record, "session": self.accounts.session})
        self._update_backpressure(now)
        if self.observer is not None:
            self.observer(out)

    def _hold(self, out: MinibatchOutput, now: float) -> None:
        """A minibatch's first output with unfinished responses: held until all of them finished."""
        if not self.db.hold(out):
            self._event(now, "dup", out.gu, out.actor, out.task_id, out.attempt)
            return
        self.last_progress = now
        self._event(now, "hold", out.gu, out.actor, out.task_id, out.attempt)

    def _ingest_segment(self, seg: SegmentOutput, now: float) -> None:
        """A continuation item came back: merge it; every task it completed enters the queue."""
        if self.cont_out.pop(seg.cont_id, None) is None:
            self.db.duplicates += 1
            return
        self.last_progress = now
        self.reload_failures += bool(seg.reload_error)
        self._event(now, "segment", seg.gu, seg.actor, seg.cont_id, seg.attempt)
        for out in self.db.partials.merge(seg):
            self._ingest(out, now)

    def _continuation_failed(self, cont_id: int, reason: str, now: float) -> None:
        sent = self.cont_out.pop(cont_id, None)
        if sent is None:
            return
        self.db.failed_attempts += 1
        self._event(now, "fail", sent[0], -1, cont_id, -1)
        if self.db.partials.release(sent[1], failed=True) >= self.settings.max_attempts:
            raise RuntimeFailure(
                f"continuing partial responses failed {self.settings.max_attempts} times "
                f"(runtime.control.max_attempts); last error: {reason}"
            )

    def lose_gu(self, index: int, reason: str) -> None:
        """GU `index` is gone: its issued tasks go back to the Database for re-issue.

        Raises:
            RuntimeFailure: a task used its last attempt, or no GU is left.
        """
        g = self.gus[index]
        g.dead = True
        for cont_id in [c for c, (gu, _) in self.cont_out.items() if gu == index]:
            self.db.partials.release(self.cont_out.pop(cont_id)[1], failed=False)
        for task in self.db.issued_to(index):
            if not self.db.fail(task.task_id, task.attempt, reason):
                raise RuntimeFailure(f"minibatch task {task.task_id} failed on every attempt; last error: {reason}")
        if all(x.dead for x in self.gus):
            raise RuntimeFailure(f"no generation unit is left: {reason}")

    # ---- training --------------------------------------------------------------------------------------
    def maybe_train(self, now: float) -> GlobalBatch | None:
        """The batch of the next step, or None when no step can start (one in flight, stopped, finished, or not
        enough queued). The lag bound is enforced first."""
        if self.inflight is not None or self.stopped() or self.finished():
            return None
        s = self.settings
        evicted = self._evicted_buckets()
        dropped, regenerated = enforce_lag_bound(
            self.tq, self.db, self.version, s.max_policy_lag, s.stale_samples, now
        )
        if dropped or regenerated:
            self._count_stale(evicted, regenerate=bool(regenerated))
        self._update_backpressure(now)
        take = self._round_take() if self.sync else self._async_take()
        if take <= 0:
            return None
        batch, consumed = self.tq.take(self.step + 1, now, take)
        lags = policy_lags(self.version, batch.versions)
        self.inflight = InFlight(consumed, lags, _observed(batch, s), loads_used(self.db, batch))
        self._event(now, "train", ident=self.step + 1)
        self._update_backpressure(now)
        return batch

    def _evicted_buckets(self) -> dict[str, int]:
        """Prompts per length bucket of what `enforce_lag_bound` is about to evict (its untaken prompts); their
        tokens are added to the wasted tokens."""
        bound, cap = self.settings.max_policy_lag, self.settings.max_new_tokens
        counts: dict[str, int] = {}
        if bound is None:
            return counts
        for e in self.tq.entries:
            if e.out.policy_version < self.version - bound:
                for b, c in prompt_buckets(e.out.lengths, e.out.n, cap, first=e.taken).items():
                    counts[b] = counts.get(b, 0) + c
                self.stale_tokens += int(e.out.lengths[e.taken * e.out.n :].sum())
        return counts

    def _async_take(self) -> int:
        """Prompts the next step takes: a global batch once queued, the short rest at the end of a pass, else 0."""
        if self.tq.ready():
            return self.settings.global_batch_prompts
        return self.tq.depth if self.db.exhausted else 0  # the last, short batch of a single pass

    def _round_take(self) -> int:
        """Sync mode: the whole queue once the round is complete (all of it from the current policy), else 0."""
        if not round_complete(self.db, self.round_prompts, self.settings.global_batch_prompts):
            return 0
        self.round_prompts = 0  # the next round is issued once this step has finished
        return self.tq.depth

    def on_step(
        self, step: int, version: int, duration_s: float, now: float, metrics: dict[str, float] | None = None
    ) -> dict[str, float]:
        """The step in flight finished at `now` (trainer step `step`, policy `version`, `duration_s` inside the
        trainer): its prompts count as trained; returns the iteration's metric dict (`metrics` added last)."""
        inflight, self.inflight = self.inflight, None
        if inflight is None:
            raise RuntimeError("on_step without a step in flight")
        for task_id, count in inflight.consumed:
            self.db.mark_consumed(task_id, count)
            self.prompts_trained += count
        if inflight.observed is not None:
            self.db.history.add(*inflight.observed)
            self._catch_up(now)
        self.loads_used.extend(inflight.used)
        self.step, self.version = step, version
        self.last_progress = self.last_step_end = now
        self._event(now, "trained", ident=step)
        self.accounts.count_lags(inflight.lags)
        out = iteration_metrics(
            self.window,
            now,
            queue_depth=self.tq.depth,
            n_samples=self.settings.n_samples,
            actor_ids=sorted(self.accounts.by_actor),
            prompts_by_gu=dict(self.accounts.by_gu),
            prompts_by_actor=self.accounts.by_actor,
            lags=inflight.lags,
            paused=self.bp.paused,
        )
        out["runtime/train_step_s"] = duration_s
        out["runtime/policy_version"] = float(version)
        out.update(self.lag_counters())
        out.update(metrics or {})
        self.window = Window(start=now)
        self.iterations.append({"step": step, **out})
        return out

    # ---- whole-run counters and the summary ------------------------------------------------------------
    @property
    def lag_sum(self) -> float:
        """The policy lags of this session's trained prompts, summed."""
        return self.accounts.lag_sum

    @property
    def lag_count(self) -> int:
        """This session's trained prompts with a policy lag."""
        return self.accounts.lag_count

    @property
    def lag_max(self) -> float:
        """The largest policy lag of a trained prompt over the whole run (NaN before any)."""
        return self.accounts.lag_max

    def resume(
        self,
        totals: Mapping[str, float],
        records: list[dict[str, Any]],
        iterations: list[dict[str, Any]],
        trace: list[tuple[float, float]],
    ) -> None:
        """Continue a run whose earlier sessions the run log describes at the restored position (see
        `asp.control.accounts.RunAccounts.resume`); call it before `begin`."""
        self.accounts.resume(totals, records, iterations, trace)

    def take_segment(self) -> dict[str, Any]:
        """What the run log's next segment holds from the core: the session number, this session's minibatch
        records and queue-depth changes (run time) since the previous segment, and the whole run's counters."""
        records, trace = self.accounts.take_segment(self.records, self.tq.trace)
        return {
            "session": self.accounts.session,
            "records": records,
            "trace": [(self.run_time(t), d) for t, d in trace],
            "totals": self.totals(),
        }

    def total(self, name: str, session_value: float) -> float:
        """A counter over the whole run: the earlier sessions' (at the resumed position) plus this session's."""
        return self.accounts.total(name, session_value)

    def totals(self) -> dict[str, float]:
        """The run's cumulative counters (earlier sessions up to the resumed position, plus this one)."""
        session_wall = self.last_step_end - self.t0 if self.last_step_end is not None else 0.0
        counters = {
            "prompts_trained": self.prompts_trained,
            "failed_attempts": self.db.failed_attempts,
            "duplicates": self.db.duplicates,
            "pauses": self.bp.pauses,
            "dead_actors": self.dead_actors,
            "stale_dropped": self.stale_dropped,
            "stale_regenerated": self.stale_regenerated,
            "reload_failures": self.reload_failures,
            "reloads": self.reloads,
            "reload_s": self.reload_s,
            "lag_sum": self.lag_sum,
            "lag_count": self.lag_count,
            "continuations": self.continuations,
            "stale_held": self.stale_held,
            "stale_tokens": self.stale_tokens,
            **{f"stale_{k}": self.stale_buckets.get(k, 0.0) for k in _BUCKET_KEYS},
        }
        out = {name: self.total(name, value) for name, value in counters.items()}
        a = self.accounts
        out.update(sessions=float(a.session + 1), wall_s=a.base + session_wall, lag_max=a.lag_max)
        return out

    def lag_counters(self) -> dict[str, float]:
        """The stale-sample and reload counters of the per-iteration metrics, cumulative over the whole run."""
        return {
            "runtime/stale_dropped_prompts": self.total("stale_dropped", self.stale_dropped),
            "runtime/stale_regenerated_prompts": self.total("stale_regenerated", self.stale_regenerated),
            "runtime/reload_failures": self.total("reload_failures", self.reload_failures),
            "runtime/stale_held_prompts": self.total("stale_held", self.stale_held),
            "runtime/stale_wasted_tokens": self.total("stale_tokens", self.stale_tokens),
            **{
                f"runtime/stale_{k.replace('_q', '_prompts_q')}": self.total(
                    f"stale_{k}", self.stale_buckets.get(k, 0)
                )
                for k in _BUCKET_KEYS
            },
        }

    def _bucket(self, key: str) -> float:
        return self.stale_buckets.get(key, 0.0)

    def all_records(self) -> list[dict[str, Any]]:
        """The whole run's minibatch records (earlier sessions first)."""
        return self.accounts.all_records(self.records)

    def all_iterations(self) -> list[dict[str, Any]]:
        """The whole run's steps (earlier sessions first)."""
        return self.accounts.all_iterations(self.iterations)

    def summary_metrics(self) -> dict[str, float]:
        """The run summary, ``runtime/summary/...`` (Table 4(b) columns first), over the whole run."""
        counts = self.totals()
        wall = counts["wall_s"]
        records, iterations = self.all_records(), self.all_iterations()
        trace = self.accounts.all_trace([(self.run_time(t), d) for t, d in self.tq.trace])
        base = summary_metrics(
            [it["runtime/iteration_time_s"] for it in iterations],
            trace,
            [r["depth_at_arrival_batches"] for r in records],
            [r["gen_s"] for r in records],
            [r["padding_rate"] for r in records],
            self.accounts.by_actor,
            n_samples=self.settings.n_samples,
            tokens=sum(int(r["tokens"]) for r in records),
            wall_s=wall,
            end=self.run_time(self.last_step_end) if self.last_step_end is not None else None,
        )
        base.update(
            {
                "runtime/minibatches": float(len(records)),
                "runtime/prompts_trained": counts["prompts_trained"],
                "runtime/failed_attempts": counts["failed_attempts"],
                "runtime/duplicates_dropped": counts["duplicates"],
                "runtime/pauses": counts["pauses"],
                "runtime/dead_actors": counts["dead_actors"],
                "runtime/continuations": counts["continuations"],
                "runtime/split_response_share": split_share(records),
                "runtime/history_passes": float(sum(r.get("reason") == PASS_REASON for r in self.db.replans)),
                "runtime/history_catch_ups": float(sum(r.get("reason") == CATCH_UP_REASON for r in self.db.replans)),
                **{f"runtime/{k}": v for k, v in pass_load_taus(self.loads_used).items()},
                **self.lag_counters(),
                **comparison_summary(
                    records,
                    [it["runtime/train_step_s"] for it in iterations],
                    (counts["lag_sum"], int(counts["lag_count"]), self.lag_max),
                    (counts["reloads"], counts["reload_s"]),
                    actors=len(self.accounts.by_actor),
                    wall_s=wall,
                    sync=self.sync,
                ),
            }
        )
        return {k.replace("runtime/", "runtime/summary/", 1): v for k, v in base.items()}


def _observed(batch: GlobalBatch, settings: ControlSettings) -> tuple[list[Any], np.ndarray, np.ndarray] | None:
    """What a trained batch adds to the length history (None when ``settings.history`` is off)."""
    if settings.history is None or not batch.num_prompts:
        return None
    lengths = np.asarray(batch.lengths).reshape(batch.num_prompts, -1)
    return list(batch.prompt_ids), lengths, np.asarray(batch.versions)
