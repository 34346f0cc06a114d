"""Reward functions and registry, math-answer normalization, lag estimates and batching on hand-worked cases."""

from __future__ import annotations

import numpy as np
import pytest

from asp.rl import (
    answers_match,
    compute_rewards,
    d_off_estimate,
    duty_cycle,
    extract_final_answer,
    get_reward,
    measured_lag,
    normalize_answer,
    pack_rows,
    plan_micro_batches,
)
from asp.rl.lag import lag_stats, policy_lags


def test_demo_reward_is_the_demo_tasks_verifier():
    demo = get_reward("demo")
    assert demo("A3=3 B7=0 answer: 0", "0") == 1.0
    assert demo("A3=3 B7=0 answer: 1", "0") == 0.0 and demo("no answer", "0") == 0.0


def test_demo_steps_reward_gives_partial_credit_per_step():
    steps = get_reward("demo_steps")
    prompt = "<bos><|user|>Add mod 10: A3 B4 C5<|assistant|>"  # sums 3, 7, 2
    assert steps("A3=3 B4=7 C5=2 answer: 2", "2", prompt) == 1.0
    assert steps("A3=3 B2=5 C5=0 answer: 0", "2", prompt) == pytest.approx(0.5 * 1 / 3)  # step 1 only
    assert steps("A3=3 B4=7 C5=1 answer: 2", "2", prompt) == pytest.approx(0.5 * 2 / 3 + 0.5)
    assert steps("A3=3 B4=7 C5=2 D1=3 answer: 3", "2", prompt) == pytest.approx(0.5)  # extra step, wrong final
    assert steps("garbage", "2", prompt) == 0.0 and steps("answer: 2", "2", "no terms here") == 0.5


def test_compute_rewards_passes_the_prompt_only_to_rewards_that_declare_it():
    seen = []

    def with_prompt(response: str, answer: str, prompt: str) -> float:
        seen.append(prompt)
        return float(response == answer)

    rewards, errors = compute_rewards(with_prompt, ["a", "b"], ["a", "a"], ["p0", "p1"])
    assert rewards.tolist() == [1.0, 0.0] and errors == 0 and seen == ["p0", "p1"]
    rewards, _ = compute_rewards(get_reward("demo"), ["answer: 1"], ["1"], ["ignored"])  # two-argument reward
    assert rewards.tolist() == [1.0]


@pytest.mark.parametrize(
    ("response", "extracted"),
    [
        ("so the total is \\boxed{\\frac{1}{2}}.", "\\frac{1}{2}"),
        ("first \\boxed{3}, then corrected: \\boxed{4}", "4"),  # the last box counts
        ("nested \\boxed{\\sqrt{\\frac{3}{4}}}", "\\sqrt{\\frac{3}{4}}"),
        ("The answer is 12.", "12."),
        ("Answer: $\\dfrac{3}{4}$", "$\\dfrac{3}{4}$"),
        ("work...\n#### 1,000", "1,000"),
        ("I do not know", None),
    ],
)
def test_extract_final_answer(response, extracted):
    assert extract_final_answer(response) == extracted


@pytest.mark.parametrize(
    ("predicted", "reference", "match"),
    [
        ("\\dfrac{1}{2}", "\\frac{1}{2}", True),  # dfrac == frac
        ("0.5", "\\frac{1}{2}", True),  # numeric: 0.5 == 1/2
        ("\\frac12", "1/2", True),
        ("1,000", "1000", True),
        ("x = 5", "5", True),
        ("90^\\circ", "90", True),
        ("$-3$", "-3", True),
        ("(B)", "B", True),
        ("\\text{yes}", "Yes", True),
        ("0.333", "\\frac{1}{3}", False),  # not within 1e-6
        ("\\sqrt{2}", "\\sqrt{3}", False),
        ("", "0", False),
    ],
)
def test_math_answers_match_after_normalization(predicted, reference, match):
    assert answers_match(predicted, reference) is match


def test_math_reward_and_normalization():
    math = get_reward("math")
    assert math("thus $\\boxed{\\dfrac{3}{4}}$", "\\frac{3}{4}") == 1.0
    assert math("the answer is 0.75.", "\\frac{3}{4}") == 1.0
    assert math("the answer is 0.7", "\\frac{3}{4}") == 0.0
    assert normalize_answer(" 007 ") == "7" and normalize_answer("\\left( 1, 2 \\right)") == "(1,2)"


def test_registry_and_failing_rewards_are_counted():
    assert get_reward("asp.rl.math_answer:math_reward") is get_reward("math")
    with pytest.raises(ValueError, match="unknown reward"):
        get_reward("nope")
    with pytest.raises(ValueError, match="cannot be imported"):
        get_reward("asp.rl.math_answer:missing")

    def flaky(response: str, answer: str) -> float:
        if response == "boom":
            raise RuntimeError("verifier crashed")
        return float("nan") if response == "nan" else float(response == answer)

    rewards, errors = compute_rewards(flaky, ["a", "boom", "b", "nan"], ["a", "a", "a", "a"])
    assert rewards.tolist() == [1.0, 0.0, 0.0, 0.0] and errors == 2  # the raising and the NaN sample get 0


