"""One scripted sequence of events through the Control Unit core as the runtime drives it and as the simulator
drives it: the same decisions.

* A script (arrivals, step completions, two dead actors of which the second loses its GU, whose work then goes to
  the other GU, and a stop) is fed to the core in the runtime's loop order (`ControlUnit.run`: a pass of the loop
  (dispatch, maybe start a step), then wait for one ready thing and take it) and in the simulator's (`_Sim.run`:
  take one event, then a pass of the loop), in async mode with backpressure and the lag bound (drop, regenerate)
  and in sync mode. Compared: what is sent where (task, attempt, GU), every trained batch (prompt ids, versions),
  arrivals, evictions, pauses, the stop point and the run's counters.
* The real simulator's own timeline (`simulate(record_decisions=True)`) is replayed through the runtime's loop order
  on the core, and through the Ray Control Unit itself (`asp.runtime.control.ControlUnit`, with a scripted stand-in
  for Ray's wait/get and the clock: real Ray cannot be made to return futures in a chosen order at chosen times),
  and gives the simulator's decision log back, event for event.

Not compared: a runtime collect that returns several completions at once is taken as one report (decisions after
the whole batch), the simulator's as single events; the script delivers one completion per report.

Run: ``.venv/bin/python -m pytest tests/control/test_drivers.py -q``
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import pytest
from ray import exceptions as ray_exceptions

import asp.runtime.control as control
from asp.control.core import ControlCore
from asp.control.database import Database
from asp.control.messages import GUReport, StepResult, WeightUpdate, WorkItem
from asp.runtime.config import RuntimeConfig
from asp.runtime.control import GUState
from asp.sim.engine import Workload, simulate

from .helpers import core, output, plan, settings

# d<g>: the oldest minibatch queued at GU g completes; s: the step in flight finishes; x<g>:<a>: actor a of GU g
# dies; stop: an observer asks to stop.
SCRIPT = tuple(
    " ".join(
        (
            "d0 d0 d1 s d1 d0 d0 s d1 d1 x1:3 d1 s d0 d0 d1 s d0 d1 d0 s d0 d0 d1 s",  # GU 1 is down to one actor
            "x1:2 d0 d0 s d0 d0 s d0 d0 d0 s d0 d0 s",  # GU 1 is lost while it holds work; GU 0 does the rest
            "stop d0 s d0 d0 s d0 s",  # stop: the step in flight ends, nothing more is sent or trained
        )
    ).split()
)


@dataclass
class Driver:
    """Holds what the Generation Units hold (their queued items) and feeds the script to the core."""

    core: ControlCore
    runtime_order: bool  # True: loop pass, then one event (ControlUnit.run); False: event, then loop pass (_Sim.run)

    def __post_init__(self) -> None:
        self.queues: dict[int, deque[tuple[WorkItem, int]]] = {g.index: deque() for g in self.core.gus}
        self.batches: list[tuple[list, list]] = []
        self.now = 0.0

    def loop_pass(self) -> None:
        """One pass of the Control Unit loop: send, then start a step if one can start."""
        if self.core.finished() or self.core.stopped():
            return
        for g, items in self.core.dispatch(self.now).items():
            self.queues[g].extend((it, self.core.version) for it in items)
        batch = self.core.maybe_train(self.now)
        if batch is not None:
            self.batches.append((list(batch.prompt_ids), batch.versions.tolist()))

    def ready(self, event: str) -> bool:
        """Whether the scripted event can happen now (its GU lives and has queued work, a step is in flight)."""
        if event == "s":
            return self.core.inflight is not None
        if event == "stop":
            return True
        g = int(event[1])
        return not self.core.gus[g].dead and (event[0] == "x" or bool(self.queues[g]))

    def take(self, event: str) -> None:
        """Hand one event to the core, as the driver's handler does."""
        c = self.core
        if event == "s":
            c.on_step(c.step + 1, c.step + 1, 0.5, self.now)
        elif event == "stop":
            c.request_stop("scripted stop", self.now)
        else:
            g, report = int(event[1]), GUReport(int(event[1]))
            if event[0] == "x":
                report.dead_actors.append(int(event.split(":")[1]))
            else:
                item, version = self.queues[g].popleft()
                report.outputs.append(output(item, g, min(c.gus[g].alive), version, self.now - 0.5, self.now))
            if not c.on_report(report, self.now):
                c.lose_gu(g, f"all generation actors of unit {g} died")
                self.queues[g].clear()  # its tasks went back to the Database

    def run(self, script: tuple[str, ...]) -> None:
        self.core.begin(0.0)
        if not self.runtime_order:
            self.loop_pass()  # _Sim.run: one pass before the first event
        for event in script:
            if self.runtime_order:
                self.loop_pass()
            self.now += 1.0
            if self.ready(event):
                self.take(event)
            if not self.runtime_order:
                self.loop_pass()
        self.loop_pass()

    def decisions(self) -> dict[str, object]:
        kinds = ("send", "recv", "train", "trained", "pause", "resume", "stop", "fail")
        by_kind = {k: [e[2:] for e in self.core.events if e[1] == k] for k in kinds}
        c = self.core
        return {
            **by_kind,
            "batches": self.batches,
            "step": c.step,
            "stopped": c.stopped(),
            "counters": (c.prompts_trained, c.dead_actors, c.stale_dropped, c.stale_regenerated, c.bp.pauses),
            "failed_attempts": c.db.failed_attempts,
            "trained": dict(sorted(c.db.trained_counts().items())),
        }


