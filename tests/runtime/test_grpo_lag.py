"""Bounded policy lag without Ray: queue eviction, Database regeneration, config checks; then on the shared
Ray cluster with the stand-in engine and a gated simulated trainer (it waits until the samples it needs are
stale), both `stale_samples` modes keep the bound and drop / regenerate exactly the stale prompts."""

from __future__ import annotations

import functools
from collections import Counter

import pytest
from pydantic import ValidationError

from asp.runtime import Database, EngineSpec, RuntimeFailure, TrainingQueue, run_async
from asp.trainers import SimulatedTrainer

from .helpers import GatedStandIn, GatedTrainer, after_prompts_generated, fast_config, make_plan, output, read_ledger


def test_evict_older_removes_only_stale_untaken_prompts():
    q = TrainingQueue(global_batch_prompts=3, n_samples=2)
    q.put(output(0, ["a", "b"], [1, 1, 1, 1], version=1), 0.0)
    q.put(output(1, ["c", "d"], [1, 1, 1, 1], version=3), 0.0)
    q.put(output(2, ["e", "f"], [1, 1, 1, 1], version=2), 0.0)
    batch, consumed = q.take(1, 1.0)  # a, b, c: task 0 fully, task 1 one prompt
    assert consumed == [(0, 2), (1, 1)]
    # min version 3: task 2 (version 2) goes with both prompts; task 1 (version 3, "d" left) stays
    assert q.evict_older(3, 2.0) == [(2, 2)]
    assert q.depth == 1 and q.trace[-1] == (2.0, 1)
    assert q.evict_older(4, 3.0) == [(1, 1)] and q.depth == 0  # only its untaken prompt "d"
    assert q.evict_older(9, 4.0) == []


def test_regenerated_task_restarts_at_its_first_untrained_prompt_and_keeps_its_attempts():
    plan, prompts = make_plan(2, 3)
    db = Database(plan, prompts, max_attempts=2, seed=0)
    (t0, t1) = db.next_unit(0)
    db.complete(t0.task_id)
    db.mark_consumed(t0.task_id, 1)  # prompt 0 trained, prompts 1-2 became stale in the queue
    db.regenerate(t0.task_id)
    (again,) = db.next_unit(0)  # goes first, like a retry
    assert again.task_id == t0.task_id and again.prompt_ids == [1, 2] and again.attempt == 1
    assert db.fail(again.task_id, again.attempt, "boom")  # 1 real failure of 2 allowed: not given up
    with pytest.raises(ValueError, match="only a done task"):
        db.regenerate(t1.task_id)


def test_lag_params_are_checked():
    with pytest.raises(ValidationError, match="max_policy_lag"):
        fast_config(queue={"max_policy_lag": -1})
    with pytest.raises(ValidationError, match="stale_samples"):
        fast_config(queue={"stale_samples": "keep"})


def ledger_lags(path):
    """(prompt id, lag) of every trained prompt: trainer version at consumption (step - 1) - sample version."""
    return [
        (pid, line["step"] - 1 - v)
        for line in read_ledger(path)
        for pid, v in zip(line["prompt_ids"], line["versions"], strict=True)
    ]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["drop", "regenerate"])
def test_the_lag_bound_holds_end_to_end(ray_cluster, tmp_path, mode):
    # The trainer holds step 1 until the engines generated all 32 prompts, so every first attempt is generated
    # with version 0 whatever the speeds: step 1 trains 4 of them (lag 0), step 2 four more (lag 1 = the bound),
    # and at version 2 the other 24 are stale, however many of them the driver has ingested by then.
    plan, prompts = make_plan(16, 2)  # 32 prompts, batches of 4
    ledger, gate_dir = tmp_path / "ledger.jsonl", str(tmp_path / "gate")
    cfg = fast_config(
        global_batch_prompts=4, queue={"q_max": 32, "max_policy_lag": 1, "stale_samples": mode, "gu_queue_target": 2}
    )
    summary = run_async(
        plan,
        prompts,
        GatedStandIn(gate_dir),
        cfg,
        trainer_factory=functools.partial(
            GatedTrainer, gate_dir, functools.partial(after_prompts_generated, prompts=32), str(ledger)
        ),
    )
    lines = read_ledger(ledger)
    assert [line["versions"] for line in lines[:2]] == [[0] * 4, [0] * 4]  # lags 0 and 1
    lags = ledger_lags(ledger)
    assert max(lag for _, lag in lags) <= 1  # the bound, for every trained prompt
    assert all(it["runtime/policy_lag_max"] <= 1 for it in summary.iterations)
    counts = Counter(pid for pid, _ in lags)
    m = summary.metrics
    if mode == "regenerate":
        assert counts == Counter(range(32))  # every prompt trained exactly once
        assert m["runtime/summary/stale_regenerated_prompts"] >= 24 and m["runtime/summary/stale_dropped_prompts"] == 0
        regenerated = [r for r in summary.minibatches if r["attempt"] > 0]
        assert len(regenerated) >= 12 and all(r["policy_version"] >= 2 for r in regenerated)  # with newer weights
        assert all(min(line["versions"]) >= 2 for line in lines[2:])
    else:
        assert m["runtime/summary/stale_dropped_prompts"] == 24 and m["runtime/summary/stale_regenerated_prompts"] == 0
        assert len(lines) == 2 and sorted(counts.values()) == [1] * 8  # 8 trained once, 24 dropped, none twice
        assert m["runtime/summary/prompts_trained"] == 8 and summary.finished


@pytest.mark.slow
def test_a_failing_trainer_stops_the_run_with_its_error(ray_cluster, tmp_path):
    plan, prompts = make_plan(4, 2)
    broken = functools.partial(SimulatedTrainer, 0.0, 0.0, str(tmp_path))  # its ledger "file" is a directory
    with pytest.raises(RuntimeFailure, match=r"Training Unit failed at step 1: IsADirectoryError"):
        run_async(plan, prompts, EngineSpec("standin"), fast_config(), trainer_factory=broken)
