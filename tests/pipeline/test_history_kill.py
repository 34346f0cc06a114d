"""History-aware passes under `launch` with the GRPO trainer, SIGKILLed at a pass boundary and run again (issue 35):
three passes over the kill matrix's 24 demo prompts (6 steps of 4 a pass), each new pass re-scheduled at its
boundary on the run's own realized lengths (``runtime.history``, on by default).

The kill point ``pass@2`` (`asp.runtime.testhooks`) SIGKILLs the stage right after the first checkpoint that holds
the history-aware plan of pass 2, so the kill always lands at the pass boundary (no race). The rerun resumes from
that checkpoint and finishes. Checked:

* the trainer's ledger (``ASP_TRAINER_LEDGER``): steps 1..18 once each, every prompt trained exactly 3 times;
* the per-prompt history in the final checkpoint is exactly the ledger's: one visit (policy version, n, mean
  length) per time a prompt was trained, none twice, none lost; the visits the killed checkpoint held are kept;
* the pass-2 plan the killed run made is replayed (the same record), and the resumed session plans pass 3 itself
  on the lengths of passes 1 and 2 (and a 4th, which the sender begins before step 18 is trained): three pass
  plans in all, `runtime/summary/history_passes` 3, a load tau for pass 3;
* one MLflow run, the killed attempt's, FINISHED, every step's metrics logged once.

Marked `extended` (over a minute); its unit-level twin runs in CI's fast tier: tests/control/test_history.py::
test_a_resume_at_a_pass_boundary_keeps_the_history_and_replays_the_pass_plans.

Run: ``.venv/bin/python -m pytest tests/pipeline/test_history_kill.py -q``
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from asp.config import deep_merge
from asp.control.history import PASS_REASON
from asp.control.plan import WorkPlan

from . import test_kill_points as kp

# the launch process to its kill point, then the rerun: ~70 s of GRPO steps on 2 busy cores, so `make test-all` only;
# CI covers the same kill and resume of the history at unit level (the module docstring's twin)
pytestmark = [pytest.mark.slow, pytest.mark.extended]

inputs = kp.inputs  # the kill matrix's project inputs and Ray address (fixtures)
ray_address = kp.ray_address
PASSES = 3
STEPS = PASSES * kp.STEPS  # 18 steps of 4 prompts: the 24 prompts 3 times
SCHEDULE = {"b": 2, "k": 2, "kappa": 0, "iterations": 20_000}  # the pass plans' settings, as the inputs' schedule


def _visits(rows: list[list[Any]]) -> Counter:
    """(prompt, policy version, n, mean length) of history rows ``[prompt, version, n, mean]``."""
    return Counter((pid, int(v), int(n), round(float(m), 9)) for pid, v, n, m in rows)


def _ledger_visits(ledger: list[dict[str, Any]]) -> Counter:
    """The same from the trainer's ledger: each trained prompt's n samples, their mean and generating version."""
    out: Counter = Counter()
    for line in ledger:
        lengths = np.asarray(line["lengths"], dtype=np.float64).reshape(len(line["prompt_ids"]), -1)
        for pid, version, row in zip(line["prompt_ids"], line["versions"], lengths, strict=True):
            out[(pid, int(version), row.size, round(float(row.mean()), 9))] += 1
    return out


def _pass_plans(database: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for r in database.get("replans", []) if r.get("reason") == PASS_REASON]


def test_grpo_launch_killed_at_a_pass_boundary_keeps_its_history_and_reschedules_the_later_passes(
    inputs: Path, ray_address: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    runtime = deep_merge(
        deep_merge(kp.RUNTIME, kp.GRPO),
        {
            "heldout_problems": 0,
            "grpo": {"eval_interval": 0},  # no learning curve (test_kill_points covers it)
            "iterations": STEPS,
            "ray": {"address": ray_address},
        },
    )
    overlay = {"runtime": runtime, "drift": {"enabled": False}, "schedule": SCHEDULE}
    root, params = kp._project(inputs, tmp_path, overlay)
    assert params.runtime.history.enabled  # the default
    kp._killed(root, "launch", "pass@2")
    state_file = root / "outputs/launch_state/C4/runtime_state.json"
    killed = json.loads(state_file.read_text())
    killed_step = killed["trainer_step"]
    (planned,) = _pass_plans(killed["database"])  # the plan of pass 2, made at the boundary, checkpointed
    assert planned["epochs_created"] == 1 and 0 < killed_step < STEPS
    killed_visits = _visits(killed["database"]["history"])
    assert sum(killed_visits.values()) == killed_step * kp.BATCH  # every trained prompt once, at the kill

    metrics = kp._rerun(root, "launch", monkeypatch)
    assert f"after step {killed_step}" in capsys.readouterr().err
    ledger = kp._ledger(root)
    assert [line["step"] for line in ledger] == list(range(1, STEPS + 1))  # no step trained twice or lost
    trained = Counter(p for line in ledger for p in line["prompt_ids"])
    assert trained == Counter({f"q{i:03d}": PASSES for i in range(kp.N_TRAIN)})

    final = json.loads(state_file.read_text())
    assert final["finished"] and final["trainer_step"] == STEPS
    history = _visits(final["database"]["history"])
    assert history == _ledger_visits(ledger)  # exactly once: one visit per trained prompt and pass, nothing lost
    assert not killed_visits - history  # what the killed run recorded is kept as it was
    assert Counter(pid for pid, *_ in history.elements()) == trained

    plans = _pass_plans(final["database"])
    # pass 2 (the killed run's), pass 3 and the pass the sender had begun when step 18 was trained (the rerun's)
    assert [p["epochs_created"] for p in plans] == [1, 2, 3]
    assert plans[0] == planned  # replayed from the checkpoint, not recomputed from the grown history
    assert metrics["runtime/summary/history_passes"] == 3 and metrics["runtime/summary/finished"] == 1
    assert "runtime/summary/load_tau/pass_3" in metrics  # NaN here: the tiny policy's lengths are nearly all 8
    # pass 3 was balanced on the run's own lengths: its loads are far nearer the realized means than the schedule's
    # predictions (demo reference lengths, 14-60 tokens, against responses capped at 8)
    realized = {pid: np.mean([m for p, _, _, m in final["database"]["history"] if p == pid]) for pid in trained}
    original = WorkPlan.from_frame(pd.read_parquet(root / "outputs/schedule/schedule.parquet")).predicted
    pass3 = dict(plans[1]["full"]["predicted"])
    off = [np.mean([abs(loads[p] - realized[p]) for p in trained]) for loads in (pass3, original)]
    assert off[0] < 0.5 * off[1], off

    (run,) = kp._runs(params)  # the killed attempt's run, continued and finished
    assert run.info.status == "FINISHED"
    steps = kp._logged_once(run.info.run_id)
    assert steps["train/reward_mean"] == list(range(1, STEPS + 1))