@pytest.mark.parametrize(
    "overrides",
    [
        {"mode": "async", "q_max": 4, "max_policy_lag": 1},
        {"mode": "async", "q_max": 12, "max_policy_lag": 0, "stale_samples": "regenerate"},
        {"mode": "sync"},
    ],
    ids=["async-backpressure", "async-regenerate", "sync"],
)
def test_the_runtime_and_the_simulator_make_the_same_decisions(overrides):
    s = settings(**overrides)
    runtime = Driver(core(s, plan(40, 2)), runtime_order=True)
    runtime.run(SCRIPT)
    sim = Driver(core(s, plan(40, 2)), runtime_order=False)
    sim.run(SCRIPT)
    a, b = runtime.decisions(), sim.decisions()
    assert a == b
    # the script did what it says: a GU was lost and its work re-sent, the run stopped, nothing trained twice
    assert a["counters"][1] == 2 and a["stop"] and a["stopped"] and a["step"] >= 4
    if not s.sync:  # (a sync round had filled GU 0 first: GU 1 held nothing when it was lost)
        assert a["failed_attempts"] > 0 and any(attempt > 0 for _, _, _, attempt in a["send"])  # re-sent
    assert max(a["trained"].values()) == 1
    if s.sync:  # every batch from the current policy (lag 0), no backpressure
        assert all(set(versions) == {k} for k, (_, versions) in enumerate(a["batches"]))
        assert a["counters"][4] == 0


@dataclass(frozen=True)
class FixedGen:
    s: float

    def seconds(self, prompts, n_samples, max_length, total_tokens, prompt_tokens) -> float:
        return self.s * (1 + prompts % 3)


@dataclass(frozen=True)
class FixedTrain:
    step_s: float
    load_s: float = 0.1
    save_s: float = 0.0
    convert_s: float = 0.0

    def step_seconds(self, tokens: float, samples: float = 0.0) -> float:
        return self.step_s

    def publish_seconds(self) -> float:
        return 0.0


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_the_simulators_timeline_replayed_the_runtimes_way_gives_its_decisions(mode):
    s = settings(mode=mode, generation_units=2, actors_per_unit=2, q_max=6, max_policy_lag=1)
    p = plan(20, 2, k=2)
    ids = p.prompt_ids()
    lengths = np.asarray([[3 + i, 4 + i] for i in ids])
    work = Workload.from_arrays(ids, lengths, np.full(len(ids), 5), max_new_tokens=64)
    result = simulate(p, work, FixedGen(0.7), FixedTrain(1.3), s, record_decisions=True)
    m = result.metrics
    assert m["runtime/summary/prompts_trained"] + m["runtime/summary/stale_dropped_prompts"] == len(ids)
    # replay: the simulator's completions (with the versions its actors generated with) and step ends at its
    # times, one loop pass before the first and after each (as ray.wait returns one ready thing at a time)
    versions = {(r["task_id"], r["attempt"]): r["policy_version"] for r in result.minibatches}
    replay = core(s, p)
    queued: dict[tuple[int, int], WorkItem] = {}

    def loop_pass(t: float) -> None:
        if replay.finished():
            return
        for items in replay.dispatch(t).values():
            queued.update(((it.task_id, it.attempt), it) for it in items)
        replay.maybe_train(t)

    loop_pass(0.0)
    last = 0.0
    for t, kind, gu, actor, ident, attempt in result.decisions:
        if kind == "send" and t > last:  # a pass of the loop on a wake-up without news (ray.wait's timeout)
            loop_pass(t)
        last = t
        if kind == "recv":
            item = queued.pop((ident, attempt))
            out = output(item, gu, actor, versions[ident, attempt], t - 0.5, t)
            replay.on_report(GUReport(gu, [out]), t)
        elif kind == "trained":
            replay.on_step(ident, ident, 1.3, t)
        else:
            continue
        loop_pass(t)
    assert replay.events == result.decisions
    kinds = {e[1] for e in result.decisions}
    assert {"send", "recv", "train", "trained"} <= kinds
    if mode == "async":
        assert "pause" in kinds  # backpressure acted


