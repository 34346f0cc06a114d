"""Partial rollouts in the Control Unit core (`asp.control.partial`, `Database.hold`, `ControlCore`): the online length
estimate, held tasks and continuation bookkeeping, lag by the oldest segment, exactly-once across duplicates,
failures, a lost GU and a checkpoint, and the simulator on the same core.

Run: ``.venv/bin/python -m pytest tests/control/test_partial.py -q``
"""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest

from asp.control.core import RuntimeFailure
from asp.control.database import Database, TaskState
from asp.control.messages import Failure, GUReport, MinibatchOutput, SegmentOutput, WorkItem
from asp.control.partial import PartialStore, expected_final_length
from asp.control.sender import enforce_lag_bound
from asp.control.settings import PartialSettings
from asp.sim.engine import Workload, simulate

from .helpers import core, plan, settings, sim_settings

BUDGET = 4
ON = PartialSettings(
    enabled=True, token_budget=BUDGET, continuation_order="fifo", max_rows=None, wait_for_full=False, oldest_first=True
)


def final_length(pid, sample: int) -> int:
    """Realized length of sample `sample` of prompt `pid` in these tests: prompt 1's second response is long."""
    return 10 if (int(pid) % 3 == 1 and sample == 1) else 2 + sample


def first_output(item: WorkItem, gu: int, actor: int, version: int, n: int = 2) -> MinibatchOutput:
    """What an actor returns for `item` under the budget: tokens ``100 * prompt + sample`` (repeated), log-prob
    ``-(position + 1) / 100``; responses longer than the budget unfinished."""
    final = np.asarray([final_length(p, s) for p in item.prompt_ids for s in range(n)])
    got = np.minimum(final, BUDGET)
    tokens = np.concatenate([np.full(k, 100 * int(item.prompt_ids[i // n]) + i % n) for i, k in enumerate(got)])
    logprobs = np.concatenate([-(np.arange(k) + 1) / 100 for k in got]).astype(np.float32)
    return MinibatchOutput(
        task_id=item.task_id,
        minibatch_id=item.minibatch_id,
        attempt=item.attempt,
        gu=gu,
        actor=actor,
        policy_version=version,
        prompt_ids=list(item.prompt_ids),
        n=n,
        lengths=got.astype(np.int32),
        stopped=final <= BUDGET,
        token_ids=tokens.astype(np.int32),
        logprobs=logprobs,
        prompt_tokens=np.full(len(item.prompt_ids), 5, np.int32),
        texts=[f"t{i}" for i in range(got.size)],
        gen_start=0.0,
        gen_end=1.0,
        finished=final <= BUDGET,
    )


def segment(item: WorkItem, gu: int, actor: int, version: int, n: int = 2, start: float = 1.0) -> SegmentOutput:
    """The next segment of every row of a continuation item (same token / log-prob pattern, positions go on)."""
    new, fin, toks, lps = [], [], [], []
    for r in item.rows:
        final = final_length(r.prompt_id, r.sample % n)
        k = min(final - r.generated, BUDGET)
        new.append(k)
        fin.append(r.generated + k >= final)
        toks.append(np.full(k, 100 * int(r.prompt_id) + r.sample % n))
        lps.append(-(np.arange(r.generated, r.generated + k) + 1) / 100)
    return SegmentOutput(
        cont_id=item.task_id,
        attempt=item.attempt,
        gu=gu,
        actor=actor,
        policy_version=version,
        task_ids=np.asarray([r.task_id for r in item.rows]),
        samples=np.asarray([r.sample for r in item.rows]),
        lengths=np.asarray(new, np.int32),
        finished=np.asarray(fin),
        stopped=np.asarray(fin),
        token_ids=np.concatenate(toks).astype(np.int32),
        logprobs=np.concatenate(lps).astype(np.float32),
        texts=[f"whole{r.sample}" for r in item.rows],
        gen_start=start,
        gen_end=start + 2.0,
    )


# ---- the online length estimate ---------------------------------------------------------------------------------
def test_expected_final_length_worked_example_and_bounds():
    # siblings 20 and 30: mu = ln 24.49, s = sqrt((2 * 0.2027^2 + 0.25) / 3) = 0.333; truncated at 64 -> 70.8
    assert expected_final_length(64, [20, 30], None, 160) == pytest.approx(70.82, abs=0.01)
    assert expected_final_length(64, [], None, 160) == 128.0  # nothing known: as much again
    assert expected_final_length(150, [], None, 160) == 160.0  # never past the cap
    # longer siblings or a longer prediction -> a longer estimate; always more than what is generated
    assert expected_final_length(64, [100, 120], None, 160) > expected_final_length(64, [20, 30], None, 160)
    assert expected_final_length(64, [], 100.0, 160) > expected_final_length(64, [], 30.0, 160) > 64


# ---- store and Database -----------------------------------------------------------------------------------------
def test_hold_take_merge_assemble_keep_tokens_logprobs_versions_and_time():
    db = Database(plan(4, 2), {p: f"prompt {p}" for p in range(8)}, max_attempts=3, seed=0)
    item = db.next_task(0)  # task 0: prompts 0, 1; prompt 1's sample 1 is 10 tokens long
    assert db.hold(first_output(item, gu=0, actor=1, version=3))
    assert db.tasks[0].state == TaskState.ISSUED and db.tasks[0].gu == -1 and db.issued_to(0) == []
    assert not db.hold(first_output(item, 0, 1, 3)) and db.duplicates == 1  # a second first output: dropped
    store = db.partials
    assert store.pool == [(0, 3)]
    (row,) = store.take(8, "fifo", db.prompts)
    assert (row.task_id, row.sample, row.prompt_id, row.prompt, row.generated) == (0, 3, 1, "prompt 1", 4)
    assert row.token_ids.tolist() == [101] * 4 and store.pool == []
    cont = WorkItem(0, -1, -1, 0, [], [], 0, BUDGET, [row])
    assert store.merge(segment(cont, 1, 2, version=4)) == []  # 8 of 10 tokens: back to the pool
    (row,) = store.take(8, "fifo", db.prompts)
    (out,) = store.merge(segment(WorkItem(1, -1, -1, 0, [], [], 0, BUDGET, [row]), 1, 2, version=5, start=5.0))
    assert out.lengths.tolist() == [2, 3, 2, 10] and out.stopped.all()
    assert out.token_ids[out.lengths[:3].sum() :].tolist() == [101] * 10
    assert out.logprobs[-10:] == pytest.approx(-(np.arange(10) + 1) / 100)  # each token its own log-prob, in order
    assert out.policy_version == 3  # the oldest segment counts for the lag
    assert out.sample_versions.tolist() == [[3, 3], [3, 3], [3, 3], [3, 5]] and out.split_responses == 1
    assert out.texts[3] == "whole3" and out.gen_s == pytest.approx(1.0 + 2.0 + 2.0)  # 1 s first call + 2 x 2 s
    assert out.padded_slots == 4 * 4 + 4 + 2  # first call 4 rows x 4, then 1 row x 4, then 1 row x 2
    assert out.padding_rate == pytest.approx(1 - 17 / 22)
    assert len(store) == 0 and db.complete(0) and db.n_issued == 0


def test_online_order_hands_out_the_longest_expected_remainder_first():
    store = PartialStore(cap=100)
    db = Database(plan(4, 2), {p: "x" for p in range(8)}, max_attempts=3, seed=0)
    out = first_output(db.next_task(0), 0, 0, 0)  # prompts 0, 1: prompt 1's sample 1 unfinished
    out.finished[:] = [True, False, False, False]  # pretend three are unfinished at 2, 2 and 4 tokens
    store.hold(out)
    assert store.pool == [(0, 1), (0, 2), (0, 3)]
    rows = store.take(2, "online", db.prompts)
    # prompt 0's sample 1 has a finished sibling of 2 tokens (expects ~3 more); prompt 1's have none (as much again)
    assert [(r.task_id, r.sample) for r in rows] == [(0, 3), (0, 2)] and store.pool == [(0, 1)]


def test_checkpoint_keeps_held_tasks_and_a_restored_database_continues_them():
    db = Database(plan(4, 2), {p: f"prompt {p}" for p in range(8)}, max_attempts=3, seed=0)
    item = db.next_task(0)
    db.hold(first_output(item, 0, 0, 2))
    (row,) = db.partials.take(8, "fifo", db.prompts)  # out at an actor when the checkpoint is written
    state = json.loads(json.dumps(db.state()))  # JSON-able
    again = Database(plan(4, 2), {p: f"prompt {p}" for p in range(8)}, max_attempts=3, seed=0)
    again.restore(state)
    assert again.tasks[0].state == TaskState.ISSUED and again.n_issued == 1 and 0 not in again.pending
    assert again.partials.pool == [(0, 3)] and not again.exhausted
    (row,) = again.partials.take(8, "fifo", again.prompts)
    assert row.token_ids.tolist() == [101] * 4 and row.generated == 4
    seg = segment(WorkItem(0, -1, -1, 0, [], [], 0, 8, [row]), 0, 0, 3)
    seg = SegmentOutput(**{**{k: getattr(seg, k) for k in seg.__slots__}, "finished": np.asarray([True])})
    (out,) = again.partials.merge(seg)
    assert out.policy_version == 2 and out.lengths.tolist() == [2, 3, 2, 8] and again.complete(0)
    with pytest.raises(ValueError, match="partial task 0"):  # a checkpoint that names a task this run does not have
        Database(plan(4, 2), {p: "x" for p in range(8)}, seed=0, max_attempts=3).restore(
            {**state, "consumed": {"0": 2}}
        )


def test_lag_bound_evicts_by_the_oldest_segment():
    c = core(settings(partial=ON, max_policy_lag=1, global_batch_prompts=2))
    db = c.db
    item = db.next_task(0)
    db.hold(first_output(item, 0, 0, version=0))
    (row,) = db.partials.take(8, "fifo", db.prompts)
    db.partials.merge(segment(WorkItem(0, -1, -1, 0, [], [], 0, BUDGET, [row]), 0, 0, version=2))
    (row,) = db.partials.take(8, "fifo", db.prompts)
    (out,) = db.partials.merge(segment(WorkItem(1, -1, -1, 0, [], [], 0, BUDGET, [row]), 0, 0, version=2))
    db.complete(out.task_id)
    c.tq.put(out, 0.0)
    # newest segment version 2 would be within the bound at version 3; the oldest (0) is not
    assert enforce_lag_bound(c.tq, db, version=3, bound=1, stale_samples="drop", now=0.0) == (2, 0)


# ---- the core -------------------------------------------------------------------------------------------------
def run_core(
    c, script_fail: bool = False, lose: bool = False, passes: list | None = None, segment_reload_s: float = 0.0
):
    """Drive the core to the end: every dispatched item completes on its GU in order (continuations as segments,
    each after a weight reload of `segment_reload_s`); optionally the first continuation fails once, or GU 1 is
    lost while it holds a continuation. `passes` collects each dispatch call's items, per GU, in the order the core
    sent them."""
    version, queues, sent, trained = 0, {0: [], 1: []}, [], []
    failed = lost = False
    for _ in range(500):
        for gu, items in c.dispatch(0.0).items():
            queues[gu].extend(items)
            sent.extend((gu, it) for it in items)
            if passes is not None:
                passes.append([it.is_continuation for it in items])
        batch = c.maybe_train(0.0)
        if batch is not None:
            version += 1
            trained.append((list(batch.prompt_ids), batch.versions.tolist()))
            c.on_step(version, version, 0.1, 0.0)
            continue
        if c.finished():
            return sent, trained
        gu = 0 if queues[0] else 1
        if lose and not lost and any(it.is_continuation for it in queues[1]):
            lost = True
            queues[1].clear()
            c.lose_gu(1, "node lost")
            continue
        item = queues[gu].pop(0)
        if item.is_continuation:
            if script_fail and not failed:
                failed = True
                report = GUReport(gu, failures=[Failure(item.task_id, 0, gu, 0, "boom", continuation=True)])
            else:
                seg = segment(item, gu, 0, version)
                seg.reload_s = segment_reload_s
                report = GUReport(gu, outputs=[seg])
        else:
            report = GUReport(gu, outputs=[first_output(item, gu, 0, version)])
        c.on_report(report, 0.0)
    raise AssertionError("the core did not finish")


@pytest.mark.parametrize("case", ["plain", "failure", "lost_gu"])
def test_core_trains_every_prompt_once_with_continuations_first(case):
    c = core(settings(partial=ON), plan(12, 2))
    passes: list[list[bool]] = []
    sent, trained = run_core(c, script_fail=case == "failure", lose=case == "lost_gu", passes=passes)
    counts = Counter(p for ids, _ in trained for p in ids)
    assert counts == Counter(range(24))  # exactly once
    assert all(it.budget == BUDGET for _, it in sent)
    conts = [it for _, it in sent if it.is_continuation]
    assert conts and all(r.generated >= BUDGET for it in conts for r in it.rows)
    assert all(flags == sorted(flags, reverse=True) for flags in passes)  # continuations first in every pass
    if case == "failure":
        assert c.db.failed_attempts == 1
    assert c.db.exhausted and len(c.db.partials) == 0


def test_a_reload_before_a_continuation_is_counted_and_recorded_on_its_first_tasks_minibatch():
    c = core(settings(partial=ON), plan(12, 2))
    sent, _ = run_core(c, segment_reload_s=0.5)
    continuations = sum(it.is_continuation for _, it in sent)
    summary = c.summary_metrics()
    assert continuations and summary["runtime/summary/reloads"] == continuations
    assert summary["runtime/summary/reload_time_mean_s"] == pytest.approx(0.5)
    records = c.all_records()
    assert sum(r["reload_s"] for r in records) == pytest.approx(0.5 * continuations)  # none lost, none twice
    assert sum(r["reload_s"] > 0 for r in records) == len({it.rows[0].task_id for _, it in sent if it.is_continuation})


def test_a_continuation_goes_out_before_new_minibatches_in_the_same_pass():
    """With room for several items on a GU, one dispatch sends the pooled continuation first, then new minibatches
    (the order in `ControlCore.dispatch`; swapping it fails here)."""
    c = core(settings(partial=ON, generation_units=1, gu_queue_target=4), plan(12, 2))
    (items,) = c.dispatch(0.0).values()
    assert not any(it.is_continuation for it in items)
    c.on_report(GUReport(0, outputs=[first_output(items[0], 0, 0, 0)]), 0.0)  # unfinished: its rows are pooled
    c.on_report(GUReport(0, outputs=[first_output(items[1], 0, 0, 0)]), 0.0)
    (again,) = c.dispatch(0.0).values()
    flags = [it.is_continuation for it in again]
    assert True in flags and False in flags, flags
    assert flags == sorted(flags, reverse=True), flags


def test_a_continuation_that_always_fails_stops_the_run():
    c = core(settings(partial=ON, max_attempts=2, generation_units=1, gu_queue_target=5), plan(4, 2))
    (items,) = c.dispatch(0.0).values()
    c.on_report(GUReport(0, outputs=[first_output(items[0], 0, 0, 0)]), 0.0)
    with pytest.raises(RuntimeFailure, match="continuing partial responses failed 2 times"):
        for _ in range(3):
            (conts,) = [[it for it in v if it.is_continuation] for v in c.dispatch(0.0).values() if v]
            fail = Failure(conts[0].task_id, 0, 0, 0, "boom", continuation=True)
            c.on_report(GUReport(0, failures=[fail]), 0.0)
    segment_dup = SegmentOutput(99, 0, 0, 0, 0, *(np.zeros(0, int),) * 7, [], 0.0, 0.0)
    before = c.db.duplicates
    c.on_report(GUReport(0, outputs=[segment_dup]), 0.0)  # an unknown continuation: dropped as a duplicate
    assert c.db.duplicates == before + 1


def test_partial_rollouts_need_async_mode():
    with pytest.raises(ValueError, match="need runtime.mode: async"):
        settings(partial=ON, mode="sync")


# ---- the simulator on the same core ---------------------------------------------------------------------------


class Gen:
    """Seconds = 0.01 per decode step (longest response) + 0.001 per row-step (static batching)."""

    def seconds(self, prompts, n_samples, max_length, total_tokens, prompt_tokens) -> float:
        return 0.01 * max_length + 0.001 * prompts * n_samples * max_length


class Train:
    load_s = save_s = convert_s = 0.0

    def step_seconds(self, tokens: float, samples: float = 0.0) -> float:
        return 0.05

    def publish_seconds(self) -> float:
        return 0.0


def test_simulator_trains_every_prompt_once_and_tokens_match_without_partial():
    p = plan(8, 2)
    lengths = np.random.default_rng(0).integers(1, 17, (16, 2))
    work = Workload.from_arrays(p.prompt_ids(), lengths, np.full(16, 3), max_new_tokens=16)
    off = simulate(p, work, Gen(), Train(), sim_settings(False))
    for order in ("fifo", "online"):
        on = simulate(p, work, Gen(), Train(), sim_settings(True, order))
        m = on.metrics
        assert m["runtime/summary/prompts_trained"] == 16 == off.metrics["runtime/summary/prompts_trained"]
        assert sorted(r["task_id"] for r in on.minibatches) == list(range(8))
        assert sum(r["tokens"] for r in on.minibatches) == int(lengths.sum())
        assert m["runtime/summary/continuations"] > 0 and 0 <= m["runtime/summary/split_response_share"] <= 1
    assert off.metrics["runtime/summary/continuations"] == 0
    assert off.metrics["runtime/summary/split_response_share"] == 0


def test_wait_for_full_sends_only_full_continuation_calls_until_no_new_minibatch_is_left():
    full = PartialSettings(
        enabled=True,
        token_budget=BUDGET,
        continuation_order="online",
        max_rows=3,
        wait_for_full=True,
        oldest_first=True,
    )
    c = core(settings(partial=full), plan(12, 2))
    sent, trained = run_core(c)
    assert Counter(p for ids, _ in trained for p in ids) == Counter(range(24))
    conts = [(it, n_new) for (_, it), n_new in zip(sent, _new_work_left(sent, c), strict=True) if it.is_continuation]
    assert conts and all(len(it.rows) == 3 for it, left in conts if left)  # full while new minibatches were left
    assert any(len(it.rows) < 3 for it, left in conts if not left)  # the rest flushed at the end of the pass


def _new_work_left(sent, c) -> list[bool]:
    """Per sent item: whether a never-issued minibatch was still left after it (the tasks are issued in id order)."""
    last_new = max(i for i, (_, it) in enumerate(sent) if not it.is_continuation)
    return [i < last_new for i in range(len(sent))]
