"""The Generation Sender's policy (`plan_dispatch`) and the policy-lag bound (`enforce_lag_bound`) on hand-made
plans, Databases and Training Queues: which GU gets which dispatch unit, and what an eviction does to the
Database. Pure Python, no Ray cluster."""

from __future__ import annotations

import pytest

from asp.control.sender import GULoad, enforce_lag_bound, plan_dispatch
from asp.runtime import Database, TaskState, TrainingQueue, WorkPlan

from .helpers import output


def make_db(groups: list[int], size: int = 2, **kwargs) -> Database:
    """Minibatch p holds prompts "p<p>.0", "p<p>.1", ...; batch group of the p-th minibatch = groups[p]."""
    plan = WorkPlan.from_lists([[f"p{p}.{i}" for i in range(size)] for p in range(len(groups))], groups)
    return Database(
        plan, {pid: f"text {pid}" for mb in plan.minibatches for pid in mb}, **{"max_attempts": 3, "seed": 0, **kwargs}
    )


def task_ids(sent: dict) -> dict[int, list[int]]:
    return {gu: [it.task_id for it in items] for gu, items in sent.items()}


# ---- plan_dispatch ----------------------------------------------------------------------------------------


def test_least_loaded_gu_gets_the_next_whole_group():
    db = make_db([0, 0, 1, 1, 2, 2])
    loads = [GULoad(0, outstanding=3, target=4), GULoad(1, outstanding=0, target=4)]
    sent = plan_dispatch(db, loads)
    # GU 1 is 4 below its target, GU 0 only 1: GU 1 gets group 0 (tasks 0, 1) -> 2 below; still the furthest
    # below, it gets group 1 (tasks 2, 3) -> at target; then GU 0 (1 below) gets the whole group 2 even though
    # that takes it one past its target (a group is never split); now neither is below target.
    assert task_ids(sent) == {1: [0, 1, 2, 3], 0: [4, 5]}
    assert [(g.index, g.outstanding) for g in loads] == [(0, 5), (1, 4)]  # the loads are updated in place
    assert [db.tasks[t].gu for t in range(6)] == [1, 1, 1, 1, 0, 0]
    assert db.count(TaskState.ISSUED) == 6 and db.n_issued == 6
    assert [it.group_id for it in sent[1]] == [0, 0, 1, 1]


def test_ties_go_to_the_first_listed_gu():
    db = make_db([0, 1, 2])
    sent = plan_dispatch(db, [GULoad(3, 0, 1), GULoad(7, 0, 1)])
    # both 1 below target: the first listed (index 3) gets group 0, then GU 7 (still 1 below) gets group 1
    assert task_ids(sent) == {3: [0], 7: [1]}
    assert [t.task_id for t in db.issued_to(7)] == [1]


def test_targets_are_respected():
    db = make_db([0, 1, 2, 3, 4])
    full = [GULoad(0, outstanding=4, target=4), GULoad(1, outstanding=6, target=2)]  # at / above target
    assert plan_dispatch(db, full) == {}
    assert db.n_issued == 0 and [g.outstanding for g in full] == [4, 6]
    one = [GULoad(0, outstanding=1, target=3)]
    assert task_ids(plan_dispatch(db, one)) == {0: [0, 1]}  # exactly up to the target: 1 + 2 = 3
    assert one[0].outstanding == 3 and len(db.pending) == 3


def test_retries_go_first_and_alone():
    db = make_db([0, 0, 1, 1])
    first = plan_dispatch(db, [GULoad(0, 0, 2)])
    assert task_ids(first) == {0: [0, 1]}
    assert db.fail(1, 0, "actor died")  # task 1 goes back to the Database for a retry
    loads = [GULoad(0, outstanding=1, target=2), GULoad(1, outstanding=0, target=3)]
    sent = plan_dispatch(db, loads)
    # GU 1 (3 below) gets the retry of task 1 alone, at attempt 1; then (2 below) the next group 1 = tasks 2, 3
    assert task_ids(sent) == {1: [1, 2, 3]}
    assert [it.attempt for it in sent[1]] == [1, 0, 0]
    assert sent[1][0].prompt_ids == ["p1.0", "p1.1"] and db.tasks[1].gu == 1


def test_nothing_is_sent_when_the_database_is_empty():
    db = make_db([0, 1])
    assert task_ids(plan_dispatch(db, [GULoad(0, 0, 10)])) == {0: [0, 1]}
    loads = [GULoad(0, 2, 10), GULoad(1, 0, 10)]
    assert plan_dispatch(db, loads) == {}  # all issued, nothing pending or to retry
    assert [g.outstanding for g in loads] == [2, 0]
    assert plan_dispatch(db, []) == {}  # no live GU


