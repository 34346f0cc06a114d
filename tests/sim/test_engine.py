"""The discrete-event simulator `asp.sim.engine.simulate`.

Hand-worked timelines (one actor without and with reload and publish costs; two actors sharing one core), the
same result for the same inputs, and the runtime's own properties on the runtime tests' inputs (every prompt
trained once in a one-pass run; backpressure pauses above q_max, resumes at the resume depth and bounds the
queue; the policy-lag bound drops or regenerates exactly the stale prompts), plus bad input. The time models are
duck-typed stand-ins (the engine uses only `.seconds(...)`, `.step_seconds`, `.publish_seconds` and the refresh
costs).

Run: ``.venv/bin/python -m pytest tests/sim/test_engine.py -q``
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np
import pytest

import asp.control.core as engine  # the Control Unit core the simulator drives (the Ledger patches its parts)
from asp.config import deep_merge
from asp.control.queue import Backpressure, TrainingQueue
from asp.control.settings import ControlSettings
from asp.runtime import RuntimeConfig, WorkPlan
from asp.sim.engine import Resources, Workload, simulate
from asp.sim.sharing import ContentionTable

# ---- stand-in time models and small inputs -------------------------------------------------------------------


@dataclass(frozen=True)
class FixedGen:
    """Every minibatch decodes in `s` seconds (at full speed)."""

    s: float

    def seconds(self, prompts, n_samples, max_length, total_tokens, prompt_tokens) -> float:
        return self.s


@dataclass(frozen=True)
class PerTokenGen:
    """Seconds = base + per_token * generated tokens of the minibatch."""

    per_token: float
    base: float = 0.0

    def seconds(self, prompts, n_samples, max_length, total_tokens, prompt_tokens) -> float:
        return self.base + self.per_token * total_tokens


@dataclass(frozen=True)
class FixedTrain:
    """A trainer step takes `step_s` + save + convert; every actor pays `load_s` before its next minibatch."""

    step_s: float
    load_s: float = 0.0
    save_s: float = 0.0
    convert_s: float = 0.0

    def step_seconds(self, tokens: float, samples: float = 0.0) -> float:
        return self.step_s

    def publish_seconds(self) -> float:
        return self.save_s + self.convert_s


def make_plan(n_minibatches: int, size: int, k: int = 2) -> WorkPlan:
    """As tests/runtime/helpers.make_plan: minibatches of `size` consecutive int prompt ids, groups of `k`."""
    mbs = [list(range(s, s + size)) for s in range(0, n_minibatches * size, size)]
    return WorkPlan.from_lists(mbs, [p // k for p in range(n_minibatches)])


def make_workload(plan: WorkPlan, n: int = 2, seed: int | None = None, cap: int = 16) -> Workload:
    """Every sample 4 tokens long (seed None) or random lengths in [1, cap]; 3 prompt tokens each."""
    ids = plan.prompt_ids()
    if seed is None:
        lengths = np.full((len(ids), n), 4)
    else:
        lengths = np.random.default_rng(seed).integers(1, cap + 1, (len(ids), n))
    return Workload.from_arrays(ids, lengths, np.full(len(ids), 3), max_new_tokens=cap)


def config(**overrides) -> ControlSettings:
    """As tests/runtime/helpers.fast_config: 1 GU x 2 actors, batches of 8 prompts, n = 2, one pass, no lag bound."""
    base = {
        "iterations": None,
        "global_batch_prompts": 8,
        "sampling": {"n_samples": 2, "max_new_tokens": 16},
        "queue": {"max_policy_lag": None, "gu_queue_target": 4, "q_max": 32},
        "ray": {"generation_units": 1, "actors_per_unit": 2},
    }
    return RuntimeConfig(**deep_merge(base, overrides)).control_settings()


def one_actor(**overrides) -> ControlSettings:
    """1 GU x 1 actor, a global batch = one minibatch of 2 prompts, the GU holds 2 + 1 minibatches."""
    base = {"global_batch_prompts": 2, "queue": {"gu_queue_target": 2, "q_max": 4}, "ray": {"actors_per_unit": 1}}
    return config(**deep_merge(base, overrides))


def column(result, key: str) -> list:
    return [r[key] for r in result.minibatches]


def lags_max(result) -> list[float]:
    return [it["runtime/policy_lag_max"] for it in result.iterations]


class Ledger:
    """Installs recording subclasses of the engine's TrainingQueue and Backpressure (like the runtime tests'
    trainer ledger and observed backpressure): `batches` = (step, prompt ids, versions) per trainer step,
    `log` = ("pause" | "resume", depth, time) and ("send", -, -) in the order they happened."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.batches: list[tuple[int, list, list[int]]] = []
        self.log: list[tuple[str, int, float]] = []
        clock = [0.0]  # time of the last queue operation (every pause / resume follows one at the same time)
        ledger = self

        class RecordingQueue(TrainingQueue):
            def put(self, out, now):
                clock[0] = now
                return super().put(out, now)

            def take(self, step, now, limit=None):
                clock[0] = now
                batch, consumed = super().take(step, now, limit)
                ledger.batches.append((step, list(batch.prompt_ids), batch.versions.tolist()))
                return batch, consumed

            def evict_older(self, min_version, now):
                clock[0] = now
                return super().evict_older(min_version, now)

        class ObservedBackpressure(Backpressure):
            def update(self, depth):
                changed = super().update(depth)
                if changed:
                    ledger.log.append(("pause" if self.paused else "resume", depth, clock[0]))
                return changed

        def recording_dispatch(db, gus):
            sent = plan_dispatch(db, gus)
            if sent:
                ledger.log.append(("send", -1, float("nan")))
            return sent

        plan_dispatch = engine.plan_dispatch
        monkeypatch.setattr(engine, "TrainingQueue", RecordingQueue)
        monkeypatch.setattr(engine, "Backpressure", ObservedBackpressure)
        monkeypatch.setattr(engine, "plan_dispatch", recording_dispatch)

    def trained(self) -> Counter:
        return Counter(pid for _, pids, _ in self.batches for pid in pids)

    def lags(self) -> list[int]:
        """Lag of every trained prompt: trainer version when its batch was cut (step - 1) - its version."""
        return [step - 1 - v for step, _, versions in self.batches for v in versions]

    def pauses(self) -> list[tuple[str, int, float]]:
        return [e for e in self.log if e[0] != "send"]


