"""Warm-start shortcuts (the drift demo, configs/drift-demo.yaml): some long references skip half the steps.

Checks the shortcut's text and length by hand, that `skip_fraction: 0` gives exactly the references of the plain
demo (no random draw, so the policy stage is unchanged), the skip draws' share and determinism, that the partial
credit reward pays a shortcut less than a full response, that `warm_start` trains on the given responses, and that
the shipped preset validates with `asp params check`.

Run: `.venv/bin/python -m pytest tests/demo/test_demo_shortcuts.py -q`.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from asp.config import DemoPolicyParams, deep_merge, read_yaml, validate_params
from asp.demo.policy import build_model, warm_start
from asp.demo.task import (
    generate_problems,
    intended_length,
    parse_terms,
    reference_response,
    shortcut_response,
    shortcut_steps,
    step_reward,
    warm_start_responses,
)
from asp.demo.tokenizer import build_tokenizer

ROOT = Path(__file__).resolve().parents[2]
TINY = {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64, "max_position_embeddings": 256}


def test_shortcut_hand_worked() -> None:
    # terms 3 4 2 1: running sums 3 7 9 0; a shortcut writes ceil(4 / 2) = 2 steps, then the true answer
    rec = {"problem": "Add mod 10: A3 B4 C2 D1", "answer": "0"}
    assert shortcut_response(rec) == "A3=3 B4=7 answer: 0"
    # 2 steps * 5 characters + "answer: 0" (9) = 19 tokens, against 29 for the full reference
    assert len(shortcut_response(rec)) == 19 and intended_length(rec) == 29
    # five terms: ceil(5 / 2) = 3 steps written (3 -> 6 -> 8), then the answer of all five (8 + 1 + 4 = 13 -> 3)
    rec5 = {"problem": "Add mod 10: A3 B3 C2 D1 E4", "answer": "3"}
    assert shortcut_response(rec5) == "A3=3 B3=6 C2=8 answer: 3"
    assert [shortcut_steps(k) for k in (2, 3, 4, 5, 24)] == [1, 2, 2, 3, 12]


def test_shortcut_is_a_prefix_of_the_reference_plus_the_answer() -> None:
    for rec in generate_problems(300, seed=3, min_steps=2):
        k, short = len(parse_terms(rec["problem"])), shortcut_response(rec)
        keep = shortcut_steps(k)
        assert short.startswith(reference_response(rec)[: 5 * keep]) and short.endswith(f"answer: {rec['answer']}")
        assert len(short) == 5 * keep + 9 < intended_length(rec)


def test_skip_fraction_zero_is_exactly_todays_references() -> None:
    recs = generate_problems(500, seed=100)
    refs = [reference_response(r) for r in recs]
    assert warm_start_responses(recs, skip_fraction=0.0, skip_min_steps=6, seed=0, answer_slip_rate=0.0) == refs
    assert warm_start_responses(recs, skip_fraction=0.0, skip_min_steps=2, seed=123, answer_slip_rate=0.0) == refs
    # the default params leave the shortcut off
    assert DemoPolicyParams().skip_fraction == 0.0


def test_skip_draws_hit_only_long_problems_in_the_asked_share() -> None:
    recs = generate_problems(4000, seed=100)
    out = warm_start_responses(recs, skip_fraction=0.5, skip_min_steps=6, seed=300, answer_slip_rate=0.0)
    again = warm_start_responses(recs, skip_fraction=0.5, skip_min_steps=6, seed=300, answer_slip_rate=0.0)
    assert out == again  # deterministic
    assert out != warm_start_responses(recs, skip_fraction=0.5, skip_min_steps=6, seed=301, answer_slip_rate=0.0)
    eligible = [len(parse_terms(r["problem"])) >= 6 for r in recs]
    skipped = [o != reference_response(r) for r, o in zip(recs, out, strict=True)]
    assert not any(s and not e for s, e in zip(skipped, eligible, strict=True))  # short problems never skip
    share = sum(skipped) / sum(eligible)
    n = sum(eligible)  # ~1,370 eligible: the binomial share is within 4 standard errors of 0.5
    assert abs(share - 0.5) < 4 * np.sqrt(0.25 / n)
    everything = warm_start_responses(recs, skip_fraction=1.0, skip_min_steps=6, seed=0, answer_slip_rate=0.0)
    expected = [shortcut_response(r) if e else reference_response(r) for r, e in zip(recs, eligible, strict=True)]
    assert everything == expected


def test_partial_credit_pays_a_shortcut_less() -> None:
    rec = {"problem": "Add mod 10: A3 B4 C2 D1 E2 F2", "answer": "4"}  # sums 3 7 9 0 2 4
    full, short = reference_response(rec), shortcut_response(rec)
    assert step_reward(full, rec["answer"], rec["problem"]) == 1.0
    # 3 of 6 steps right and the right answer: 0.5 * 3 / 6 + 0.5 = 0.75
    assert step_reward(short, rec["answer"], rec["problem"]) == pytest.approx(0.75)
    # the policy's own shortcut guesses the answer; a wrong guess keeps only the steps: 0.5 * 3 / 6 = 0.25
    wrong = short.replace("answer: 4", "answer: 1")
    assert step_reward(wrong, rec["answer"], rec["problem"]) == pytest.approx(0.25)


@pytest.mark.parametrize(("fraction", "min_steps"), [(-0.1, 6), (1.5, 6), (0.5, 1)])
def test_bad_skip_settings_raise(fraction: float, min_steps: int) -> None:
    with pytest.raises(ValueError, match="skip"):
        warm_start_responses(
            generate_problems(4, seed=0),
            skip_fraction=fraction,
            skip_min_steps=min_steps,
            seed=0,
            answer_slip_rate=0.0,
        )
    with pytest.raises(ValueError, match="skip"):
        DemoPolicyParams(skip_fraction=fraction, skip_min_steps=min_steps)


def _warm(records: list[dict], responses: list[str] | None) -> list[float]:
    """Three warm-start steps on one torch thread (restored afterwards: a changed thread count would leak into
    later tests in this process and change their floating-point sums)."""
    tk = build_tokenizer()
    model = build_model(tk, seed=0, **TINY)
    result = warm_start(model, tk, records, steps=3, batch_size=4, lr=1e-3, seed=0, responses=responses, num_threads=1)
    return result["loss"]


def test_warm_start_trains_on_the_given_responses() -> None:
    recs = generate_problems(8, seed=5, min_steps=4)
    plain = _warm(recs, None)
    assert _warm(recs, [reference_response(r) for r in recs]) == plain  # None = the references, bit for bit
    short = [shortcut_response(r) for r in recs]
    assert _warm(recs, short) != plain
    with pytest.raises(ValueError, match="7 responses for 8 records"):
        _warm(recs, short[:7])


def test_drift_preset_validates_and_turns_the_shortcut_on() -> None:
    merged = deep_merge(read_yaml(ROOT / "params.yaml"), read_yaml(ROOT / "configs/drift-demo.yaml"))
    params = validate_params(merged, "params.yaml + configs/drift-demo.yaml")
    assert params.policy.demo.skip_fraction > 0 and params.drift.enabled
    assert params.runtime.grpo.reward == "demo_steps"
    out = subprocess.run(
        [sys.executable, "-m", "asp", "params", "check", "--preset", "drift-demo"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0 and "OK" in out.stdout, out.stderr
    assert f"skip_fraction: {params.policy.demo.skip_fraction}" in out.stdout