def test_unbounded_epochs_keep_sending_the_schedule_again():
    db = make_db([0, 1], epochs=None)
    sent = plan_dispatch(db, [GULoad(0, 0, 5)])
    # epoch 0 = tasks 0, 1; epoch 1 = tasks 2, 3 (same minibatches); epoch 2 starts with task 4
    assert task_ids(sent) == {0: [0, 1, 2, 3, 4]}
    assert [it.prompt_ids for it in sent[0][2:4]] == [["p0.0", "p0.1"], ["p1.0", "p1.1"]]


# ---- enforce_lag_bound -----------------------------------------------------------------------------------


def queued(db: Database, versions: list[int]) -> TrainingQueue:
    """Issue and complete every task (one minibatch of 3 prompts each, n = 2) and queue task t's output as
    generated with versions[t]; global batches of 4 prompts."""
    tq = TrainingQueue(global_batch_prompts=4, n_samples=2)
    for t, version in enumerate(versions):
        (item,) = db.next_unit(gu=0)
        assert db.complete(item.task_id)
        tq.put(output(item.task_id, item.prompt_ids, [1] * 6, version=version), now=float(t))
    return tq


def test_drop_marks_the_stale_prompts_consumed_and_counts_them():
    db = make_db([0, 1, 2], size=3)
    tq = queued(db, versions=[1, 3, 2])
    batch, consumed = tq.take(step=1, now=5.0)  # 4 prompts: task 0's 3 and the first of task 1
    assert consumed == [(0, 3), (1, 1)]
    for task_id, count in consumed:  # what the Control Unit does when the step ends
        db.mark_consumed(task_id, count)
    # trainer version 3, bound 1: versions below 2 are stale -> only task 2 (version 2) and task 1 stay ...
    assert enforce_lag_bound(tq, db, version=3, bound=1, stale_samples="drop", now=6.0) == (0, 0)
    assert tq.depth == 5
    # ... version 4: task 2 (version 2) goes with its 3 prompts, task 1 (version 3) stays
    assert enforce_lag_bound(tq, db, version=4, bound=1, stale_samples="drop", now=7.0) == (3, 0)
    assert tq.depth == 2 and tq.trace[-1] == (7.0, 2)
    assert db.tasks[2].consumed == 3 and db.tasks[2].state == TaskState.DONE  # never trained, counted done
    # version 5: task 1's two untaken prompts go; its first prompt was trained already
    assert enforce_lag_bound(tq, db, version=5, bound=1, stale_samples="drop", now=8.0) == (2, 0)
    assert db.tasks[1].consumed == 3 and tq.depth == 0
    assert db.exhausted and not db.retry


def test_regenerate_requeues_the_task_from_its_first_untrained_prompt():
    db = make_db([0, 1], size=3)
    tq = queued(db, versions=[0, 0])
    _, consumed = tq.take(step=1, now=2.0)  # task 0 whole, task 1's first prompt
    for task_id, count in consumed:
        db.mark_consumed(task_id, count)
    # version 2, bound 1: task 1's two untaken prompts (version 0) are stale
    assert enforce_lag_bound(tq, db, version=2, bound=1, stale_samples="regenerate", now=3.0) == (0, 2)
    assert tq.depth == 0 and db.tasks[1].state == TaskState.FAILED and list(db.retry) == [1]
    assert not db.exhausted
    sent = plan_dispatch(db, [GULoad(0, 0, 4)])  # the regenerated task is sent again first
    (item,) = sent[0]
    assert (item.task_id, item.attempt, item.prompt_ids) == (1, 1, ["p1.1", "p1.2"])
    assert db.tasks[1].regenerations == 1 and db.tasks[1].consumed == 1


def test_bound_zero_keeps_only_the_current_version():
    db = make_db([0, 1, 2], size=3)
    tq = queued(db, versions=[2, 1, 2])
    assert enforce_lag_bound(tq, db, version=2, bound=0, stale_samples="drop", now=4.0) == (3, 0)
    assert [e.out.task_id for e in tq.entries] == [0, 2]


@pytest.mark.parametrize("mode", ["drop", "regenerate"])
def test_no_bound_does_nothing(mode):
    db = make_db([0, 1], size=3)
    tq = queued(db, versions=[0, 0])
    trace = list(tq.trace)
    assert enforce_lag_bound(tq, db, version=100, bound=None, stale_samples=mode, now=9.0) == (0, 0)
    assert tq.depth == 6 and tq.trace == trace
    assert [db.tasks[t].consumed for t in (0, 1)] == [0, 0] and not db.retry
