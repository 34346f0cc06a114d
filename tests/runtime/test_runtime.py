"""End-to-end runs on the shared local Ray cluster with the stand-in engine and the simulated trainer.

Checks: every scheduled prompt reaches the trainer exactly once (trainer ledger), also when an actor or a
Generation Unit is killed mid-minibatch and across a Ctrl-C + resume (where each step's metrics reach the
logger once: steps after the last checkpoint, which the resume trains again, were held back); backpressure
bounds the Training Queue and cycles pause -> resume -> pause; misuse errors (engine that fails to load, more
actors than CPUs) come before the run starts. Where an outcome depends on the interleaving (what is decoding at
a kill, whether the queue outgrows q_max) a gate (`helpers.Gate`) makes it happen, so no assertion rests on
relative speeds.
"""

from __future__ import annotations

import functools
import json
import time
from collections import Counter

import pytest

import asp.control.core as control_core
from asp.control.queue import Backpressure
from asp.errors import UserError
from asp.runtime import EngineSpec, run_async
from asp.trainers import SimulatedTrainer

from .helpers import Gate, GatedStandIn, GatedTrainer, fast_config, make_plan, only_while_paused, read_ledger

TABLE_4B = (
    "mean_iteration_time_s",
    "mean_iteration_time_s_excl_first",
    "iteration_time_trend",
    "queue_std_samples",
    "queue_max_samples",
    "generation_time_std_s",
)


class ListLogger:
    """Collects what the runtime logs (the stage passes its MLflow tracker instead)."""

    def __init__(self) -> None:
        self.calls: list[tuple[dict, int]] = []

    def log_metrics(self, metrics: dict, step: int | None = None) -> None:
        self.calls.append((dict(metrics), step))


def trained_counts(ledger_path) -> Counter:
    return Counter(pid for line in read_ledger(ledger_path) for pid in line["prompt_ids"])


def trainer(tmp_path, step_s: float = 0.0, refresh_s: float = 0.0):
    return functools.partial(SimulatedTrainer, step_s, refresh_s, str(tmp_path / "ledger.jsonl"))


def test_one_pass_trains_every_prompt_once_and_logs(ray_cluster, tmp_path):
    plan, prompts = make_plan(12, 3)  # 36 prompts; batches of 8 -> 4 full steps + a short one of 4
    logger = ListLogger()
    cfg = fast_config(queue={"q_max": 8})  # = one batch: resumes at 7 prompts (q_max - 8 = 0 would deadlock)
    summary = run_async(
        plan,
        prompts,
        EngineSpec("standin", options={"seconds_per_call": 0.005, "jitter": 0.5}),
        cfg,
        trainer_factory=trainer(tmp_path, refresh_s=0.002),
        logger=logger,
        checkpoint_dir=tmp_path / "ckpt",
    )
    assert trained_counts(tmp_path / "ledger.jsonl") == Counter(range(36))
    assert summary.trainer_step == 5 and summary.finished
    assert [it["step"] for it in summary.iterations] == [1, 2, 3, 4, 5]
    assert [it["train/prompts"] for it in summary.iterations] == [8, 8, 8, 8, 4]
    for name in TABLE_4B:
        assert f"runtime/summary/{name}" in summary.metrics
    assert summary.metrics["runtime/summary/minibatches"] == 12
    assert summary.metrics["runtime/summary/prompts_trained"] == 36
    # one owner logs: 5 iteration dicts, then the summary at the last step
    assert [step for _, step in logger.calls] == [1, 2, 3, 4, 5, 5]
    assert "runtime/iteration_time_s" in logger.calls[0][0] and "runtime/prompts/actor1" in logger.calls[0][0]
    # samples carry token ids and behaviour log-probs; versions never exceed the trainer's
    for line in read_ledger(tmp_path / "ledger.jsonl"):
        assert line["tokens"] == line["logprobs"] == sum(line["lengths"]) > 0
        assert max(line["versions"]) < line["step"]
    state = json.loads((tmp_path / "ckpt" / "runtime_state.json").read_text())
    assert state["finished"] and state["trainer_step"] == 5


def kill_at_step_1(gate: Gate, kill) -> tuple[list[float], object]:
    """An `on_iteration` hook: at step 1, once both actors are inside a held generate call (calls 1-4 run free,
    5 and 6 wait for the release), call `kill(cu)`, note when (seconds since the run started), then release."""
    killed: list[float] = []

    def hook(cu, metrics):
        if cu.step == 1:
            gate.wait(lambda g: g.count("calls") >= 6, "both actors holding a minibatch")
            kill(cu)
            killed.append(time.time() - cu.t0)
            gate.tick("release")

    return killed, hook


def generated_by(records, before_s: float) -> tuple[list, list]:
    """The ingested minibatch records generated (decoding finished) before / after `before_s`."""
    done = [(r["gen_start_s"] + r["gen_s"] < before_s, r) for r in records]
    return [r for early, r in done if early], [r for early, r in done if not early]