# ---- hand-worked timelines ------------------------------------------------------------------------------------


def test_generation_bound_single_actor():
    # G = 10 s per minibatch, T = 4 s per step, no reload cost, global batch = one minibatch (4 minibatches).
    #   mb0 decodes 0-10; step 1 trains it 10-14                                  iteration 1 = 14 = G + T
    #   mb1 starts at 10 (the actor takes the next queued minibatch at once), 10-20; step 2 20-24   -> 24 - 14 = 10
    #   mb2 20-30, step 3 30-34 -> 10; mb3 30-40, step 4 40-44 -> 10: generation overlaps training, iteration = G
    # Versions: mb0, mb1 start before step 1 ends (14) -> version 0; mb2 starts at 20 -> 1; mb3 at 30 -> 2.
    # Lags (trainer version at the step - version): step 1: 0 - 0, step 2: 1 - 0, step 3: 2 - 1, step 4: 3 - 2.
    plan = make_plan(4, 2, k=1)
    r = simulate(plan, make_workload(plan), FixedGen(10.0), FixedTrain(4.0), one_actor())
    assert [it["runtime/iteration_time_s"] for it in r.iterations] == [14.0, 10.0, 10.0, 10.0]
    assert column(r, "gen_start_s") == [0.0, 10.0, 20.0, 30.0]
    assert column(r, "arrival_s") == [10.0, 20.0, 30.0, 40.0]
    assert column(r, "policy_version") == [0, 0, 1, 2]
    assert lags_max(r) == [0.0, 1.0, 1.0, 1.0]
    m = r.metrics
    assert m["runtime/summary/mean_iteration_time_s"] == 44.0 / 4
    assert m["runtime/summary/first_iteration_time_s"] == 14.0 and m["sim/simulated_s"] == 44.0
    assert m["runtime/summary/prompts_trained"] == 8 and m["runtime/summary/minibatches"] == 4
    assert m["sim/generation_utilization"] == 40.0 / 44.0 and m["sim/training_utilization"] == 16.0 / 44.0
    assert m["runtime/summary/queue_max_samples"] == 2 * 2  # one minibatch waits at most, never two


