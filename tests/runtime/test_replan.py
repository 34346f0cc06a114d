"""Replanning the pending work mid-run (drift recalibration / re-profiling) and stopping a run early.

Pure Database tests: a replan swaps exactly the never-issued work (same prompt set, else ValueError naming the
difference), issued work keeps its plan, new tasks get fresh ids and plan version 2, later passes follow `full`,
and the exactly-once ledger holds across replan + partial training + `state()` / `restore()` (also through JSON).
One run on the shared local Ray cluster (stand-in engine, simulated trainer with a ledger): an observer stops the
run after a few minibatches (resumable checkpoint), the resume replans in `on_start` and is stopped again, and the
third session finishes: every prompt is trained exactly once.

Run: .venv/bin/python -m pytest tests/runtime/test_replan.py
"""

from __future__ import annotations

import functools
import json
from collections import Counter

import pytest

from asp.runtime import Database, EngineSpec, TaskState, WorkPlan, run_async
from asp.trainers import SimulatedTrainer

from .helpers import fast_config, make_plan, read_ledger


def plan_and_prompts(n: int = 6, k: int = 2) -> tuple[WorkPlan, dict[str, str]]:
    # n minibatches in dispatch order, groups of k; minibatch p holds prompts "a<p>", "b<p>".
    plan = WorkPlan.from_lists([[f"a{p}", f"b{p}"] for p in range(n)], [p // k for p in range(n)])
    return plan, {pid: f"text of {pid}" for mb in plan.minibatches for pid in mb}


def reversed_plan(db: Database, size: int = 3) -> WorkPlan:
    """The remaining prompts in reverse order, cut into minibatches of `size`, one group per minibatch."""
    ids = db.pending_prompts()[::-1]
    return WorkPlan.from_lists([ids[i : i + size] for i in range(0, len(ids), size)])


def train(db: Database, unit, counts: dict[int, int] | None = None) -> None:
    """Complete every item of `unit` and mark `counts[task]` (default: all) of its prompts trained."""
    for item in unit:
        db.complete(item.task_id)
        db.mark_consumed(item.task_id, (counts or {}).get(item.task_id, len(item.prompt_ids)))


def drain(db: Database) -> list:
    """Issue, complete and fully train everything left; return the issued items in order."""
    items = []
    while unit := db.next_unit(gu=0):
        train(db, unit)
        items.extend(unit)
    return items


def test_replan_swaps_only_pending_work_keeping_the_prompt_set():
    plan, prompts = plan_and_prompts()
    db = Database(plan, prompts, max_attempts=3, seed=0)
    issued = db.next_unit(gu=0)  # tasks 0, 1 are out (generating): the replan must not touch them
    assert db.pending_minibatches() == [[f"a{p}", f"b{p}"] for p in range(2, 6)]
    rest = reversed_plan(db)
    assert db.replan(rest) == 2 and db.plan_version() == 2
    assert [db.tasks[t].state for t in range(6)] == [TaskState.ISSUED] * 2 + [TaskState.REPLACED] * 4
    train(db, issued)
    after = drain(db)
    assert [it.task_id for it in after] == [6, 7, 8]  # ids continue after the largest one so far
    assert [it.prompt_ids for it in after] == [list(mb) for mb in rest.minibatches]
    assert sorted(pid for it in after for pid in it.prompt_ids) == sorted(db.original.prompt_ids()[4:])
    assert [db.plan_version(t) for t in (0, 1, 6, 7, 8)] == [1, 1, 2, 2, 2]
    assert db.trained_counts() == dict.fromkeys(plan.prompt_ids(), 1) and db.exhausted
    assert db.complete(3) is False  # a replaced task never completes


def test_replan_follows_the_new_groups_and_keeps_seeds_per_task():
    plan, prompts = plan_and_prompts()
    db = Database(plan, prompts, max_attempts=3, seed=0)
    seeds = {it.task_id: it.seed for it in Database(plan, prompts, max_attempts=3, seed=0).next_unit(gu=0)}
    first = db.next_unit(gu=0)
    assert {it.task_id: it.seed for it in first} == seeds  # without a replan nothing changes
    ids = db.pending_prompts()
    db.replan(WorkPlan.from_lists([ids[:2], ids[2:4], ids[4:6], ids[6:]], [0, 0, 0, 1], [9, 8, 7, 6]))
    unit = db.next_unit(gu=1)  # the new group 0 is one dispatch unit of three minibatches
    assert [(it.task_id, it.minibatch_id, it.group_id) for it in unit] == [(6, 9, 0), (7, 8, 0), (8, 7, 0)]
    assert len({it.seed for it in [*first, *unit]}) == 5


def test_wrong_prompt_set_is_refused_naming_the_difference():
    plan, prompts = plan_and_prompts()
    db = Database(plan, prompts, max_attempts=3, seed=0)
    db.next_unit(gu=0)
    ids = db.pending_prompts()
    with pytest.raises(ValueError, match=r"lacks 1 \(e.g. \['b5'\]\) and has 1 others \(e.g. \['a0'\]\)"):
        db.replan(WorkPlan.from_lists([ids[:-1] + ["a0"]]))  # a0 is issued already, b5 is left out
    with pytest.raises(ValueError, match="remaining prompts"):
        db.replan(None)
    assert db.plan_version() == 1 and db.pending_prompts() == ids  # nothing changed


def test_exactly_once_across_replan_partial_training_and_restore():
    plan, prompts = plan_and_prompts()
    db = Database(plan, prompts, max_attempts=3, seed=0)
    train(db, db.next_unit(gu=0), {0: 2, 1: 1})  # task 1 trained one prompt; b1 was still queued
    resumed = Database(plan, prompts, max_attempts=3, seed=0)
    resumed.restore(json.loads(json.dumps(db.state())))
    assert resumed.pending_prompts() == ["b1", *plan.prompt_ids()[4:]]  # the untrained suffix of task 1 too
    resumed.replan(reversed_plan(resumed))
    assert resumed.state()["consumed"] == {"0": 2, "1": 1}  # the replaced partial task keeps its trained prefix
    train(resumed, resumed.next_unit(gu=0), {6: 2})  # 2 of the first new minibatch's 3 prompts trained
    resumed.next_unit(gu=0)  # issued, never trained: pending again after the restore
    pending = (resumed.state(), [t for t in resumed.tasks if resumed.tasks[t].consumed < 3 and t >= 6])

    again = Database(plan, prompts, max_attempts=3, seed=0)
    again.restore(json.loads(json.dumps(pending[0])))
    assert list(again.pending) == pending[1] == [6, 7, 8]
    assert again.pending_minibatches()[0] == list(resumed.plans[2][0].minibatches[0][2:])
    assert [again.plan_version(t) for t in again.pending] == [2, 2, 2] and again.plan_version() == 2
    assert again.state() == pending[0]  # the restored position saves the same way
    drain(again)
    assert again.trained_counts() == dict.fromkeys(plan.prompt_ids(), 1) and again.exhausted


def test_later_passes_use_the_full_plan():
    plan, prompts = plan_and_prompts(4)
    db = Database(plan, prompts, epochs=2, max_attempts=3, seed=0)
    db.next_unit(gu=0)  # tasks 0, 1 (group 0 of pass 0)
    full = WorkPlan.from_lists([["b3", "a3", "b2"], ["a2", "b1", "a1", "b0", "a0"]])
    assert db.replan(reversed_plan(db, 4), full) == 2
    items = drain(db)
    assert [it.task_id for it in items] == [4, 5, 6]  # rest (one minibatch) then pass 1 from `full`
    assert [it.prompt_ids for it in items[1:]] == [list(mb) for mb in full.minibatches]
    assert [db.plan_version(t) for t in (0, 4, 5, 6)] == [1, 2, 2, 2]
    with pytest.raises(ValueError, match="remaining prompts"):
        db.replan(full)  # nothing is pending: only `rest=None` fits
    assert db.replan(None) == 3


def test_replan_with_nothing_pending_changes_only_later_passes():
    plan, prompts = plan_and_prompts(2, k=2)
    db = Database(plan, prompts, epochs=None, max_attempts=3, seed=0)
    first = db.next_unit(gu=0)  # the whole pass is out
    assert db.pending_prompts() == [] and db.pending_plan() is None
    db.replan(None, WorkPlan.from_lists([["b1", "b0", "a1", "a0"]]))
    train(db, first)
    nxt = db.next_unit(gu=0)
    assert [(it.task_id, it.prompt_ids) for it in nxt] == [(2, ["b1", "b0", "a1", "a0"])]
    assert db.plan_version(2) == 2


def test_restore_of_a_multi_pass_run_replans_the_newest_pass():
    plan, prompts = plan_and_prompts(2, k=1)
    db = Database(plan, prompts, epochs=2, max_attempts=3, seed=0)
    for _ in range(3):
        db.next_unit(gu=0)  # pass 0 fully issued, pass 1 created and task 2 issued; nothing trained
    resumed = Database(plan, prompts, epochs=2, max_attempts=3, seed=0)
    resumed.restore(db.state())  # pass 0 and pass 1 both pending: a0 appears twice
    assert list(resumed.pending) == [0, 1, 2, 3]
    assert resumed.pending_prompts() == ["a0", "b0", "a1", "b1"]  # only pass 1: the prompt set stays unique
    assert resumed.pending_plan().group_ids == (0, 1)
    resumed.replan(reversed_plan(resumed, 4))
    assert [it.prompt_ids for it in drain(resumed)] == [["a0", "b0"], ["a1", "b1"], ["b1", "a1", "b0", "a0"]]


def test_state_without_replans_is_unchanged_and_restores():
    plan, prompts = plan_and_prompts()
    db = Database(plan, prompts, max_attempts=3, seed=0)
    train(db, db.next_unit(gu=0))
    assert db.state() == {"epochs_created": 1, "consumed": {"0": 2, "1": 2}}  # no new key when never replanned
    old = Database(plan, prompts, max_attempts=3, seed=0)
    old.restore({"epochs_created": 1, "consumed": {"0": 2, "1": 2}})
    assert list(old.pending) == [2, 3, 4, 5] and old.plan_version(2) == 1


# ---- on the shared local Ray cluster -----------------------------------------------------------------------
def stop_after(minibatches: int, reason: str):
    """An observer that asks the run to stop once it has ingested `minibatches` in this session."""
    seen: list[int] = []

    def observer(cu, out):
        seen.append(out.task_id)
        if len(seen) == minibatches:
            cu.request_stop(reason)

    return observer


@pytest.mark.slow
def test_stop_resume_with_replan_trains_every_prompt_once(ray_cluster, tmp_path):
    plan, prompts = make_plan(12, 3)  # 36 prompts, batches of 8
    run = functools.partial(
        run_async,
        plan,
        prompts,
        EngineSpec("standin", options={"seconds_per_call": 0.005}),
        fast_config(checkpoint_interval=2, queue={"gu_queue_target": 2}),
        trainer_factory=functools.partial(SimulatedTrainer, 0.0, 0.0, str(tmp_path / "ledger.jsonl")),
        checkpoint_dir=tmp_path / "ck",
    )
    first = run(observer=stop_after(4, "drift: tau fell"))
    state = json.loads((tmp_path / "ck" / "runtime_state.json").read_text())
    assert first.stopped == "drift: tau fell" and not first.finished and not state["finished"]
    assert state["trainer_step"] == first.trainer_step and any(e[1] == "stop" for e in first.events)
    assert first.trainer_step % 2 == 0  # stops at a checkpoint step, where a trainer writes its checkpoint too

    versions: list[int] = []

    def replan(cu):
        versions.append(cu.replan(reversed_plan(cu.db)))

    second = run(observer=stop_after(3, "again"), on_start=replan)
    assert versions == [2] and second.resumed_from_step == first.trainer_step and second.stopped == "again"
    assert second.trainer_step % 2 == 0
    generated = [r for r in second.minibatches if r["session"] == 1]  # the records cover the whole run
    assert {r["plan_version"] for r in generated} == {2}  # everything it generated came from the replan
    assert "replans" in json.loads((tmp_path / "ck" / "runtime_state.json").read_text())["database"]

    third = run()  # replays the replan from the checkpoint
    assert third.finished and third.stopped == "" and third.resumed_from_step == second.trainer_step
    assert {r["plan_version"] for r in third.minibatches if r["session"] == 2} == {2}
    ledger = read_ledger(tmp_path / "ledger.jsonl")
    assert Counter(pid for line in ledger for pid in line["prompt_ids"]) == Counter(range(36))
    assert [line["step"] for line in ledger] == list(range(1, third.trainer_step + 1))  # no step trained twice


def test_a_stop_between_checkpoints_trains_on_to_the_next_one(ray_cluster, tmp_path):
    """The runtime position may only be saved where the trainer checkpoints too (every `checkpoint_interval`
    steps): a stop asked for after step 1 with interval 3 ends the session at step 3, not 1."""
    plan, prompts = make_plan(12, 3)  # 36 prompts, batches of 8: 5 steps

    def stop_at_first_step(cu, metrics):
        if cu.step == 1:
            cu.request_stop("drift")

    summary = run_async(
        plan,
        prompts,
        EngineSpec("standin", options={"seconds_per_call": 0.005}),
        fast_config(checkpoint_interval=3, queue={"gu_queue_target": 2}),
        trainer_factory=functools.partial(SimulatedTrainer, 0.0, 0.0, str(tmp_path / "ledger.jsonl")),
        checkpoint_dir=tmp_path / "ck",
        on_iteration=stop_at_first_step,
    )
    state = json.loads((tmp_path / "ck" / "runtime_state.json").read_text())
    assert summary.stopped == "drift" and summary.trainer_step == 3 and state["trainer_step"] == 3
    assert not state["finished"] and [it["step"] for it in summary.iterations] == [1, 2, 3]