@pytest.mark.slow
def test_killed_actor_loses_nothing_and_duplicates_nothing(ray_cluster, tmp_path):
    plan, prompts = make_plan(16, 2)  # 32 prompts, 4 steps of 8
    gate = Gate(tmp_path / "gate")
    # Ray restarts it (actor_max_restarts); it is killed while decoding, so that minibatch fails and is retried
    killed, hook = kill_at_step_1(gate, lambda cu: ray_cluster.kill(cu.actor_handles[0], no_restart=False))
    summary = run_async(
        plan,
        prompts,
        GatedStandIn(str(gate.dir), free_calls=4),
        fast_config(queue={"gu_queue_target": 2, "coalesce_below_s": 0.0}),
        trainer_factory=trainer(tmp_path),
        on_iteration=hook,
    )
    assert killed
    assert trained_counts(tmp_path / "ledger.jsonl") == Counter(range(32))
    assert summary.metrics["runtime/summary/failed_attempts"] == 1  # the minibatch it was decoding
    retried = [r for r in summary.minibatches if r["attempt"] > 0]
    assert len(retried) == 1 and summary.metrics["runtime/summary/minibatches"] == 16
    before, after = generated_by(summary.minibatches, killed[0])
    assert len(before) == 4 and retried[0] in after  # step 1's four, then the rest after the kill
    assert summary.metrics["runtime/summary/dead_actors"] == 0  # it came back


@pytest.mark.slow
def test_lost_generation_unit_hands_its_work_to_the_other(ray_cluster, tmp_path):
    plan, prompts = make_plan(16, 2)  # 32 prompts, 4 steps of 8
    gate = Gate(tmp_path / "gate")
    # the GU control process itself dies while its actor holds a minibatch
    killed, hook = kill_at_step_1(gate, lambda cu: ray_cluster.kill(cu.gus[0].handle, no_restart=True))
    summary = run_async(
        plan,
        prompts,
        GatedStandIn(str(gate.dir), free_calls=4),
        fast_config(
            queue={"gu_queue_target": 2, "coalesce_below_s": 0.0}, ray={"generation_units": 2, "actors_per_unit": 1}
        ),
        trainer_factory=trainer(tmp_path),
        on_iteration=hook,
    )
    assert trained_counts(tmp_path / "ledger.jsonl") == Counter(range(32))
    assert summary.metrics["runtime/summary/failed_attempts"] >= 1  # what unit 0 held went back to the Database
    before, after = generated_by(summary.minibatches, killed[0])
    assert len(before) == 4 and len(after) == 12  # nothing lost, nothing twice (16 minibatches)
    assert {r["gu"] for r in after} == {1}  # after the kill only unit 1 delivered


def observe_backpressure(monkeypatch, gate: Gate) -> list[tuple[str, int]]:
    """Make the Control Unit's `Backpressure` count pauses / resumes in `gate`; returns (kind, depth) per change."""
    changes: list[tuple[str, int]] = []

    class Observed(Backpressure):
        def update(self, depth: int) -> bool:
            changed = super().update(depth)
            if changed:
                kind = "pause" if self.paused else "resume"
                changes.append((kind, depth))
                gate.tick(kind)
            return changed

    monkeypatch.setattr(control_core, "Backpressure", Observed)  # the Control Unit core's (asp.control)
    return changes


def test_backpressure_bounds_the_queue(ray_cluster, tmp_path, monkeypatch):
    # The trainer only steps while generation is paused, until it paused twice: the queue must fill past q_max
    # (pause), drain to the resume depth while paused (resume), and fill again (pause), whatever the speeds.
    plan, prompts = make_plan(30, 2, k=1)
    cfg = fast_config(global_batch_prompts=4, queue={"q_max": 8, "coalesce_below_s": 0.0, "gu_queue_target": 1})
    gate = Gate(tmp_path / "gate")
    changes = observe_backpressure(monkeypatch, gate)
    may_step = functools.partial(only_while_paused, pauses=2)
    summary = run_async(
        plan,
        prompts,
        GatedStandIn(str(gate.dir)),
        cfg,
        trainer_factory=functools.partial(GatedTrainer, str(gate.dir), may_step, str(tmp_path / "ledger.jsonl")),
    )
    m = summary.metrics
    kinds = [e[1] for e in summary.events if e[1] in ("pause", "resume")]
    assert kinds[:3] == ["pause", "resume", "pause"] and m["runtime/summary/pauses"] == kinds.count("pause") >= 2
    assert [k for k, _ in changes] == kinds
    assert all(d > cfg.queue.q_max if k == "pause" else d <= cfg.resume_depth for k, d in changes)  # the hysteresis
    assert not any(e[1] == "send" for e in _while_paused(summary.events))  # the sender stopped
    # once paused, only minibatches already handed to the GU can arrive: the one that crossed q_max plus at
    # most gu_queue_target + actors = 3 more, 2 prompts each, however late the pause message lands
    max_prompts = m["runtime/summary/queue_max_samples"] / cfg.sampling.n_samples
    assert cfg.queue.q_max < max_prompts <= cfg.queue.q_max + 2 + 3 * 2
    assert trained_counts(tmp_path / "ledger.jsonl") == Counter(range(60))