def test_training_bound_single_actor():
    # G = 3 s, T = 5 s: the actor runs ahead of the trainer (the GU holds 3 minibatches, q_max = 4 prompts).
    #   mb0 0-3; step 1 3-8 (iteration 1 = 8). mb1 3-6, mb2 6-9, mb3 9-12 (queue: 2 then 4 prompts, never > 4).
    #   step 2 8-13, step 3 13-18, step 4 18-23: iterations 5, 5, 5 = T.
    # Versions: mb1 and mb2 start before step 1 ends (8) -> 0; mb3 starts at 9 -> 1.
    # Lags: step 1: 0; step 2 (version 1) trains mb1 (0) -> 1; step 3 (2) mb2 (0) -> 2; step 4 (3) mb3 (1) -> 2.
    plan = make_plan(4, 2, k=1)
    r = simulate(plan, make_workload(plan), FixedGen(3.0), FixedTrain(5.0), one_actor())
    assert [it["runtime/iteration_time_s"] for it in r.iterations] == [8.0, 5.0, 5.0, 5.0]
    assert column(r, "arrival_s") == [3.0, 6.0, 9.0, 12.0]
    assert column(r, "depth_at_arrival_batches") == [0.0, 0.0, 0.0, 1.0]  # mb3 finds mb2 waiting
    assert lags_max(r) == [0.0, 1.0, 2.0, 2.0]
    assert r.metrics["runtime/summary/pauses"] == 0


def test_reload_and_publish_costs_single_actor():
    # G = 10, step 2 s + save 1 + convert 1 = T 4 s per step; every actor reloads a new snapshot for L = 3 s
    # before its next minibatch (deferred reload).
    #   mb0 0-10; step 1 10-14 (snapshot 1 announced at 14)                        iteration 1 = 14
    #   mb1 starts at 10, the snapshot is not out yet: no reload, 10-20; step 2 20-24          -> 10
    #   mb2 starts at 20 with snapshot 1 (newer than the actor's 0): reload 20-23, decode 23-33; step 3 33-37 -> 13
    #   mb3 starts at 33 with snapshot 2: reload 33-36, decode 36-46; step 4 46-50                         -> 13
    plan = make_plan(4, 2, k=1)
    train = FixedTrain(2.0, load_s=3.0, save_s=1.0, convert_s=1.0)
    r = simulate(plan, make_workload(plan), FixedGen(10.0), train, one_actor())
    assert [it["runtime/iteration_time_s"] for it in r.iterations] == [14.0, 10.0, 13.0, 13.0]
    assert [it["runtime/train_step_s"] for it in r.iterations] == [4.0] * 4
    assert column(r, "reload_s") == [0.0, 0.0, 3.0, 3.0]
    assert column(r, "gen_start_s") == [0.0, 10.0, 23.0, 36.0] and column(r, "gen_s") == [10.0] * 4
    assert column(r, "policy_version") == [0, 0, 1, 2] and lags_max(r) == [0.0, 1.0, 1.0, 1.0]
    m = r.metrics
    assert m["sim/duty_cycle"] == 40.0 / 46.0  # T_gen / (T_gen + T_load) summed over the run
    # d_off estimate: Q_arrival 0 (every minibatch finds an empty queue) + (1 + 1 + 3 + 10) / 4
    assert m["sim/d_off_estimate"] == 15.0 / 4.0