class ScriptedRay:
    """A stand-in for the `ray` calls of `asp.runtime.control` and for its clock, which plays a recorded timeline:
    `wait` returns the next completion (a GU's collect) or step end at its recorded time, or nothing at a recorded
    wake-up; `get` returns the matching `GUReport` / `StepResult`. Handles record what the Control Unit submits."""

    exceptions = ray_exceptions

    def __init__(self, decisions, versions, step_s: float) -> None:
        self.timeline = [e for i, e in enumerate(decisions) if e[1] in ("recv", "trained") or _wakeup(decisions, i)]
        self.versions, self.step_s, self.now = versions, step_s, 0.0
        self.submitted: dict[tuple[int, int], WorkItem] = {}
        self.results: dict[object, object] = {}

    def time(self) -> float:
        return self.now

    def handle(self, gu: int) -> SimpleNamespace:
        def submit(items, _seq):
            self.submitted.update(((it.task_id, it.attempt), it) for it in items)

        def collect(_timeout):
            return ("collect", gu)

        none = SimpleNamespace(remote=lambda *_: ("none",))
        return SimpleNamespace(
            submit=SimpleNamespace(remote=submit),
            collect=SimpleNamespace(remote=collect),
            set_paused=none,
            set_weights=none,
        )

    def trainer(self) -> SimpleNamespace:
        return SimpleNamespace(step=SimpleNamespace(remote=lambda batch: ("step", batch.step)))

    def wait(self, refs, num_returns, timeout):
        if not self.timeline:
            return [], refs
        t, kind, gu, actor, ident, attempt = self.timeline.pop(0)
        self.now = t
        if kind == "recv":
            item = self.submitted.pop((ident, attempt))
            out = output(item, gu, actor, self.versions[ident, attempt], t - 0.5, t)
            self.results[("collect", gu)] = GUReport(gu, [out])
            return [("collect", gu)], refs
        if kind == "trained":
            self.results[("step", ident)] = StepResult(ident, ident, self.step_s, weights=WeightUpdate(ident))
            return [("step", ident)], refs
        return [], refs  # a wake-up without news

    def get(self, ref, timeout=None):
        return self.results.pop(ref, None)

    def kill(self, *_args, **_kwargs) -> None:
        raise AssertionError("no actor is killed in this timeline")


def _wakeup(decisions, i: int) -> bool:
    """A send at a time when nothing arrived: the simulator's loop woke up without news (a poll)."""
    return decisions[i][1] == "send" and (i == 0 or decisions[i - 1][0] < decisions[i][0]) and decisions[i][0] > 0


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_the_ray_control_unit_on_the_simulators_timeline_makes_the_simulators_decisions(mode, monkeypatch):
    config = RuntimeConfig(
        mode=mode,
        global_batch_prompts=4,
        iterations=None,
        sampling={"n_samples": 2},
        queue={"gu_queue_target": 1, "q_max": 6, "max_policy_lag": 1},
        ray={"generation_units": 2, "actors_per_unit": 2},
    )
    p = plan(20, 2, k=2)
    ids = p.prompt_ids()
    work = Workload.from_arrays(ids, np.asarray([[3 + i, 4 + i] for i in ids]), np.full(len(ids), 5), 64)
    result = simulate(p, work, FixedGen(0.7), FixedTrain(1.3), config.control_settings(), record_decisions=True)
    versions = {(r["task_id"], r["attempt"]): r["policy_version"] for r in result.minibatches}
    fake = ScriptedRay(result.decisions, versions, 1.3)
    monkeypatch.setattr(control, "ray", fake)
    monkeypatch.setattr(control, "time", fake)
    db = Database(p, {pid: f"prompt {pid}" for pid in ids}, epochs=1, max_attempts=config.control.max_attempts, seed=0)
    gus = [GUState(g, fake.handle(g), [2 * g, 2 * g + 1], {2 * g, 2 * g + 1}) for g in range(2)]
    summary = control.ControlUnit(config, db, gus, fake.trainer()).run()
    assert summary.events == result.decisions
    assert summary.finished and summary.trainer_step == len(result.iterations)
    same = ("mean_iteration_time_s", "queue_max_samples", "prompts_trained", "stale_dropped_prompts", "pauses")
    for key in same:
        assert summary.metrics[f"runtime/summary/{key}"] == pytest.approx(result.metrics[f"runtime/summary/{key}"])
