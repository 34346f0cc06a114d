"""Partial rollouts under a lag bound (issue 37): a held minibatch that could no longer train is never continued (the
core drops or regenerates it and counts its prompts per length bucket), the oldest held work is continued first, and
the online order reads the current plan's loads after a re-plan and a resume.

Run: ``.venv/bin/python -m pytest tests/control/test_partial_stale.py -q``
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import replace

import numpy as np
import pytest

from asp.control.database import Database, TaskState
from asp.control.messages import GUReport
from asp.control.partial import PartialStore, length_bucket, prompt_buckets
from asp.control.plan import WorkPlan
from asp.sim.engine import Workload, simulate

from .helpers import core, plan, settings, sim_settings
from .test_partial import ON, Gen, Train, first_output, segment

CAP = 16  # max_new_tokens here: the buckets are quarters of it (q1 < 4 tokens, q2 4..7, q3 8..11, q4 12..16)


def test_length_bucket_is_the_quarter_of_max_new_tokens_of_the_longest_response():
    assert [length_bucket(x, CAP) for x in (0, 3, 4, 8, 12, 16)] == ["q1", "q1", "q2", "q3", "q4", "q4"]
    # two prompts x n = 2: longest 3 (q1) and 9 (q3); `first` skips prompts already trained
    assert prompt_buckets(np.asarray([3, 1, 9, 2]), 2, CAP) == {"q1": 1, "q3": 1}
    assert prompt_buckets(np.asarray([3, 1, 9, 2]), 2, CAP, first=1) == {"q3": 1}


def _held_then_two_steps(stale_samples: str, train_second: bool = True):
    """A core (lag bound 1, batches of 2 prompts, cap 16) where task 0's first output is held at version 0 (prompt
    1's second response unfinished at 4 tokens) and tasks 1 and 2 complete and train steps 1 and 2 before the next
    dispatch; without `train_second`, step 2 is still in flight."""
    s = settings(partial=ON, max_policy_lag=1, stale_samples=stale_samples, global_batch_prompts=2, max_new_tokens=CAP)
    c = core(s, plan(6, 2))
    items = {it.task_id: (gu, it) for gu, its in c.dispatch(0.0).items() for it in its}
    assert not any(it.is_continuation for _, it in items.values())
    for task_id, step in ((0, None), (1, 1), (2, 2)):
        gu, item = items[task_id]
        out = first_output(item, gu, 0, version=0)
        if task_id:  # tasks 1 and 2 complete in their first call
            out.finished[:], out.stopped[:] = True, True
        c.on_report(GUReport(gu, outputs=[out]), 0.0)
        if step is not None and c.maybe_train(0.0) is not None and (step == 1 or train_second):
            c.on_step(step, step, 0.1, 0.0)
    assert 0 in c.db.partials.tasks and c.db.partials.pool == [(0, 3)]
    c.left = [(gu, it) for t, (gu, it) in items.items() if t > 2]  # dispatched, not reported yet
    return c


def _finish(c, queue: list) -> list:
    """Drive the core to the end (every item completes in order, in the version the trainer is at); returns the
    prompt ids of each trained batch."""
    trained = []
    for _ in range(500):
        queue.extend((gu, it) for gu, its in c.dispatch(0.0).items() for it in its)
        batch = c.maybe_train(0.0)
        if batch is not None:
            trained.append(list(batch.prompt_ids))
            c.on_step(c.step + 1, c.version + 1, 0.1, 0.0)
            continue
        if c.finished():
            return trained
        gu, item = queue.pop(0)
        make = segment if item.is_continuation else first_output
        c.on_report(GUReport(gu, outputs=[make(item, gu, 0, c.version)]), 0.0)
    raise AssertionError("the core did not finish")


@pytest.mark.parametrize("train_second", [True, False])  # trainer at version 2, or at 1 with step 2 in flight
def test_a_held_minibatch_over_the_lag_bound_is_dropped_not_continued(train_second):
    c = _held_then_two_steps("drop", train_second)
    batches = c.dispatch(0.0)
    sent = [it for its in batches.values() for it in its]
    assert not [r for it in sent for r in it.rows if r.task_id == 0]  # no engine time on rows that cannot train
    assert 0 not in c.db.partials.tasks and c.db.partials.pool == []
    assert c.db.tasks[0].state == TaskState.DONE and c.db.tasks[0].consumed == 2  # its prompts consumed, untrained
    metrics = c.summary_metrics()
    # prompt 0's responses 2 and 3 tokens (q1), prompt 1's longest 4 tokens so far (q2)
    assert metrics["runtime/summary/stale_dropped_prompts_q1"] == 1
    assert metrics["runtime/summary/stale_dropped_prompts_q2"] == 1
    assert metrics["runtime/summary/stale_dropped_prompts"] == 2 == metrics["runtime/summary/stale_held_prompts"]
    assert metrics["runtime/summary/stale_wasted_tokens"] == 2 + 3 + 2 + 4  # what the held responses had
    if not train_second:
        c.on_step(2, 2, 0.1, 0.0)
    trained = _finish(c, c.left + [(gu, it) for gu, its in batches.items() for it in its])
    assert Counter(p for ids in trained for p in ids) == Counter(range(6, 12))  # steps 1, 2 trained 2..5; 0, 1 never


def test_a_held_minibatch_over_the_lag_bound_is_regenerated_from_scratch():
    c = _held_then_two_steps("regenerate")
    sent = [it for its in c.dispatch(0.0).values() for it in its]
    again = [it for it in sent if it.task_id == 0 and not it.is_continuation]
    assert len(again) == 1 and list(again[0].prompt_ids) == [0, 1]  # whole, with the current weights
    assert not [r for it in sent for r in it.rows if r.task_id == 0] and 0 not in c.db.partials.tasks
    metrics = c.summary_metrics()
    assert metrics["runtime/summary/stale_regenerated_prompts"] == 2
    assert metrics["runtime/summary/stale_regenerated_prompts_q1"] == 1
    assert metrics["runtime/summary/stale_regenerated_prompts_q2"] == 1


def test_held_work_within_the_bound_is_continued():
    c = _held_then_two_steps("drop")
    c.settings = replace(c.settings, max_policy_lag=2)  # lag 2 of 2 when it comes back: still trains
    sent = [it for its in c.dispatch(0.0).values() for it in its]
    assert [(r.task_id, r.sample) for it in sent for r in it.rows] == [(0, 3)]


def test_under_a_lag_bound_the_oldest_held_work_is_continued_first():
    db = Database(plan(4, 2), {p: "x" for p in range(8)}, max_attempts=3, seed=0)
    store = db.partials
    new, _, old = db.next_task(0), db.next_task(0), db.next_task(0)  # prompts 0, 1 and 4, 5: one long response each
    store.hold(first_output(new, 0, 0, version=3))  # arrives first, from a newer policy
    store.hold(first_output(old, 0, 0, version=1))
    rows = store.take(1, "fifo", db.prompts)
    assert [r.task_id for r in rows] == [new.task_id]  # arrival order
    store.release(rows, failed=False)
    store.age_first = True
    assert [r.task_id for r in store.take(1, "fifo", db.prompts)] == [old.task_id]


def test_the_online_order_reads_the_current_plans_loads_after_a_replan_and_a_resume():
    texts = {p: f"prompt {p}" for p in range(8)}
    original = WorkPlan.from_lists([[0, 1], [2, 3], [4, 5], [6, 7]], predicted={p: 10.0 for p in range(8)})
    db = Database(original, texts, max_attempts=3, seed=0)
    db.next_task(0)
    loads = {p: 100.0 + p for p in range(2, 8)}
    rest = WorkPlan.from_lists([[6, 7], [4, 5], [2, 3]], [0, 0, 1], [3, 2, 1], predicted=loads)
    db.replan(rest, None)
    assert db.partials.predicted[5] == 105.0 and db.partials.predicted[0] == 10.0
    again = Database(original, texts, max_attempts=3, seed=0)
    again.restore(json.loads(json.dumps(db.state())))  # the checkpoint keeps the re-plan's loads
    assert again.partials.predicted == db.partials.predicted
    again.next_task(0)  # task 0 (prompts 0, 1) was out, untrained: issued again first
    item = again.next_task(0)
    assert list(item.prompt_ids) == [6, 7]
    out = first_output(item, 0, 0, version=0)
    out.finished[:] = False
    store = again.partials
    store.cap = 1000
    store.hold(out)
    with_loads = store.expected_remaining(item.task_id, 2)
    store.predicted = {}
    assert with_loads > store.expected_remaining(item.task_id, 2)  # 107-token prediction, not "as much again"


def test_a_store_without_a_bound_has_no_stale_tasks():
    store = PartialStore()
    assert store.stale_tasks(10, None) == []


@pytest.mark.parametrize("stale", ["drop", "regenerate"])
def test_the_simulator_on_the_same_core_retires_stale_held_work_and_loses_no_prompt(stale):
    # every held minibatch is stale once a step trained
    cfg = sim_settings(True, sampling={"max_new_tokens": CAP}, queue={"max_policy_lag": 0, "stale_samples": stale})
    p = plan(8, 2)
    lengths = np.random.default_rng(0).integers(1, CAP + 1, (16, 2))
    work = Workload.from_arrays(p.prompt_ids(), lengths, np.full(16, 3), max_new_tokens=CAP)
    m = simulate(p, work, Gen(), Train(), cfg).metrics
    held = m["runtime/summary/stale_held_prompts"]
    assert held > 0  # retired while held, before a continuation
    kind = "dropped" if stale == "drop" else "regenerated"
    buckets = sum(m[f"runtime/summary/stale_{kind}_prompts_q{i}"] for i in range(1, 5))
    assert buckets == m[f"runtime/summary/stale_{kind}_prompts"] >= held
    if stale == "drop":
        assert m["runtime/summary/prompts_trained"] + m["runtime/summary/stale_dropped_prompts"] == 16
    else:
        assert m["runtime/summary/prompts_trained"] == 16  # regenerated from scratch, all trained in the end
