"""Pure GRPO math: group advantages, the clipped policy loss with KL, reward functions, batching, lag estimates.

    from asp.rl import group_advantages, grpo_loss, get_reward, compute_rewards
    adv = group_advantages(np.array([1.0, 0.0, 0.0, 1.0]), n=4)      # [0.866, -0.866, -0.866, 0.866]

No file I/O, Ray or tracking here; the Training Unit (`asp.trainers.grpo`) composes these. Tests: tests/rl.
"""

from asp.rl.advantages import ADVANTAGE_SCALES, group_advantages, zero_signal_groups
from asp.rl.batching import PackedRows, pack_rows, plan_micro_batches
from asp.rl.lag import d_off_estimate, duty_cycle, measured_lag
from asp.rl.loss import (
    AGGREGATIONS,
    LossParts,
    aggregate,
    clipped_policy_loss,
    grpo_loss,
    kl_k3,
    loss_denominator,
    token_logprobs,
)
from asp.rl.math_answer import answers_match, extract_final_answer, math_reward, normalize_answer
from asp.rl.rewards import REWARDS, RewardFn, compute_rewards, demo_reward, get_reward, register_reward

__all__ = [
    "ADVANTAGE_SCALES",
    "AGGREGATIONS",
    "REWARDS",
    "LossParts",
    "PackedRows",
    "RewardFn",
    "aggregate",
    "answers_match",
    "clipped_policy_loss",
    "compute_rewards",
    "d_off_estimate",
    "demo_reward",
    "duty_cycle",
    "extract_final_answer",
    "get_reward",
    "group_advantages",
    "grpo_loss",
    "kl_k3",
    "loss_denominator",
    "math_reward",
    "measured_lag",
    "normalize_answer",
    "pack_rows",
    "plan_micro_batches",
    "register_reward",
    "token_logprobs",
    "zero_signal_groups",
]