def test_two_actors_share_one_core():
    # 2 actors on 1 core, G = 10 s of full-speed work per minibatch, T = 1 s, batch = one minibatch:
    #   mb0 (actor 0) and mb1 (actor 1) both decode from 0 at half speed: both finish at 20 (2 x G).
    #   step 1 trains mb0 20-21 (iteration 21), step 2 trains mb1 21-22 (iteration 1).
    #   mb2, mb3 start at 20, again together at half speed -> 40; steps 40-41 (iteration 19) and 41-42 (1).
    plan = make_plan(4, 2, k=1)
    cfg = one_actor(ray={"actors_per_unit": 2})
    shared = simulate(plan, make_workload(plan), FixedGen(10.0), FixedTrain(1.0), cfg, Resources(cores=1))
    assert column(shared, "gen_s") == [20.0] * 4
    assert column(shared, "arrival_s") == [20.0, 20.0, 40.0, 40.0]
    assert column(shared, "actor") == [0, 1, 0, 1]
    assert [it["runtime/iteration_time_s"] for it in shared.iterations] == [21.0, 1.0, 19.0, 1.0]
    # 2 threads each on 2 cores is the same demand; 2 cores for 2 one-thread actors (or GPUs) is full speed
    two_threads = simulate(
        plan, make_workload(plan), FixedGen(10.0), FixedTrain(1.0), cfg, Resources(cores=2, threads_per_actor=2)
    )
    assert two_threads.minibatches == shared.minibatches
    for res in (Resources(cores=2), Resources(cores=None)):
        full = simulate(plan, make_workload(plan), FixedGen(10.0), FixedTrain(1.0), cfg, res)
        assert column(full, "gen_s") == [10.0] * 4 and column(full, "arrival_s") == [10.0, 10.0, 20.0, 20.0]


def test_the_trainer_shares_the_core_with_the_actor():
    # One actor and the trainer (1 thread each, Resources.trainer_threads) on 1 core; G = 10 s, T = 4 s of
    # full-speed work; global batch = one minibatch. While both run, each goes at half speed.
    #   mb0 0-10 alone. At 10 step 1 and mb1 start together: the step's 4 s take 8 (10-18); by 18 mb1 has done
    #   4 s of its 10 and finishes the other 6 alone at 24.                          iterations: 18
    #   At 24 step 2 and mb2 start together: step 24-32, mb2 24-38.                              32 - 18 = 14
    #   At 38 step 3 and mb3: step 38-46, mb3 38-52. At 52 step 4 runs alone: 52-56.        14, then 56 - 46 = 10
    plan = make_plan(4, 2, k=1)
    r = simulate(plan, make_workload(plan), FixedGen(10.0), FixedTrain(4.0), one_actor(), Resources(1, 1, 0, 1.0))
    assert [it["runtime/iteration_time_s"] for it in r.iterations] == [18.0, 14.0, 14.0, 10.0]
    assert [it["runtime/train_step_s"] for it in r.iterations] == [8.0, 8.0, 8.0, 4.0]
    assert column(r, "gen_start_s") == [0.0, 10.0, 24.0, 38.0]
    assert column(r, "gen_s") == [10.0, 14.0, 14.0, 14.0]
    # on 2 cores the demand (2 threads) fits: nothing slows down, as with the trainer on its own device
    for res in (Resources(cores=2, trainer_threads=1.0), Resources(cores=1)):
        alone = simulate(plan, make_workload(plan), FixedGen(10.0), FixedTrain(4.0), one_actor(), res)
        assert [it["runtime/iteration_time_s"] for it in alone.iterations] == [14.0, 10.0, 10.0, 10.0]


def test_a_measured_contention_table_slows_the_actor_and_the_trainer_apart():
    # One actor and the trainer under a measured table (asp.sim.sharing.ContentionTable): beside a step a call runs
    # at 1/2 of its speed, the step beside a call at 1/1.25. G = 10 s, T = 4 s; global batch = one minibatch.
    #   mb0 0-10 alone. At 10 step 1 (4 s at 0.8: 10-15) and mb1 (2.5 s of work by 15, the other 7.5 alone: 22.5).
    #   At 22.5 step 2 (22.5-27.5) and mb2 (-> 35); at 35 step 3 (35-40) and mb3 (-> 47.5); step 4 alone 47.5-51.5.
    table = ContentionTable(generation=((1.0, 2.0),), training=(1.25,))
    plan = make_plan(4, 2, k=1)
    res = Resources(cores=2, trainer_threads=0.0, contention=table)
    r = simulate(plan, make_workload(plan), FixedGen(10.0), FixedTrain(4.0), one_actor(), res)
    assert [it["runtime/iteration_time_s"] for it in r.iterations] == pytest.approx([15.0, 12.5, 12.5, 11.5])
    assert [it["runtime/train_step_s"] for it in r.iterations] == pytest.approx([5.0, 5.0, 5.0, 4.0])
    assert column(r, "gen_s") == pytest.approx([10.0, 12.5, 12.5, 12.5])
    # the simulated trainer (trainer_threads None) computes nothing: it is no sharer, whatever the table says
    alone = simulate(
        plan, make_workload(plan), FixedGen(10.0), FixedTrain(4.0), one_actor(), Resources(cores=2, contention=table)
    )
    assert [it["runtime/iteration_time_s"] for it in alone.iterations] == [14.0, 10.0, 10.0, 10.0]


