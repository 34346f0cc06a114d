"""Tests for asp.demo.task: reward, reference responses, generator determinism and the heavy tail."""

from __future__ import annotations

import numpy as np
import pytest

from asp.demo.task import (
    extract_answer,
    generate_problems,
    intended_length,
    listed_terms,
    parse_terms,
    reference_response,
    reward,
)


def test_reference_response_hand_worked() -> None:
    # 3 -> 3+4=7 -> 7+2=9 -> 9+1=10 = 0 (mod 10)
    rec = {"problem": "Add mod 10: A3 B4 C2 D1", "answer": "0"}
    assert parse_terms(rec["problem"]) == [3, 4, 2, 1]
    assert reference_response(rec) == "A3=3 B4=7 C2=9 D1=0 answer: 0"
    # 4 steps * 5 characters ("A3=3 ") + "answer: 0" (9 characters) = 29 = len(reference)
    assert intended_length(rec) == 29


def test_the_stop_letter_names_the_steps_not_the_list() -> None:
    # the same hand-worked sums, with three more terms listed past the stop letter D
    rec = {"problem": "Add mod 10 up to D: A3 B4 C2 D1 E2 F4 G3", "answer": "0"}
    assert listed_terms(rec["problem"]) == [3, 4, 2, 1, 2, 4, 3]
    assert parse_terms(rec["problem"]) == [3, 4, 2, 1]
    assert reference_response(rec) == "A3=3 B4=7 C2=9 D1=0 answer: 0"
    assert intended_length(rec) == 29
    # the chat-formatted prompt (what step_reward parses) reads the same
    assert parse_terms("<bos><|user|>Add mod 10 up to B: A3 B4 C2<|assistant|>") == [3, 4]
    with pytest.raises(ValueError, match="stops at E but lists only 3 terms"):
        parse_terms("Add mod 10 up to E: A3 B4 C2")


@pytest.mark.parametrize(
    ("response", "answer", "expected"),
    [
        ("A3=3 B4=7 answer: 7", "7", 1.0),  # correct
        ("A3=3 B4=7 answer: 8", "7", 0.0),  # wrong
        ("A3=3 B4=7 answer:   7  \n", "7", 1.0),  # extra whitespace
        ("Answer : 07.", "7", 1.0),  # case, space before colon, leading zero, trailing period
        ("answer: 3 ... no wait, answer: 7", "7", 1.0),  # the last stated answer counts
        ("answer: 7 ... no wait, answer: 3", "7", 0.0),
        ("A3=3 B4=7", "7", 0.0),  # no stated answer
        ("answer:", "7", 0.0),  # empty answer
        ("", "7", 0.0),
        ("\x00\uffff<unk>answer: <eos>", "7", 0.0),  # garbage
        ("answer: 7", 7, 1.0),  # non-string reference answer
    ],
)
def test_reward_cases(response: str, answer: str, expected: float) -> None:
    assert reward(response, answer) == expected


def test_reward_never_raises_on_non_strings() -> None:
    assert reward(None, "1") == 0.0  # type: ignore[arg-type]
    assert reward(12345, "1") == 0.0  # type: ignore[arg-type]
    assert extract_answer("answer: 5 answer: 6") == "6"


def test_generator_is_deterministic_and_consistent() -> None:
    a = generate_problems(300, seed=7)
    assert a == generate_problems(300, seed=7)
    assert a != generate_problems(300, seed=8)
    assert [r["id"] for r in a[:2]] == ["arith-000000", "arith-000001"]
    for r in a:
        terms = parse_terms(r["problem"])
        assert len(terms) == r["steps"] and 1 <= r["steps"] <= 24
        assert r["problem"].startswith(f"Add mod 10 up to {'ABCDEFGHIJKLMNOPQRSTUVWXYZ'[r['steps'] - 1]}: ")
        listed = listed_terms(r["problem"])
        assert listed[: r["steps"]] == terms and max(8, r["steps"] + 1) <= len(listed) <= max(16, r["steps"] + 1)
        assert all(1 <= t <= 4 for t in terms)  # default max_term=4
        assert r["answer"] == str(sum(terms) % 10)
        assert reward(reference_response(r), r["answer"]) == 1.0
        assert intended_length(r) == len(reference_response(r)) == 5 * r["steps"] + 9


def test_step_distribution_is_heavy_tailed() -> None:
    steps = np.array([r["steps"] for r in generate_problems(20_000, seed=0)])
    median = np.median(steps)
    assert median == 4  # lognormal median 4 (before rounding and clipping)
    assert steps.mean() > median  # right skew
    assert np.percentile(steps, 99) >= 3.5 * median  # exp(2.33 * 0.75) ~ 5.7x the median, clipped at 24
    assert steps.min() == 1 and steps.max() == 24
    flat = {r["steps"] for r in generate_problems(50, seed=0, tail=0.0, median_steps=6)}
    assert flat == {6}


def test_prompt_length_alone_ranks_the_lengths_poorly() -> None:
    """Issue 35: the old task wrote the steps into the prompt (prompt-length tau 0.94); now the list runs past the
    stop letter by an independent count, and only the heavy tail (steps >= 16 need more terms listed) ties them."""
    from scipy.stats import kendalltau

    recs = generate_problems(4000, seed=0)
    lengths = [intended_length(r) for r in recs]
    tau = kendalltau([len(r["problem"]) for r in recs], lengths).statistic
    assert 0.0 < tau < 0.2, tau
    # the letter alone ranks them perfectly: the information is in what the prompt says
    letters = [ord(r["problem"][len("Add mod 10 up to ")]) for r in recs]
    assert kendalltau(letters, lengths).statistic == pytest.approx(1.0)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_steps": 26},
        {"min_steps": 0},
        {"min_steps": 5, "max_steps": 4},
        {"max_term": 10},
        {"tail": -1},
        {"min_listed": 1},
        {"min_listed": 9, "max_listed": 8},
        {"max_listed": 27},
    ],
)
def test_generator_rejects_bad_arguments(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        generate_problems(3, seed=0, **kwargs)


def test_parse_terms_rejects_text_without_terms() -> None:
    with pytest.raises(ValueError, match="no terms"):
        parse_terms("What is 2 + 2?")
