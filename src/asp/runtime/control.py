"""The Control Unit (paper appendix B.2): Generation Sender, Ingestor and the training loop, in the driver.

Every decision (what to send where, backpressure, the lag bound, when to train and what to take, sync rounds,
stop / replan, the run summary) is `asp.control.core.ControlCore`'s, which the simulator `asp.sim` drives too;
this module is its Ray driver: Ray futures, the wall clock, weight broadcasts, checkpoints and the logger.

One single-threaded event loop, co-located with the Training Queue (so backpressure reads the depth
directly) and the only place that logs:

* **Sender** keeps each GU's outstanding work at ``gu_queue_target + live actors`` minibatches, handing out
  whole batch groups (retries first) to the least-loaded GU (`asp.control.sender.plan_dispatch`), unless
  backpressure pauses it; pause/resume and new weight snapshots are broadcast to the GUs.
* **Ingestor** takes each GU's batched report: completed minibatches are recorded once in the Database
  (duplicates dropped) and put in the Training Queue, recording depth at arrival and send/receive events;
  failures go back to the Database for re-issue; a GU whose actors all died (or whose node was lost) has its work
  re-issued to the others; with none left the run fails (`RuntimeFailure`) and resumes from its checkpoint.
* **Training** hands one global batch at a time to the Training Unit actor; each finished step produces
  the iteration's metric dict, marks its prompts trained, and is checkpointed every interval. A Training Unit that
  dies (its node lost) fails the run with `RuntimeFailure`; a rerun resumes from the last checkpoint.

**Synchronous mode** (``runtime.mode: sync``, the baseline of the paper's Table 3): rounds of single minibatches
(`asp.control.sender.plan_round`) up to one global batch, none while a step trains; once the whole round is back
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
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import ray

from asp.control.core import ControlCore, GUSlot, RuntimeFailure
from asp.control.database import Database
from asp.control.history import PASS_REASON
from asp.control.messages import GUReport, MinibatchOutput, StepResult, WeightUpdate
from asp.control.metrics import RunSummary
from asp.control.plan import WorkPlan
from asp.runtime.checkpoint import Checkpointer
from asp.runtime.config import RuntimeConfig
from asp.runtime.runlog import RunHistory, RunLog
from asp.runtime.testhooks import hold_continuation, kill_point

log = logging.getLogger(__name__)

__all__ = ["ControlUnit", "GUState", "RunSummary", "RuntimeFailure"]


def death_cause(exc: BaseException) -> str:
    """Why a Ray actor is gone, in one line: its node died (with the node id), it became unreachable, or Ray's first
    lines about it."""
    if isinstance(exc, ray.exceptions.ActorUnavailableError):
        return "unreachable: the connection to it was lost, as when its process or node goes down"
    text = str(exc)
    if "node" in text.lower() and ("died" in text.lower() or "dead" in text.lower()):
        node = next((w for w in text.replace(",", " ").replace(".", " ").split() if len(w) == 56), None)
        return f"its node {node[:12]}... died" if node else "its node died"
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return " ".join(lines[:2])[:300] if lines else type(exc).__name__


@dataclass(slots=True)
class GUState:
    """The Ray side of one Generation Unit; the core's `GUSlot` of the same index keeps its live actors (the same
    `alive` set), outstanding work and whether it is lost."""

    index: int
    handle: Any
    actor_ids: list[int]
    alive: set[int]
    collect_ref: Any = None
    submits: int = 0  # submit calls sent (their sequence numbers: `GenerationUnit.submit`)
    pauses: int = 0  # set_paused calls sent (likewise)

    def submit(self, items: list[Any]) -> None:
        """Send minibatches to the GU, numbered so that it queues them in the order sent."""
        self.handle.submit.remote(items, self.submits)
        self.submits += 1

    def set_paused(self, paused: bool) -> None:
        """Pause or resume the GU, numbered so that an overtaken call cannot undo a newer one."""
        self.handle.set_paused.remote(paused, self.pauses)
        self.pauses += 1


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
    trainer_state: dict[str, Any] = field(default_factory=dict)
    actor_handles: dict[int, Any] = field(default_factory=dict)
    observer: Callable[[ControlUnit, MinibatchOutput], None] | None = None  # sees every first completion
    runlog: RunLog | None = None  # the run's log beside the checkpoint (`asp.runtime.runlog`)

    def __post_init__(self) -> None:
        slots = [GUSlot(g.index, list(g.actor_ids), g.alive) for g in self.gus]
        self.core = ControlCore(
            self.config.control_settings(),
            self.db,
            slots,
            checkpointing=self.checkpointer is not None,
            on_pause=self._set_paused,
            observer=self._observe,
        )
        self.core.begin(time.time())  # reset by run(); replans before it (on_start) are stamped from here
        self.inflight_ref: Any = None
        self.unlogged: list[tuple[int, dict[str, float]]] = []  # (step, metrics) awaiting the next checkpoint
        self.warned_unpublished = False
        self.resume_reason = ""
        self.gate = hold_continuation() and self.checkpointer is not None  # test hook (asp.runtime.testhooks)
        self.withheld: tuple[int, Any] | None = None  # (GU index, continuation item) the gate keeps back
        self.passes_saved: set[int] = set()  # passes whose history-aware plan a checkpoint holds (kill point pass@)

    # ---- the position, which lives in the core (`restore_position` sets it, observers read it) ----------------
    @property
    def step(self) -> int:
        return self.core.step

    @property
    def version(self) -> int:
        return self.core.version

    @property
    def start_step(self) -> int:
        return self.core.start_step

    def restore_position(self, step: int, version: int) -> None:
        """Start this session at a checkpointed position (see `ControlCore.restore_position`)."""
        self.core.restore_position(step, version)

    @property
    def t0(self) -> float:
        """The session's start (time.time()); events are stamped from it."""
        return self.core.t0

    @property
    def stop_reason(self) -> str:
        return self.core.stop_reason

    @property
    def sync(self) -> bool:
        return self.core.sync

    # ---- the whole run across sessions (the core's `asp.control.accounts.RunAccounts`) ------------------------
    def resume_history(self, history: RunHistory) -> None:
        """Continue the run `history` describes (from the run log at the restored position): its counters,
        records, queue trace and steps go to the core; the steps whose metrics a kill kept from the logger are
        logged now."""
        self.core.resume(history.totals, history.records, history.iterations, history.trace)
        if self.logger is not None:
            for step, metrics in history.unlogged:
                self.logger.log_metrics(metrics, step=step)
        if history.unlogged and self.runlog is not None:
            self.runlog.mark("logged", self.step)

    def _segment(self, finished: bool) -> dict[str, Any]:
        """The run-log line written before the position of the current step is saved (`asp.runtime.runlog`)."""
        part = self.core.take_segment()
        entry: dict[str, Any] = {
            "kind": "segment",
            "step": self.step,
            "session": part["session"],
            "iterations": [{"step": step, **metrics} for step, metrics in self.unlogged],
            "records": part["records"],
            "trace": part["trace"],
            "totals": part["totals"],
        }
        if finished:
            entry["summary"] = self._summary().to_record()
        return entry

    # ---- loop ------------------------------------------------------------------------------------------
    def finished(self) -> bool:
        return self.core.finished()

    def run(self) -> RunSummary:
        """Run until the configured iterations (or the whole schedule) are trained; return the summary."""
        core = self.core
        core.begin(time.time())
        self.passes_saved = self._planned_passes()  # restored from the checkpoint: saved already
        for g in self.gus:
            g.collect_ref = g.handle.collect.remote(self.config.control.poll_timeout_s)
        while not core.finished() and not core.stopped():
            self._submit(core.dispatch(time.time()))
            self._maybe_train()
            refs = [g.collect_ref for g in self.gus if not core.gus[g.index].dead]
            refs += [self.inflight_ref] if self.inflight_ref is not None else []
            ready, _ = ray.wait(refs, num_returns=1, timeout=self.config.control.poll_timeout_s)
            for ref in ready:
                if self.inflight_ref is not None and ref == self.inflight_ref:
                    self._on_step(self._step_result(ref))
                else:
                    self._on_report(next(g for g in self.gus if g.collect_ref == ref))
            core.check_stall(time.time(), "Check the generation actors' logs.")
        if core.stop_reason and not core.finished():
            self.save_checkpoint()  # unfinished: the run resumes from here
        self.flush_metrics()  # the final checkpoint already did, unless there is none
        return self._summary()

    def request_stop(self, reason: str) -> None:
        """End the session early, at the next checkpoint: the run trains on until its step is a multiple of
        `checkpoint_interval` (where the trainer writes its own checkpoint too, so weights and position match), then
        nothing new is dispatched or trained and the loop ends with an unfinished checkpoint. A step that is
        already there (or a run without checkpoints) stops after the step in flight. The first reason is kept
        (`RunSummary.stopped`)."""
        if self.core.request_stop(reason, time.time()):
            log.warning("runtime: stopping at the next checkpoint: %s", self.core.stop_reason)

    def replan(self, rest: WorkPlan | None, full: WorkPlan | None = None) -> int:
        """Swap the pending work for `rest` (later passes use `full`); see `Database.replan`. Returns the new
        plan version."""
        return self.core.replan(rest, full, time.time())

    # ---- sender ----------------------------------------------------------------------------------------
    def _submit(self, batches: dict[int, list[Any]]) -> None:
        for index, items in batches.items():
            if self.gate and self.withheld is None:  # test hook: the first continuation waits for a checkpoint
                first = next((it for it in items if it.is_continuation), None)
                if first is not None:
                    self.withheld = (index, first)
                    items = [it for it in items if it is not first]
            if items:
                self.gus[index].submit(items)

    def _release_withheld(self) -> None:
        """Send the continuation item `hold_continuation` kept back (after the first checkpoint)."""
        self.gate = False
        if self.withheld is not None:
            index, item = self.withheld
            self.withheld = None
            if not self.core.gus[index].dead:
                self.gus[index].submit([item])

    def _set_paused(self, paused: bool) -> None:
        for g in self.gus:
            if not self.core.gus[g.index].dead:
                g.set_paused(paused)

    # ---- ingestor --------------------------------------------------------------------------------------
    def _on_report(self, g: GUState) -> None:
        try:
            report: GUReport = ray.get(g.collect_ref)
        except ray.exceptions.RayActorError as exc:
            self._gu_lost(g, f"generation unit {g.index} was lost ({death_cause(exc)})")
            return
        if not self.core.on_report(report, time.time()):
            self._gu_lost(g, f"all generation actors of unit {g.index} died")
            return
        g.collect_ref = g.handle.collect.remote(self.config.control.poll_timeout_s)

    def _observe(self, out: MinibatchOutput) -> None:
        if self.observer is not None:
            self.observer(self, out)

    def _gu_lost(self, g: GUState, reason: str) -> None:
        pending = len(self.db.issued_to(g.index))
        log.warning("runtime: %s; its %d minibatch(es) in flight go back to the Database", reason, pending)
        try:
            self.core.lose_gu(g.index, reason)
        finally:
            for handle in [g.handle, *(self.actor_handles[a] for a in g.actor_ids if a in self.actor_handles)]:
                with contextlib.suppress(Exception):
                    ray.kill(handle, no_restart=True)

    # ---- training --------------------------------------------------------------------------------------
    def _maybe_train(self) -> None:
        batch = self.core.maybe_train(time.time())
        if batch is not None:
            self.inflight_ref = self.trainer.step.remote(batch)

    def _step_result(self, ref: Any) -> StepResult:
        """The finished step, or `RuntimeFailure` naming the trainer's own error (e.g. NaN losses in a row)."""
        try:
            return ray.get(ref)
        except ray.exceptions.RayTaskError as exc:
            cause = exc.cause if getattr(exc, "cause", None) is not None else exc
            raise RuntimeFailure(
                f"the Training Unit failed at step {self.step + 1}: {type(cause).__name__}: {cause!s:.1000}"
            ) from exc
        except ray.exceptions.RayActorError as exc:  # its process or node is gone: no step can run
            lost = f"the Training Unit was lost during step {self.step + 1} ({death_cause(exc)})"
            raise RuntimeFailure(lost) from exc

    def _on_step(self, result: StepResult) -> None:
        self.inflight_ref = None
        self._warn_unpublished(result)
        self.trainer_state = dict(result.state)
        if result.weights is not None:
            self._publish(result.weights)
        metrics = self.core.on_step(result.step, result.version, result.duration_s, time.time(), result.metrics)
        self.unlogged.append((self.step, metrics))
        if self.checkpointer is None:
            self.flush_metrics()
        elif self.step % self.config.checkpoint_interval == 0 or self.finished():
            self.save_checkpoint()
        if self.on_iteration is not None:
            self.on_iteration(self, metrics)

    def _publish(self, update: WeightUpdate) -> None:
        """Announce a snapshot to every live GU; in sync mode wait until they hold it, so that the next round's
        minibatches (issued right after) are decoded with it."""
        refs = [g.handle.set_weights.remote(update) for g in self.gus if not self.core.gus[g.index].dead]
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
        for planned in sorted(self._planned_passes() - self.passes_saved):
            self.passes_saved.add(planned)
            kill_point(f"pass@{planned}")
        self._release_withheld()
        logged = bool(self.unlogged)
        self.flush_metrics()
        if logged and self.runlog is not None:
            self.runlog.mark("logged", self.step)

    def _planned_passes(self) -> set[int]:
        """The passes (1-based) the Database holds a history-aware plan of (`runtime.history`)."""
        return {int(r["epochs_created"]) + 1 for r in self.db.replans if r.get("reason") == PASS_REASON}

    def flush_metrics(self) -> None:
        """Hand the held-back iteration metrics to the logger, one call per step in step order."""
        pending, self.unlogged = self.unlogged, []
        if self.logger is not None:
            for step, metrics in pending:
                self.logger.log_metrics(metrics, step=step)

    # ---- summary ---------------------------------------------------------------------------------------
    def _summary(self) -> RunSummary:
        """The summary of the whole run: earlier sessions (from the run log) and this one."""
        core = self.core
        return RunSummary(
            metrics=core.summary_metrics(),
            iterations=core.all_iterations(),
            minibatches=core.all_records(),
            events=core.events,
            trainer_step=self.step,
            policy_version=self.version,
            resumed_from_step=self.start_step,
            resume_reason=self.resume_reason,
            finished=self.finished(),
            checkpoint_path=str(self.checkpointer.path) if self.checkpointer else None,
            stopped=self.stop_reason,
        )