def test_a_table_of_processor_sharing_simulates_as_processor_sharing():
    # 2 one-thread actors and a one-thread trainer on 2 cores, written as a table: the same run
    plan, cfg = make_plan(8, 2, k=1), one_actor(ray={"actors_per_unit": 2})
    table = ContentionTable(generation=((1.0, 1.0), (1.0, 1.5)), training=(1.0, 1.5))
    runs = [
        simulate(plan, make_workload(plan), FixedGen(10.0), FixedTrain(4.0), cfg, res)
        for res in (Resources(cores=2, trainer_threads=1.0), Resources(cores=2, trainer_threads=0.0, contention=table))
    ]
    for key in ("gen_s", "arrival_s"):
        assert column(runs[0], key) == pytest.approx(column(runs[1], key))
    assert [it["runtime/iteration_time_s"] for it in runs[0].iterations] == pytest.approx(
        [it["runtime/iteration_time_s"] for it in runs[1].iterations]
    )


def test_unequal_jobs_share_one_core():
    # Two minibatches on one core: mb0 needs 10 s of work (40 tokens x 0.25 s), mb1 20 s (80 tokens).
    #   both at half speed until mb0 is done at 20 (mb1 has done 10 of its 20 s); then mb1 alone at full
    #   speed finishes its last 10 s at 30.
    plan = make_plan(2, 2, k=1)
    lengths = np.array([[10, 10], [10, 10], [20, 20], [20, 20]])
    work = Workload.from_arrays(plan.prompt_ids(), lengths, np.full(4, 3), max_new_tokens=32)
    cfg = one_actor(ray={"actors_per_unit": 2})
    r = simulate(plan, work, PerTokenGen(0.25), FixedTrain(1.0), cfg, Resources(cores=1))
    assert column(r, "arrival_s") == [20.0, 30.0] and column(r, "gen_s") == [20.0, 30.0]
    assert column(r, "tokens") == [40, 80]


# ---- determinism ------------------------------------------------------------------------------------------------


def test_same_inputs_same_result():
    plan = make_plan(40, 3, k=3)
    cfg = config(
        iterations=25,
        queue={"gu_queue_target": 2, "max_policy_lag": 1, "stale_samples": "regenerate", "q_max": 16},
        ray={"generation_units": 2, "actors_per_unit": 3},
    )
    args = (plan, make_workload(plan, seed=1), PerTokenGen(0.01, 0.2), FixedTrain(0.5, load_s=0.1), cfg)
    a = simulate(*args, Resources(cores=3, report_latency_s=0.05))
    b = simulate(*args, Resources(cores=3, report_latency_s=0.05))
    assert a.events == b.events > 0 and len(a.iterations) == 25
    np.testing.assert_equal(a.metrics, b.metrics)  # NaN-aware equality
    np.testing.assert_equal(a.iterations, b.iterations)
    np.testing.assert_equal(a.minibatches, b.minibatches)


# ---- the runtime's properties, on the runtime tests' inputs --------------------------------------------------------


def test_one_pass_trains_every_prompt_once(monkeypatch):
    # tests/runtime/test_runtime.py::test_one_pass_trains_every_prompt_once_and_logs: 36 prompts, batches of 8
    ledger = Ledger(monkeypatch)
    plan = make_plan(12, 3)
    r = simulate(plan, make_workload(plan, seed=0), PerTokenGen(0.01), FixedTrain(0.05), config(queue={"q_max": 8}))
    assert ledger.trained() == Counter(range(36))
    assert [len(pids) for _, pids, _ in ledger.batches] == [8, 8, 8, 8, 4]  # the short last batch
    assert [it["step"] for it in r.iterations] == [1, 2, 3, 4, 5]
    assert r.metrics["runtime/summary/minibatches"] == 12 and r.metrics["runtime/summary/prompts_trained"] == 36
    assert all(max(versions) < step for step, _, versions in ledger.batches)  # never newer than the trainer


