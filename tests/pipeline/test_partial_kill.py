"""Partial rollouts under `launch` with the GRPO trainer, SIGKILLed at a checkpoint and run again (issue 25): the
checkpoint holds the minibatches whose responses were still being continued, the rerun continues them (their
responses start with the checkpoint's tokens) and no prompt is trained twice or lost (the GRPO trainer's ledger,
``ASP_TRAINER_LEDGER``). Reuses the kill matrix's project, kill and rerun (tests/pipeline/test_kill_points.py).

Deterministic (issue 37): the gate ``ASP_HOLD_CONTINUATION`` (`asp.runtime.testhooks.hold_continuation`) keeps the
killed run's first continuation call back until its first checkpoint (step 2) is saved, so that checkpoint always
holds unfinished responses; without it, a checkpoint that happened to hold none (a valid state) failed the test.
No lag bound here, so the rerun continues them whatever the versions.

Run: ``.venv/bin/python -m pytest tests/pipeline/test_partial_kill.py -q``
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from asp.config import deep_merge
from asp.control.partial import _held_from_json
from asp.runtime.testhooks import HOLD_ENV

from . import test_kill_points as kp

pytestmark = pytest.mark.slow  # the launch process to its kill point, then the rerun

inputs = kp.inputs  # the kill matrix's project inputs and Ray address (fixtures)
ray_address = kp.ray_address
BUDGET = 4  # tokens per response per engine call; max_new_tokens is 8, so a response takes one or two calls
STEPS = 4  # of the kill matrix's 6 (one pass): stop after 16 of its 24 prompts


def test_grpo_launch_with_partial_rollouts_killed_at_a_checkpoint_continues_them_exactly_once(
    inputs: Path, ray_address: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    partial = {"enabled": True, "token_budget": BUDGET, "continuation_order": "online"}
    runtime = deep_merge(
        deep_merge(kp.RUNTIME, kp.GRPO),
        {
            "heldout_problems": 0,
            "grpo": {"eval_interval": 0},  # no learning curve (test_kill_points covers it)
            "iterations": STEPS,
            "partial": partial,
            "ray": {"address": ray_address},
            "queue": {"max_policy_lag": None},
        },
    )
    root, _ = kp._project(inputs, tmp_path, {"runtime": runtime, "drift": {"enabled": False}})
    monkeypatch.setenv(HOLD_ENV, "1")  # the killed process: its first continuation waits for checkpoint 2
    kp._killed(root, "launch", "checkpoint@2")
    monkeypatch.delenv(HOLD_ENV)  # the rerun continues without the gate
    state = json.loads((root / "outputs/launch_state/C4/runtime_state.json").read_text())
    assert state["trainer_step"] == 2
    held = {int(t): _held_from_json(d) for t, d in state["database"].get("partials", {}).items()}
    assert held, state["database"]  # minibatches whose responses were being continued when the checkpoint was written

    metrics = kp._rerun(root, "launch", monkeypatch)
    assert "after step 2" in capsys.readouterr().err
    ledger = kp._ledger(root)
    assert [line["step"] for line in ledger] == list(range(1, STEPS + 1))  # no step trained twice or lost
    trained = Counter(p for line in ledger for p in line["prompt_ids"])
    assert set(trained.values()) == {1} and len(trained) == STEPS * kp.BATCH  # no prompt twice
    assert metrics["runtime/summary/continuations"] > 0 and metrics["runtime/summary/iterations"] == STEPS

    responses: dict[tuple[Any, int], list[int]] = {}  # (prompt id, sample) -> trained tokens
    for line in ledger:
        n = len(line["lengths"]) // len(line["prompt_ids"])
        bounds = np.concatenate([[0], np.cumsum(line["lengths"])])
        for s in range(len(line["lengths"])):
            responses[(line["prompt_ids"][s // n], s % n)] = line["token_ids"][bounds[s] : bounds[s + 1]]
    for task_id, h in held.items():  # the held minibatches were continued, not generated again
        assert task_id in {t for line in ledger for t in line["task_ids"]}
        for s, tokens in enumerate(h.tokens):
            assert responses[(h.head.prompt_ids[s // h.n], s % h.n)][: tokens.size] == tokens.tolist()
