"""The synchronous baseline (``runtime.mode: sync``): generate one round with all actors, train, reload, repeat.

Pure parts: `Database.next_task` / `next_retry`, `plan_round` (single minibatches in dispatch order, spread
over the GUs, retries re-sent whatever the round needs) and `round_complete`. End to end on the shared local Ray
cluster with the stand-in engine and the simulated trainer (ledger): every trained sample has lag 0, no
minibatch is decoded while a step trains (event and minibatch timestamps, one clock on one host), every prompt
is trained exactly once over a pass, every actor decodes in every full round, and an interrupted sync run
resumes from its checkpoint.
"""

from __future__ import annotations

import functools
from collections import Counter

import pytest

from asp.control.database import Database
from asp.control.metrics import comparison_summary, generation_utilization
from asp.control.sender import GULoad, plan_round, round_complete
from asp.runtime import EngineSpec, WorkPlan, run_async
from asp.trainers import SimulatedTrainer

from .helpers import fast_config, read_ledger

SIZES = [3, 4] * 4 + [3]  # 31 prompts; rounds of >= 6 prompts: 3 + 4 = 7 four times, then the last 3


def uneven_plan(sizes: list[int] = SIZES, k: int = 2) -> tuple[WorkPlan, dict[int, str]]:
    """Minibatches of the given sizes over consecutive int prompt ids, groups of `k` minibatches."""
    bounds = [sum(sizes[:i]) for i in range(len(sizes) + 1)]
    mbs = [list(range(lo, hi)) for lo, hi in zip(bounds, bounds[1:], strict=False)]
    prompts = {i: " ".join(f"w{(i + j) % 40}" for j in range(i % 5 + 1)) + f" #{i}" for i in range(bounds[-1])}
    return WorkPlan.from_lists(mbs, [p // k for p in range(len(mbs))]), prompts


# ---- pure parts -------------------------------------------------------------------------------------------


def test_plan_round_issues_single_minibatches_until_a_batch_and_spreads_them():
    plan, prompts = uneven_plan()
    db = Database(plan, prompts, max_attempts=3, seed=0)
    loads = [GULoad(0, 0, 2), GULoad(1, 0, 2)]  # target = live actors
    sent, issued = plan_round(db, loads, want=10)
    # 3 + 4 + 3 = 10 prompts: three single tasks, not whole groups of k = 2 (which would issue four)
    assert issued == 10 and db.n_issued == 3
    assert {g: [it.task_id for it in items] for g, items in sent.items()} == {0: [0, 2], 1: [1]}
    assert [load.outstanding for load in loads] == [2, 1]
    assert not round_complete(db, issued, 10)  # still out
    for task_id in (0, 1, 2):
        db.complete(task_id)
    assert round_complete(db, issued, 10)


def test_plan_round_resends_failures_without_counting_them():
    plan, prompts = uneven_plan()
    db = Database(plan, prompts, max_attempts=3, seed=0)
    _, issued = plan_round(db, [GULoad(0, 0, 2)], want=6)
    assert issued == 7  # 3 + 4: the round may exceed the batch by part of a minibatch
    assert db.fail(1, 0, "actor died")
    assert not round_complete(db, issued, 6)  # a retry is waiting
    sent, more = plan_round(db, [GULoad(0, 1, 2)], want=6 - issued)
    assert more == 0 and [(it.task_id, it.attempt) for it in sent[0]] == [(1, 1)]
    db.complete(0)
    db.complete(1)
    assert round_complete(db, issued, 6)


def test_last_short_round_is_complete_when_no_new_task_is_left():
    plan, prompts = uneven_plan([3, 4])
    db = Database(plan, prompts, epochs=1, max_attempts=3, seed=0)
    _, issued = plan_round(db, [GULoad(0, 0, 2)], want=16)
    assert issued == 7 and not db.has_new_work
    db.complete(0)
    db.complete(1)
    assert round_complete(db, issued, 16) and db.exhausted
    assert plan_round(db, [GULoad(0, 0, 2)], want=16) == ({}, 0)


def test_next_task_starts_new_epochs_when_unbounded():
    plan, prompts = uneven_plan([3, 4])
    db = Database(plan, prompts, epochs=None, max_attempts=3, seed=0)
    ids = [db.next_task(0).task_id for _ in range(3)]
    assert ids == [0, 1, 2] and db.epochs_created == 2 and db.has_new_work


def test_generation_utilization_and_comparison_summary_by_hand():
    # 2 actors over 10 s decoded 3 + 4 + 5 = 12 s -> 12 / 20
    assert generation_utilization([3.0, 4.0, 5.0], actors=2, wall_s=10.0) == pytest.approx(0.6)
    assert generation_utilization([1.0], actors=0, wall_s=1.0) != generation_utilization([1.0], actors=0, wall_s=1.0)
    records = [{"gen_s": 3.0}, {"gen_s": 4.0}, {"gen_s": 5.0}]
    m = comparison_summary(records, [1.0, 2.0], (3.0, 6, 2.0), (2, 0.75), actors=2, wall_s=10.0, sync=True)
    assert m == {
        "runtime/generation_utilization": pytest.approx(0.6),
        "runtime/policy_lag_mean": 0.5,  # lag sum 3 over 6 trained prompts
        "runtime/policy_lag_max": 2.0,
        "runtime/train_step_mean_s": 1.5,
        "runtime/reload_time_mean_s": 0.375,  # 0.75 s over 2 reloads
        "runtime/reloads": 2.0,
        "runtime/mode_sync": 1.0,
    }


# ---- end to end -------------------------------------------------------------------------------------------


def trainer(tmp_path, step_s: float = 0.05, refresh_s: float = 0.01):
    return functools.partial(SimulatedTrainer, step_s, refresh_s, str(tmp_path / "ledger.jsonl"))


def sync_config(**overrides):
    """2 actors in one GU, rounds of >= 6 prompts, one minibatch per actor call (no coalescing)."""
    return fast_config(mode="sync", global_batch_prompts=6, **overrides, queue={"q_max": 6, "coalesce_below_s": 0.0})


ENGINE = EngineSpec("standin", options={"seconds_per_call": 0.03, "jitter": 0.5})


def step_intervals(events) -> dict[int, tuple[float, float]]:
    """Trainer step -> (batch handed over, step finished), seconds since the start (driver clock)."""
    start = {e[4]: e[0] for e in events if e[1] == "train"}
    return {step: (start[step], e[0]) for e in events if e[1] == "trained" for step in [e[4]]}


def test_sync_run_has_lag_0_no_overlap_and_trains_every_prompt_once(ray_cluster, tmp_path):
    plan, prompts = uneven_plan()
    summary = run_async(plan, prompts, ENGINE, sync_config(), trainer_factory=trainer(tmp_path))
    ledger = read_ledger(tmp_path / "ledger.jsonl")
    assert Counter(pid for line in ledger for pid in line["prompt_ids"]) == Counter(range(31))
    assert [len(line["prompt_ids"]) for line in ledger] == [7, 7, 7, 7, 3]  # whole rounds, >= 6 but the last
    for line in ledger:  # generated by the policy the step trains: lag 0 for every sample
        assert set(line["versions"]) == {line["step"] - 1}
    assert all(it["runtime/policy_lag_max"] == 0 for it in summary.iterations)
    m = summary.metrics
    assert m["runtime/summary/mode_sync"] == 1 and m["runtime/summary/policy_lag_max"] == 0
    assert m["runtime/summary/policy_lag_mean"] == 0 and 0 < m["runtime/summary/generation_utilization"] <= 1
    assert m["runtime/summary/prompts_trained"] == 31 and m["runtime/summary/pauses"] == 0
    # no minibatch is decoded while a step trains: each one ends before its step's batch is handed over and
    # starts after the previous step finished (its actor reloaded first)
    steps = step_intervals(summary.events)
    assert sorted(steps) == [1, 2, 3, 4, 5]
    for r in summary.minibatches:
        step = r["policy_version"] + 1  # the step that trains it
        assert r["gen_start_s"] + r["gen_s"] <= steps[step][0]
        if step > 1:
            assert r["gen_start_s"] >= steps[step - 1][1]
            assert r["reload_s"] >= 0.01  # one minibatch per actor and round: each loaded the new snapshot first
    # every actor decodes in every full round
    by_step: dict[int, set[int]] = {}
    for r in summary.minibatches:
        by_step.setdefault(r["policy_version"] + 1, set()).add(r["actor"])
    assert [by_step[s] for s in (1, 2, 3, 4)] == [{0, 1}] * 4


@pytest.mark.slow
def test_sync_run_resumes_from_its_checkpoint(ray_cluster, tmp_path):
    plan, prompts = uneven_plan()
    cfg = sync_config(checkpoint_interval=2)

    def interrupt(cu, metrics):
        if cu.step == 3:
            raise KeyboardInterrupt  # Ctrl-C after step 3; the checkpoint is at step 2

    with pytest.raises(KeyboardInterrupt):
        run_async(
            plan, prompts, ENGINE, cfg, trainer_factory=trainer(tmp_path), checkpoint_dir=tmp_path / "ck",
            on_iteration=interrupt,
        )  # fmt: skip
    summary = run_async(plan, prompts, ENGINE, cfg, trainer_factory=trainer(tmp_path), checkpoint_dir=tmp_path / "ck")
    assert summary.resumed_from_step == 2 and summary.finished
    assert [it["step"] for it in summary.iterations] == [1, 2, 3, 4, 5]  # the whole run (run log)
    assert min(r["policy_version"] for r in summary.minibatches if r["session"] == 1) >= 2
    ledger = read_ledger(tmp_path / "ledger.jsonl")
    assert [line["step"] for line in ledger] == [1, 2, 3, 3, 4, 5]  # step 3 of the first session is trained again
    kept = [line for i, line in enumerate(ledger) if i != 2]
    assert Counter(pid for line in kept for pid in line["prompt_ids"]) == Counter(range(31))
    assert all(set(line["versions"]) == {line["step"] - 1} for line in ledger)  # lag 0 after the resume too