def test_one_pass_at_scale_trains_every_prompt_once(monkeypatch):
    ledger = Ledger(monkeypatch)
    plan = make_plan(101, 5, k=4)  # 505 prompts: the last batch of 32 is short
    cfg = config(
        global_batch_prompts=32,
        queue={"q_max": 64, "gu_queue_target": 3},
        ray={"generation_units": 3, "actors_per_unit": 4},
    )
    r = simulate(plan, make_workload(plan, seed=2), PerTokenGen(0.02, 0.1), FixedTrain(0.3, load_s=0.2), cfg)
    assert sum(ledger.trained().values()) == plan.n_prompts and set(ledger.trained().values()) == {1}
    assert r.metrics["runtime/summary/prompts_trained"] == plan.n_prompts
    assert sorted(column(r, "task_id")) == list(range(101))  # every minibatch generated once


def test_backpressure_bounds_the_queue(monkeypatch):
    # tests/runtime/test_runtime.py::test_backpressure_bounds_the_queue: 60 prompts in minibatches of 2, batches
    # of 4, q_max 8 (resume at 4). A slow trainer (10 s per step vs 1 s per minibatch) makes the queue fill past
    # q_max (pause), drain to the resume depth (resume) and fill again (pause).
    ledger = Ledger(monkeypatch)
    plan = make_plan(30, 2, k=1)
    cfg = config(global_batch_prompts=4, queue={"q_max": 8, "gu_queue_target": 1})
    r = simulate(plan, make_workload(plan, seed=3), FixedGen(1.0), FixedTrain(10.0), cfg)
    changes = ledger.pauses()
    kinds = [k for k, _, _ in changes]
    assert kinds[:3] == ["pause", "resume", "pause"]
    assert r.metrics["runtime/summary/pauses"] == kinds.count("pause") >= 2
    assert all(d > cfg.q_max if k == "pause" else d <= cfg.resume_depth for k, d, _ in changes)  # the hysteresis
    paused, sends_while_paused = False, 0
    for kind, _, _ in ledger.log:  # the sender stops while paused
        paused = kind == "pause" if kind != "send" else paused
        sends_while_paused += kind == "send" and paused
    assert sends_while_paused == 0
    # no minibatch starts while paused (decoding ones finish): no start strictly inside a pause interval
    bounds = [t for _, _, t in changes] + [float("inf")] * (len(changes) % 2)
    intervals = list(zip(bounds[::2], bounds[1::2], strict=True))
    assert not [s for s in column(r, "gen_start_s") if any(a < s < b for a, b in intervals)]
    # the runtime's bound: the minibatch that crossed q_max plus at most gu_queue_target + actors = 3 more, and
    # the simulator's tighter one (the pause is instant): at most one minibatch per actor lands after the pause
    max_prompts = r.metrics["runtime/summary/queue_max_samples"] / cfg.n_samples
    assert cfg.q_max < max_prompts <= cfg.q_max + 2 + 3 * 2
    assert max_prompts <= cfg.q_max + cfg.total_actors * 2
    assert ledger.trained() == Counter(range(60))


@pytest.mark.parametrize("mode", ["drop", "regenerate"])
def test_the_lag_bound_holds(monkeypatch, mode):
    # tests/runtime/test_grpo_lag.py::test_the_lag_bound_holds_end_to_end: 32 prompts, batches of 4, bound 1.
    # A slow trainer (100 s per step vs 1 s per minibatch) means all 32 prompts are generated with version 0
    # before step 1 ends: step 1 trains 4 (lag 0), step 2 four more (lag 1 = the bound), and at version 2 the
    # other 24 are stale.
    ledger = Ledger(monkeypatch)
    plan = make_plan(16, 2)
    cfg = config(
        global_batch_prompts=4, queue={"q_max": 32, "max_policy_lag": 1, "stale_samples": mode, "gu_queue_target": 2}
    )
    r = simulate(plan, make_workload(plan, seed=4), FixedGen(1.0), FixedTrain(100.0), cfg)
    assert [versions for _, _, versions in ledger.batches[:2]] == [[0] * 4, [0] * 4]
    assert max(ledger.lags()) <= 1 and all(lag <= 1 for lag in lags_max(r))
    m, counts = r.metrics, ledger.trained()
    if mode == "regenerate":
        assert counts == Counter(range(32))  # every prompt trained exactly once
        assert m["runtime/summary/stale_regenerated_prompts"] >= 24 and m["runtime/summary/stale_dropped_prompts"] == 0
        seen: set[int] = set()
        again = [r for r in r.minibatches if r["task_id"] in seen or seen.add(r["task_id"])]
        assert len(again) >= 12 and all(rec["policy_version"] >= 2 for rec in again)  # with newer weights
        assert all(min(versions) >= 2 for _, _, versions in ledger.batches[2:])
    else:
        assert m["runtime/summary/stale_dropped_prompts"] == 24 and m["runtime/summary/stale_regenerated_prompts"] == 0
        assert len(ledger.batches) == 2 and sorted(counts.values()) == [1] * 8  # 8 trained once, 24 dropped
        assert m["runtime/summary/prompts_trained"] == 8 and len(r.iterations) == 2


