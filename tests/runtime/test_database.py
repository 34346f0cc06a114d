"""Database state machine: dispatch units, retry, idempotent completion, epochs, checkpoint state."""

from __future__ import annotations

import pytest

from asp.runtime import Database, TaskState, WorkPlan


def plan_and_prompts():
    # 5 minibatches in dispatch order, groups [0, 0, 1, 1, 2]; minibatch p holds prompts "a<p>", "b<p>".
    plan = WorkPlan.from_lists([[f"a{p}", f"b{p}"] for p in range(5)], [0, 0, 1, 1, 2], [40, 41, 42, 43, 44])
    prompts = {pid: f"text of {pid}" for mb in plan.minibatches for pid in mb}
    return plan, prompts


def test_units_follow_groups_and_carry_texts():
    plan, prompts = plan_and_prompts()
    db = Database(plan, prompts, max_attempts=3, seed=0)
    units = [db.next_unit(gu=0) for _ in range(4)]
    assert [[it.task_id for it in u] for u in units] == [[0, 1], [2, 3], [4], []]
    first = units[0][0]
    assert (first.minibatch_id, first.group_id, first.attempt) == (40, 0, 0)
    assert first.prompts == ["text of a0", "text of b0"]
    assert db.count(TaskState.ISSUED) == 5 and db.n_issued == 5
    assert not db.exhausted


def test_fail_retries_first_with_same_seed_then_gives_up():
    plan, prompts = plan_and_prompts()
    db = Database(plan, prompts, max_attempts=2, seed=0)
    first = db.next_unit(gu=0)[0]
    assert db.fail(first.task_id, 0, "boom")
    assert db.tasks[0].state == TaskState.FAILED
    retry = db.next_unit(gu=1)  # retries go before the next group, alone
    assert [(it.task_id, it.attempt) for it in retry] == [(0, 1)]
    assert retry[0].seed == first.seed  # a re-issued minibatch samples the same way
    assert db.fail(0, 0, "late failure of the old attempt") is True  # stale: ignored
    assert db.tasks[0].state == TaskState.ISSUED
    assert db.fail(0, 1, "boom again") is False  # 2 attempts used
    assert db.given_up[0].error == "boom again"


def test_completion_is_idempotent_and_late_results_win():
    plan, prompts = plan_and_prompts()
    db = Database(plan, prompts, max_attempts=3, seed=0)
    db.next_unit(gu=0)  # tasks 0, 1
    assert db.complete(0) is True
    assert db.complete(0) is False and db.duplicates == 1
    db.fail(1, 0, "actor died")  # task 1 waits for retry ...
    assert db.complete(1) is True  # ... but its first attempt's result still arrives: accepted once
    assert not db.retry
    assert [it.task_id for it in db.next_unit(gu=0)] == [2, 3]  # the retry queue no longer holds task 1


def test_exhausted_after_all_done_and_gu_lookup():
    plan, prompts = plan_and_prompts()
    db = Database(plan, prompts, max_attempts=3, seed=0)
    for gu in range(3):
        db.next_unit(gu=gu)
    assert [t.task_id for t in db.issued_to(1)] == [2, 3]
    for t in range(5):
        db.complete(t)
    assert db.exhausted and db.next_unit(gu=0) == []


def test_unbounded_epochs_cycle_the_schedule():
    plan, prompts = plan_and_prompts()
    db = Database(plan, prompts, epochs=None, max_attempts=3, seed=0)
    ids = [it.task_id for _ in range(4) for it in db.next_unit(gu=0)]
    # epoch 0 = tasks 0..4 (3 units), then epoch 1 starts with group 0 = tasks 5, 6
    assert ids == [0, 1, 2, 3, 4, 5, 6]
    assert db.tasks[5].rank == 0 and not db.exhausted


def test_checkpoint_state_keeps_only_trained_prompts():
    plan, prompts = plan_and_prompts()
    db = Database(plan, prompts, max_attempts=3, seed=0)
    for _ in range(3):
        db.next_unit(gu=0)
    for t in (0, 1, 2):
        db.complete(t)
    db.mark_consumed(0, 2)  # task 0 fully trained
    db.mark_consumed(1, 1)  # task 1: first prompt trained, second still in the queue
    state = db.state()
    assert state == {"epochs_created": 1, "consumed": {"0": 2, "1": 1}}

    fresh = Database(plan, prompts, max_attempts=3, seed=0)
    fresh.restore(state)
    assert fresh.tasks[0].state == TaskState.DONE
    unit = fresh.next_unit(gu=0)  # group 0 remainder: only task 1, cut to its untrained prompt
    assert [(it.task_id, it.prompt_ids) for it in unit] == [(1, ["b1"])]
    assert [it.task_id for it in fresh.next_unit(gu=0)] == [2, 3]  # done-but-untrained task 2 is redone
    fresh.mark_consumed(1, 1)
    assert fresh.state()["consumed"]["1"] == 2


def test_restore_rejects_impossible_counts():
    plan, prompts = plan_and_prompts()
    with pytest.raises(ValueError, match="trained 3 prompts"):
        Database(plan, prompts, max_attempts=3, seed=0).restore({"epochs_created": 1, "consumed": {"0": 3}})
