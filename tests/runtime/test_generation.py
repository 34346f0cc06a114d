"""Generation actor logic without Ray (the class is plain Python): packing, deferred reload, errors; the trainer."""

from __future__ import annotations

import functools
import json

import pytest

from asp.runtime import (
    EngineSpec,
    Failure,
    SamplingParams,
    StandInEngine,
    Trainer,
    TrainingQueue,
    WeightUpdate,
    WorkItem,
)
from asp.runtime.generation import GenerationActor
from asp.trainers import SimulatedTrainer


def item(task_id: int, prompts: list[str]) -> WorkItem:
    return WorkItem(task_id, 100 + task_id, 0, 0, [f"id{i}" for i in range(len(prompts))], prompts, seed=7)


def actor(**options) -> GenerationActor:
    return GenerationActor(1, 3, EngineSpec("standin", options=options), SamplingParams(2, 5, 1.0, 1.0, seed=0))


def test_outputs_are_columnar_and_capped():
    a = actor(lengths={"short": 2, "long": 9})
    assert a.ready() is None
    (out,) = a.generate([item(0, ["short", "long"])], None)
    # n = 2 samples per prompt; "long" (9 tokens) is cut at max_new_tokens = 5
    assert out.lengths.tolist() == [2, 2, 5, 5] and out.stopped.tolist() == [True, True, False, False]
    assert out.token_ids.size == out.logprobs.size == 14
    assert (out.task_id, out.minibatch_id, out.gu, out.actor, out.policy_version) == (0, 100, 1, 3, 0)
    assert out.prompt_ids == ["id0", "id1"] and out.padding_rate == pytest.approx(1 - 3.5 / 5)


def test_reload_happens_before_the_next_minibatch_only_when_newer():
    a = actor()
    outs = a.generate([item(0, ["x"]), item(1, ["y"])], WeightUpdate(3, {"w": 1.0}))
    assert [o.policy_version for o in outs] == [3, 3]
    assert a.engine.weight_updates == 1 and outs[0].reload_s >= 0
    (again,) = a.generate([item(2, ["z"])], WeightUpdate(2, {"w": 0.0}))  # older: ignored
    assert again.policy_version == 3 and a.engine.weight_updates == 1
    (sim,) = a.generate([item(3, ["z"])], WeightUpdate(4, None, simulated_load_s=0.01))
    assert sim.policy_version == 4 and sim.reload_s >= 0.01


def test_each_minibatch_is_sampled_with_its_own_seed():
    class Recorder(StandInEngine):
        def __init__(self) -> None:
            super().__init__()
            self.seen: list[SamplingParams] = []

        def generate(self, prompts, params):
            self.seen.append(params)
            return super().generate(prompts, params)

    a = GenerationActor(0, 0, Recorder, SamplingParams(2, 5, 0.7, 0.9, seed=0))
    a.generate([item(0, ["x"])], None)
    assert a.engine.seen == [SamplingParams(2, 5, 0.7, 0.9, seed=7)]  # the WorkItem's seed, the rest as sent


def test_engine_errors_become_failures_and_load_errors_are_reported():
    a = actor()
    bad = item(5, ["ok"])
    bad.prompts = ["ok", "extra"]  # 1 prompt id for 2 texts: the actor refuses to pack it
    results = a.generate([bad, item(6, ["fine"])], None)
    assert isinstance(results[0], Failure) and "ValueError" in results[0].reason
    assert results[0].task_id == 5 and not isinstance(results[1], Failure)
    broken = GenerationActor(
        0, 0, EngineSpec("standin", options={"min_length": 0}), SamplingParams(1, 4, 1.0, 1.0, seed=0)
    )
    assert "min_length" in broken.ready()


def test_standin_lengths_are_stable_and_jitter_is_seeded():
    eng = StandInEngine(min_length=3, max_length=7, jitter=0.5)
    assert 3 <= eng.base_length("abc") <= 7
    assert eng.base_length("abc") == StandInEngine(min_length=3, max_length=7).base_length("abc")  # crc32, not hash()
    params = SamplingParams(n=4, max_new_tokens=100, seed=1, temperature=1.0, top_p=1.0)
    a = eng.generate(["abc"], params)
    b = eng.generate(["abc"], params)
    assert a[0].lengths == b[0].lengths


def test_simulated_trainer_protocol_ledger_and_restore(tmp_path):
    from .helpers import output

    q = TrainingQueue(global_batch_prompts=2, n_samples=2)
    q.put(output(0, ["a", "b"], [1, 2, 3, 4], version=0), now=0.0)
    batch, _ = q.take(step=1, now=1.0)
    trainer = functools.partial(SimulatedTrainer, 0.0, 0.5, str(tmp_path / "l.jsonl"))()
    assert isinstance(trainer, Trainer)
    result = trainer.step(batch)
    assert (result.step, result.version, result.state) == (1, 1, {"version": 1})
    assert result.weights == WeightUpdate(1, None, 0.5)
    line = json.loads((tmp_path / "l.jsonl").read_text())
    assert line["prompt_ids"] == ["a", "b"] and line["tokens"] == 10 and line["logprob_max"] == -1.0
    fresh = SimulatedTrainer(step_time_s=0.0, refresh_delay_s=0.5)
    assert fresh.restore({"version": 4}) == WeightUpdate(4, None, 0.5) and fresh.version == 4


def test_the_generation_unit_applies_pause_and_submit_calls_in_the_order_sent_whatever_order_ray_runs_them():
    """Ray does not keep an async actor's calls in order: a pause sent just before a resume can run after it (seen
    in a resumed run, which then stalled with minibatches queued in a paused GU). The sequence numbers undo that."""
    import asyncio

    from asp.runtime.generation import GenerationUnit

    async def scenario() -> GenerationUnit:
        unit = GenerationUnit(0, [], [], coalesce_below_s=0.05, max_chunk=16)
        await unit.submit([item(2, ["c"])], 1)  # overtook submit 0: waits for it
        assert list(unit.queue) == [] and not unit.work.is_set()
        await unit.submit([item(0, ["a"]), item(1, ["b"])], 0)
        await unit.submit([item(3, ["d"])], 2)
        await unit.set_paused(False, 1)  # the resume ran first ...
        await unit.set_paused(True, 0)  # ... the older pause is stale
        return unit

    unit = asyncio.run(scenario())
    assert [it.task_id for it in unit.queue] == [0, 1, 2, 3]
    assert not unit.paused and unit.work.is_set()  # the feeders would hand the queue out

    async def in_order() -> GenerationUnit:
        unit = GenerationUnit(0, [], [], coalesce_below_s=0.05, max_chunk=16)
        await unit.submit([item(0, ["a"])], 0)
        await unit.set_paused(True, 0)
        return unit

    unit = asyncio.run(in_order())
    assert unit.paused and not unit.work.is_set()  # a pause that arrives in order still holds the queue