@pytest.mark.parametrize("mode", ["drop", "regenerate"])
def test_lag_zero_trains_only_current_samples(monkeypatch, mode):
    # max_policy_lag 0: every trained sample was generated with the trainer's current weights; one pass, so
    # trained + dropped = all prompts, none twice
    ledger = Ledger(monkeypatch)
    plan = make_plan(60, 4, k=3)
    cfg = config(
        global_batch_prompts=8,
        queue={"q_max": 24, "max_policy_lag": 0, "stale_samples": mode},
        ray={"generation_units": 2, "actors_per_unit": 3},
    )
    r = simulate(plan, make_workload(plan, seed=5), PerTokenGen(0.05, 0.1), FixedTrain(0.7, load_s=0.2), cfg)
    assert set(ledger.lags()) == {0} and set(lags_max(r)) == {0.0}
    counts, m = ledger.trained(), r.metrics
    assert set(counts.values()) == {1}
    dropped = m["runtime/summary/stale_dropped_prompts"]
    assert sum(counts.values()) + dropped == plan.n_prompts == 240
    assert m["runtime/summary/prompts_trained"] == sum(counts.values())
    if mode == "regenerate":
        assert dropped == 0 and m["runtime/summary/stale_regenerated_prompts"] > 0
    else:
        assert dropped > 0


def test_work_freed_by_a_resume_is_sent_at_once():
    # 1 actor, nothing queued beyond the minibatch it decodes (gu_queue_target 0), G = 1 s, T = 100 s, batches of
    # 4 prompts, q_max 4 (resume at 3), max_policy_lag 0 with drop; 10 minibatches of 2 prompts.
    #   mb0 0-1, mb1 1-2 -> step 1 2-102 trains both. mb2 2-3, mb3 3-4, mb4 4-5: depth 6 > 4 -> pause; the actor
    #   idles and the sender stops. At 102 (version 1) the 6 queued prompts (version 0) are dropped: depth 0 ->
    #   resume. As in the runtime's loop (dispatch, train, then `ray.wait(timeout=poll_timeout_s)`), the freed
    #   work is sent at the loop's next wake-up: no event is pending, so after the 1 s poll timeout, at 103.
    #   mb5 103-104, mb6 104-105 (version 1) -> step 2 105-205; mb7-mb9 105-108 -> depth 6 -> pause; at 205
    #   (version 2) those 6 are dropped and the plan is done: 8 prompts trained, 12 dropped.
    plan = make_plan(10, 2, k=1)
    cfg = config(
        global_batch_prompts=4,
        queue={"gu_queue_target": 0, "q_max": 4, "max_policy_lag": 0},
        ray={"actors_per_unit": 1},
    )
    r = simulate(plan, make_workload(plan), FixedGen(1.0), FixedTrain(100.0), cfg)
    assert column(r, "gen_start_s")[5:] == [103.0, 104.0, 105.0, 106.0, 107.0]
    assert [it["runtime/iteration_time_s"] for it in r.iterations] == [102.0, 103.0]
    assert r.metrics["runtime/summary/prompts_trained"] == 8
    assert r.metrics["runtime/summary/stale_dropped_prompts"] == 12


# ---- bad input ------------------------------------------------------------------------------------------------


