"""History-aware passes in a real runtime run (Ray Control Unit, stand-in engine, simulated trainer with a ledger):
a three-pass run re-schedules every new pass at its boundary from its own lengths, is stopped just after the first
boundary (a resumable checkpoint, as a kill there leaves it), and the resumed session replays that pass plan, keeps
the per-prompt history the checkpoint holds and adds every later trained prompt to it exactly once.

Run: .venv/bin/python -m pytest tests/runtime/test_history_run.py
"""

from __future__ import annotations

import functools
import json
from collections import Counter
from dataclasses import replace

import pytest

from asp.config import ScheduleParams
from asp.control.history import PASS_REASON
from asp.runtime import EngineSpec, run_async
from asp.trainers import SimulatedTrainer

from .helpers import fast_config, make_plan, read_ledger

PROMPTS, BATCH, PASSES = 48, 8, 3


def stop_after_first_pass_plan(cu, out):
    """Ask the run to stop once the second pass was planned on history-aware loads."""
    if any(r.get("reason") == PASS_REASON for r in cu.db.replans):
        cu.request_stop("killed at the pass boundary")


@pytest.mark.slow
def test_a_multi_pass_run_reschedules_each_pass_and_resumes_with_its_history(ray_cluster, tmp_path):
    plan, prompts = make_plan(PROMPTS // 3, 3)  # minibatches of 3 consecutive ids, groups of 2
    plan = replace(plan, predicted={p: 10.0 for p in plan.prompt_ids()})  # a predictor that knows nothing
    config = fast_config(
        iterations=PASSES * PROMPTS // BATCH,
        global_batch_prompts=BATCH,
        checkpoint_interval=2,
        schedule=ScheduleParams(b=3, kappa=0, k=2, iterations=500),
        queue={"gu_queue_target": 1, "q_max": BATCH},
    )
    assert config.control_settings().history is not None  # runtime.history is on by default
    run = functools.partial(
        run_async,
        plan,
        prompts,
        EngineSpec("standin", options={"seconds_per_call": 0.005}),
        config,
        trainer_factory=functools.partial(SimulatedTrainer, 0.0, 0.0, str(tmp_path / "ledger.jsonl")),
        checkpoint_dir=tmp_path / "ck",
    )
    first = run(observer=stop_after_first_pass_plan)
    assert first.stopped and not first.finished
    saved = json.loads((tmp_path / "ck" / "runtime_state.json").read_text())["database"]
    pass_plan = [r for r in saved["replans"] if r.get("reason") == PASS_REASON]
    assert [r["epochs_created"] for r in pass_plan] == [1] and pass_plan[0]["replaced"] == []
    ledger = read_ledger(tmp_path / "ledger.jsonl")
    trained = Counter(pid for line in ledger for pid in line["prompt_ids"])
    # the checkpoint's history: one visit per trained prompt, nothing else (it is saved with the trained counts)
    assert Counter(row[0] for row in saved["history"]) == trained and all(row[2] == 2 for row in saved["history"])

    second = run()
    assert second.finished and second.resumed_from_step == first.trainer_step
    ledger = read_ledger(tmp_path / "ledger.jsonl")
    assert [line["step"] for line in ledger] == list(range(1, PASSES * PROMPTS // BATCH + 1))  # no step twice
    trained = Counter(pid for line in ledger for pid in line["prompt_ids"])
    assert sum(trained.values()) == PASSES * PROMPTS
    final = json.loads((tmp_path / "ck" / "runtime_state.json").read_text())["database"]
    assert Counter(row[0] for row in final["history"]) == trained  # every trained prompt once, across the resume
    plans = [r for r in final["replans"] if r.get("reason") == PASS_REASON]
    assert plans[0] == pass_plan[0]  # replayed from the checkpoint, not recomputed from a newer history
    assert [r["epochs_created"] for r in plans][:2] == [1, 2]  # the third pass was planned in the second session
    assert second.metrics["runtime/summary/history_passes"] == len(plans)
