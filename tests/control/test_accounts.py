"""`asp.control.accounts.RunAccounts`, the core's book-keeping of the whole run across sessions, and the core's
two doors to it (`ControlCore.resume`, `ControlCore.take_segment`): a resumed session counts the earlier sessions in
every whole-run counter, record list, step list and queue trace, stamps its own records with its session number and
run time, and each segment holds only what is new since the previous one.

Run: ``.venv/bin/python -m pytest tests/control/test_accounts.py -q``
"""

from __future__ import annotations

import math

import numpy as np

from asp.control.accounts import RunAccounts
from asp.control.messages import GUReport

from .helpers import core, output, plan


def _run_to_the_end(c, start: float) -> None:
    """Dispatch everything, have it all come back from each GU's first actor, train until finished."""
    sent = c.dispatch(start)
    for g, items in sent.items():
        actor = c.gus[g].actor_ids[0]
        c.on_report(
            GUReport(g, [output(it, g, actor, c.version, start + 0.5, start + 1.0) for it in items]), start + 1
        )
    now = start + 1.0
    while not c.finished():
        assert c.maybe_train(now) is not None
        now += 1.0
        c.on_step(c.step + 1, c.version + 1, 0.5, now)


def test_resume_counts_the_earlier_sessions_prompts_trace_and_lag():
    accounts = RunAccounts(actor_ids=[0, 1, 2])
    assert accounts.by_actor == {0: 0, 1: 0, 2: 0} and math.isnan(accounts.lag_max)
    records = [
        {"gu": 0, "actor": 1, "prompts": 2},
        {"gu": 1, "actor": 2, "prompts": 3},
        {"gu": 0, "actor": 1, "prompts": 1},
    ]
    trace = [(0.0, 0.0), (4.0, 6.0)]
    accounts.resume(
        {"sessions": 1, "wall_s": 7.5, "lag_max": 2.0, "prompts_trained": 6}, records, [{"step": 1}], trace
    )
    assert (accounts.session, accounts.base, accounts.lag_max) == (1, 7.5, 2.0)
    assert dict(accounts.by_gu) == {0: 3, 1: 3} and accounts.by_actor == {0: 0, 1: 3, 2: 3}
    assert accounts.all_trace([(8.0, 2.0)]) == [(0.0, 0.0), (4.0, 6.0), (7.5, 0.0), (8.0, 2.0)]  # empty at the start
    assert accounts.total("prompts_trained", 4) == 10.0 and accounts.total("pauses", 1) == 1.0
    assert accounts.all_iterations([{"step": 2}]) == [{"step": 1}, {"step": 2}]
    accounts.count_lags(np.array([0.0, 1.0, 3.0]))
    assert (accounts.lag_sum, accounts.lag_count, accounts.lag_max) == (4.0, 3, 3.0)


def test_take_segment_hands_out_each_record_and_trace_entry_once():
    accounts = RunAccounts()
    records, trace = [{"a": 1}, {"a": 2}], [(0.0, 1.0)]
    assert accounts.take_segment(records, trace) == ([{"a": 1}, {"a": 2}], [(0.0, 1.0)])
    assert accounts.take_segment(records, trace) == ([], [])
    records.append({"a": 3})
    trace.append((1.0, 0.0))
    assert accounts.take_segment(records, trace) == ([{"a": 3}], [(1.0, 0.0)])


def test_a_resumed_core_reports_the_whole_run():
    first = core(p=plan(4, 2, k=1))  # 8 prompts: 2 steps of 4
    _run_to_the_end(first, 0.0)
    segment = first.take_segment()
    assert first.take_segment()["records"] == []  # handed out once
    assert segment["session"] == 0 and segment["totals"]["sessions"] == 1.0
    iterations = first.all_iterations()
    wall = segment["totals"]["wall_s"]

    second = core(p=plan(4, 2, k=1))
    second.restore_position(2, 2)
    second.resume(segment["totals"], segment["records"], iterations, segment["trace"])
    second.begin(100.0)
    _run_to_the_end(second, 100.0)
    m = second.summary_metrics()
    assert m["runtime/summary/prompts_trained"] == 16 and m["runtime/summary/minibatches"] == 8
    assert second.totals()["sessions"] == 2.0 and second.totals()["wall_s"] == wall + 3.0
    assert [it["step"] for it in second.all_iterations()] == [1, 2, 3, 4]
    records = second.all_records()
    assert [r["session"] for r in records] == [0] * 4 + [1] * 4
    assert (
        min(r["arrival_s"] for r in records[4:]) >= wall
    )  # run time: the second session starts where the first ended
    assert sum(second.accounts.by_actor.values()) == 16 and second.lag_max == first.lag_max
