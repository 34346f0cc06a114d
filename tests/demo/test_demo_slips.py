"""Warm-start answer slips (`policy.demo.answer_slip_rate`): an imperfect demonstrator whose references sometimes
write every step right and then state a wrong final answer.

Checks the slipped text by hand, that offset 0 gives the reference, that a slipped reference keeps the reference's
steps and length and earns no reward, the slip share, that slips leave the drift demo's shortcut draws unchanged,
that the policy stage's targets follow the settings, and that bad settings are refused.

Run: `.venv/bin/python -m pytest tests/demo/test_demo_slips.py -q`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from asp.config import DemoPolicyParams, read_yaml
from asp.demo.task import (
    generate_problems,
    reference_response,
    reward,
    shortcut_response,
    slipped_response,
    step_reward,
    warm_start_responses,
)
from asp.pipeline.policy import warm_start_targets

ROOT = Path(__file__).resolve().parents[2]


def test_slip_hand_worked() -> None:
    rec = {"problem": "Add mod 10 up to B: A3 B4 | C2", "answer": "7"}  # sums 3 7
    assert slipped_response(rec, 0) == reference_response(rec) == "A3=3 B4=7 answer: 7"
    assert slipped_response(rec, 2) == "A3=3 B4=7 answer: 9"
    assert slipped_response(rec, 5) == "A3=3 B4=7 answer: 2"  # 7 + 5 = 12 -> 2
    assert reward("A3=3 B4=7 answer: 9", "7") == 0.0
    # partial credit keeps the steps: 0.5 * 2 / 2 + 0.5 * 0
    assert step_reward("A3=3 B4=7 answer: 9", "7", rec["problem"]) == pytest.approx(0.5)


@pytest.mark.parametrize("offset", [-1, 10])
def test_slip_offset_must_be_a_digit(offset: int) -> None:
    with pytest.raises(ValueError, match="offset"):
        slipped_response({"problem": "Add mod 10 up to A: A3 | B4", "answer": "3"}, offset)


def test_slipped_references_keep_their_steps_and_lose_the_reward() -> None:
    recs = generate_problems(4000, seed=100)
    rate = 0.3
    out = warm_start_responses(recs, skip_fraction=0.0, skip_min_steps=6, seed=300, answer_slip_rate=rate)
    assert out == warm_start_responses(recs, skip_fraction=0.0, skip_min_steps=6, seed=300, answer_slip_rate=rate)
    assert out != warm_start_responses(recs, skip_fraction=0.0, skip_min_steps=6, seed=301, answer_slip_rate=rate)
    slipped = 0
    for rec, text in zip(recs, out, strict=True):
        ref = reference_response(rec)
        steps = ref[: ref.index("answer:")]
        assert text.startswith(steps) and len(text) == len(ref)  # the length the predictor learns is unchanged
        if text != ref:
            assert reward(text, rec["answer"]) == 0.0
            slipped += 1
    share, n = slipped / len(recs), len(recs)  # the binomial share is within 4 standard errors of the rate
    assert abs(share - rate) < 4 * np.sqrt(rate * (1 - rate) / n)


def test_slips_leave_the_shortcut_draws_unchanged() -> None:
    recs = generate_problems(2000, seed=100)
    plain = warm_start_responses(recs, skip_fraction=0.5, skip_min_steps=6, seed=300, answer_slip_rate=0.0)
    both = warm_start_responses(recs, skip_fraction=0.5, skip_min_steps=6, seed=300, answer_slip_rate=0.3)
    shortcuts = 0
    for rec, a, b in zip(recs, plain, both, strict=True):
        if a != reference_response(rec):  # the same records are shortcut, and a shortcut is not slipped
            assert a == shortcut_response(rec) and b == a
            shortcuts += 1
        else:
            assert len(b) == len(a)  # a reference, perhaps slipped
    assert shortcuts > 100


def test_policy_stage_targets_follow_the_settings() -> None:
    recs = generate_problems(200, seed=7)
    assert warm_start_targets(DemoPolicyParams(answer_slip_rate=0.0), recs, seed=0) is None  # references, no draw
    slipped = warm_start_targets(DemoPolicyParams(answer_slip_rate=0.3), recs, seed=0)
    assert slipped == warm_start_responses(recs, skip_fraction=0.0, skip_min_steps=6, seed=300, answer_slip_rate=0.3)
    assert slipped != [reference_response(r) for r in recs]
    # the shipped default slips, the drift demo does not (its drift must come from the shortcuts alone)
    assert DemoPolicyParams().answer_slip_rate > 0
    assert read_yaml(ROOT / "configs" / "drift-demo.yaml")["policy"]["demo"]["answer_slip_rate"] == 0.0


@pytest.mark.parametrize("rate", [-0.1, 1.0])
def test_bad_slip_rate_is_refused(rate: float) -> None:
    recs = generate_problems(4, seed=0)
    with pytest.raises(ValueError, match="answer_slip_rate"):
        warm_start_responses(recs, skip_fraction=0.0, skip_min_steps=6, seed=0, answer_slip_rate=rate)
    with pytest.raises(ValueError, match="answer_slip_rate"):
        DemoPolicyParams(answer_slip_rate=rate)