def _while_paused(events):
    """Events strictly between a pause and the following resume."""
    paused = False
    for e in events:
        if e[1] in ("pause", "resume"):
            paused = e[1] == "pause"
        elif paused:
            yield e


@pytest.mark.slow
def test_interrupt_then_resume_from_checkpoint_logs_each_step_once(ray_cluster, tmp_path):
    plan, prompts = make_plan(10, 4)  # 40 prompts, 5 steps of 8
    engine = EngineSpec("standin", options={"seconds_per_call": 0.01})
    cfg = fast_config(checkpoint_interval=2)
    logger = ListLogger()  # both sessions log to it, as a resumed launch does to its MLflow run

    def interrupt(cu, metrics):
        if cu.step == 3:
            raise KeyboardInterrupt  # what Ctrl-C does in the driver: after step 3, checkpointed at step 2

    with pytest.raises(KeyboardInterrupt):
        run_async(
            plan,
            prompts,
            engine,
            cfg,
            trainer_factory=trainer(tmp_path),
            checkpoint_dir=tmp_path / "ck",
            on_iteration=interrupt,
            logger=logger,
        )
    assert json.loads((tmp_path / "ck" / "runtime_state.json").read_text())["trainer_step"] == 2
    assert [step for _, step in logger.calls] == [1, 2]  # step 3 is held back: the resume trains it again
    summary = run_async(
        plan, prompts, engine, cfg, trainer_factory=trainer(tmp_path), checkpoint_dir=tmp_path / "ck", logger=logger
    )
    assert summary.resumed_from_step == 2 and summary.resume_reason == "resumed"
    assert [it["step"] for it in summary.iterations] == [1, 2, 3, 4, 5]  # the whole run (the run log)
    ledger = read_ledger(tmp_path / "ledger.jsonl")
    assert [line["step"] for line in ledger] == [1, 2, 3, 3, 4, 5]  # step 3 of the first session was lost
    kept = [line for i, line in enumerate(ledger) if i != 2]
    assert Counter(pid for line in kept for pid in line["prompt_ids"]) == Counter(range(40))
    # the resumed trainer continued its version; actors were told to load it
    resumed = [r for r in summary.minibatches if r["session"] == 1]
    assert resumed and min(r["policy_version"] for r in resumed) >= 2
    # the summary covers the whole run: the first session's minibatches trained by step 2, then the resumed ones
    first = [r for r in summary.minibatches if r["session"] == 0]
    assert len(first) == 4 and len(summary.minibatches) == 10  # steps 1-2: 4 whole minibatches of 4 prompts
    assert sorted(r["task_id"] for r in summary.minibatches) == list(range(10))
    assert max(r["arrival_s"] for r in first) <= min(r["arrival_s"] for r in resumed)  # run time runs on
    m = summary.metrics
    assert m["runtime/summary/iterations"] == 5 and m["runtime/summary/prompts_trained"] == 40
    assert m["runtime/summary/minibatches"] == 10
    # every iteration metric was logged exactly once at each step 1..5, across both sessions
    steps_by_metric: dict[str, list[int]] = {}
    for metrics, step in logger.calls:
        for name in metrics:
            if not name.startswith("runtime/summary/"):
                steps_by_metric.setdefault(name, []).append(step)
    assert "runtime/iteration_time_s" in steps_by_metric and "train/prompts" in steps_by_metric
    assert {name: steps for name, steps in steps_by_metric.items() if steps != [1, 2, 3, 4, 5]} == {}
    assert [step for m, step in logger.calls if "runtime/summary/iterations" in m] == [5]  # the finished session


def test_engine_that_fails_to_load_is_reported(ray_cluster):
    plan, prompts = make_plan(2, 2)
    with pytest.raises(UserError, match=r"could not load its engine: TypeError: .*bogus"):
        run_async(
            plan, prompts, EngineSpec("standin", options={"bogus": 1}), fast_config(), trainer_factory=SimulatedTrainer
        )


def test_more_actors_than_cpus_is_refused(ray_cluster):
    plan, prompts = make_plan(2, 2)
    cfg = fast_config(ray={"generation_units": 2, "actors_per_unit": 3, "actor_num_cpus": 1.0})
    with pytest.raises(UserError, match=r"needs 6 CPUs .* Ray can give 4\b"):
        run_async(plan, prompts, EngineSpec("standin"), cfg, trainer_factory=SimulatedTrainer)