def test_missing_prompt_in_workload_is_named():
    plan = make_plan(3, 2)
    ids = [p for p in plan.prompt_ids() if p != 4]
    work = Workload.from_arrays(ids, np.full((5, 2), 4), np.full(5, 3), max_new_tokens=16)
    with pytest.raises(ValueError, match=r"1 scheduled prompts have no lengths.*\[4\]"):
        simulate(plan, work, FixedGen(1.0), FixedTrain(1.0), config())


def test_sample_count_mismatch_raises():
    plan = make_plan(3, 2)
    with pytest.raises(ValueError, match=r"n=3 samples per prompt, runtime.sampling.n_samples is 2"):
        simulate(plan, make_workload(plan, n=3), FixedGen(1.0), FixedTrain(1.0), config())


def test_bad_workload_and_resources_raise():
    with pytest.raises(ValueError, match="lengths \\(P, n\\)"):
        Workload.from_arrays([0, 1], np.zeros((3, 2)), np.zeros(2), max_new_tokens=4)
    with pytest.raises(ValueError, match=">= 0"):
        Workload.from_arrays([0], np.full((1, 2), -1), np.zeros(1), max_new_tokens=4)
    for cores in (0, -1.0):
        with pytest.raises(ValueError, match="cores must be > 0"):
            Resources(cores=cores)
    for threads in (-0.5, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="trainer_threads must be finite and >= 0"):
            Resources(cores=2, trainer_threads=threads)
    with pytest.raises(ValueError, match="threads_per_actor"):
        Resources(threads_per_actor=0)


def test_a_prompt_s_later_visits_generate_the_workload_s_revisits():
    # 2 minibatches of 2 prompts, 4 steps of one minibatch: two passes. First visits 4 tokens a sample, later ones 6:
    # 2 prompts x 2 samples x 4 = 16 tokens a minibatch in pass 1, x 6 = 24 in pass 2
    plan = make_plan(2, 2, k=1)
    ids = plan.prompt_ids()
    work = Workload.from_arrays(ids, np.full((4, 2), 4), np.full(4, 3), 16, revisits=np.full((1, 4, 2), 6))
    r = simulate(plan, work, FixedGen(1.0), FixedTrain(1.0), one_actor(iterations=4))
    assert column(r, "tokens")[:4] == [16, 16, 24, 24]
    # without revisits every visit generates the first visit's lengths again
    same = simulate(plan, make_workload(plan), FixedGen(1.0), FixedTrain(1.0), one_actor(iterations=4))
    assert column(same, "tokens")[:4] == [16, 16, 16, 16]
    # partial rollouts: a later visit's responses (12 tokens) pass the budget of 8 and are continued to their own
    # final lengths, not the first visit's: 2 x 2 x 12 = 48 tokens a minibatch
    cut = Workload.from_arrays(ids, np.full((4, 2), 4), np.full(4, 3), 16, revisits=np.full((1, 4, 2), 12))
    partial = one_actor(iterations=4, partial={"enabled": True, "token_budget": 8})
    r = simulate(plan, cut, FixedGen(1.0), FixedTrain(1.0), partial)
    assert column(r, "tokens")[:4] == [16, 16, 48, 48]


def test_visit_lengths_cycle_through_the_revisits():
    revisits = np.stack([np.full((2, 1), 5), np.full((2, 1), 7)])
    work = Workload.from_arrays(["a", "b"], np.array([[1], [2]]), np.zeros(2), 16, revisits=revisits)
    # visit 0: lengths; 1: revisits[0]; 2: revisits[1]; 3: revisits[0] again
    np.testing.assert_array_equal(work.visit_lengths([0, 1, 1, 0], [0, 1, 2, 3]), [[1], [5], [7], [5]])
    plain = Workload.from_arrays(["a", "b"], np.array([[1], [2]]), np.zeros(2), 16)
    np.testing.assert_array_equal(plain.visit_lengths([1, 0], [5, 2]), [[2], [1]])  # no revisits: the first visit
    with pytest.raises(ValueError, match=r"revisits must be \(V, P, n\) with \(P, n\) = \(2, 1\)"):
        Workload.from_arrays(["a", "b"], np.array([[1], [2]]), np.zeros(2), 16, revisits=np.zeros((1, 2, 3)))
    with pytest.raises(ValueError, match=">= 0"):
        Workload.from_arrays(["a", "b"], np.array([[1], [2]]), np.zeros(2), 16, revisits=np.full((1, 2, 1), -1))