def test_lag_estimates_with_the_papers_numbers():
    # D.5: (23.5 + 84.6 + 73.9 + 763.3) / 287.6 = 945.3 / 287.6 = 3.287 steps on an empty queue; + Q_arrival
    est = d_off_estimate(
        np.array([0.0, 1.5]), np.array([763.3, 763.3]), t_save=23.5, t_convert=84.6, t_load=73.9, t_train=287.6
    )
    np.testing.assert_allclose(est, [3.2869, 4.7869], atol=1e-4)
    assert duty_cycle(763.3, 73.9) == pytest.approx(763.3 / 837.2)  # 0.912
    assert np.isnan(d_off_estimate(np.zeros(1), np.ones(1), t_save=0, t_convert=0, t_load=0, t_train=0.0)).all()
    assert measured_lag(5, np.array([5, 4, 3])) == (1.0, 2.0)  # lags 0, 1, 2
    assert all(np.isnan(measured_lag(5, np.array([]))))


def test_policy_lags_and_their_summary():
    # trainer at version 7 trains samples generated by versions 7, 6, 6, 3: lags 0, 1, 1, 4 -> mean 1.5, max 4
    lags = policy_lags(7, np.array([7, 6, 6, 3], dtype=np.int64))
    assert lags.dtype == np.float64 and lags.tolist() == [0.0, 1.0, 1.0, 4.0]
    assert lag_stats(lags) == (1.5, 4.0) == measured_lag(7, np.array([7, 6, 6, 3]))
    assert all(np.isnan(lag_stats(np.zeros(0))))


def test_runtime_reports_the_same_lag():
    """The Control Unit's per-iteration metrics summarise lags with the same function (one implementation)."""
    from asp.control.metrics import Window, iteration_metrics

    m = iteration_metrics(
        Window(start=0.0),
        1.0,
        queue_depth=0,
        n_samples=1,
        actor_ids=[],
        prompts_by_gu={},
        prompts_by_actor={},
        lags=policy_lags(7, np.array([7, 6, 6, 3])),
        paused=False,
    )
    assert (m["runtime/policy_lag_mean"], m["runtime/policy_lag_max"]) == measured_lag(7, np.array([7, 6, 6, 3]))


def test_pack_rows_aligns_responses_with_logit_positions():
    # prompt [5, 6], response [7, 8]: input [5, 6, 7, 8], targets [6, 7, 8], mask [0, 1, 1] (logit 1 predicts 7)
    # prompt [9], response [4]: input [9, 4, pad, pad], targets [4, pad, pad], mask [1, 0, 0]
    rows = pack_rows(
        [[5, 6], [9]],
        [np.array([7, 8]), np.array([4])],
        [np.array([-0.1, -0.2]), np.array([-0.3])],
        np.array([1.0, -1.0]),
        pad_id=0,
    )
    assert rows.input_ids.tolist() == [[5, 6, 7, 8], [9, 4, 0, 0]]
    assert rows.attention_mask.tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]
    assert rows.targets.tolist() == [[6, 7, 8], [4, 0, 0]]
    assert rows.mask.tolist() == [[0, 1, 1], [1, 0, 0]]
    np.testing.assert_allclose(rows.behaviour.numpy(), [[0, -0.1, -0.2], [-0.3, 0, 0]], atol=1e-7)
    with pytest.raises(ValueError, match="empty prompt"):
        pack_rows([[]], [np.array([1])], [np.array([-1.0])], np.zeros(1), 0)
    with pytest.raises(ValueError, match="behaviour log-probs"):
        pack_rows([[1]], [np.array([1, 2])], [np.array([-1.0])], np.zeros(1), 0)


def test_micro_batches_respect_the_token_budget():
    # lengths [4, 10, 3, 9], budget 20: longest first 10, 9 -> 2 x 10 = 20; then 4, 3 -> 2 x 4 = 8
    assert [b.tolist() for b in plan_micro_batches(np.array([4, 10, 3, 9]), 20)] == [[1, 3], [0, 2]]
    # a row over the budget gets its own micro-batch; every row appears exactly once
    batches = plan_micro_batches(np.array([50, 2, 2, 2]), 8)
    assert batches[0].tolist() == [0] and sorted(np.concatenate(batches).tolist()) == [0, 1, 2, 3]
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 40, 200)
    for b in plan_micro_batches(lengths, 64):
        assert len(b) == 1 or len(b) * lengths[b].max() <= 64
