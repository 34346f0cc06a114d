"""Pure GRPO math: group advantages, the clipped policy loss with KL, reward functions, batching, lag estimates.

    from asp.rl import group_advantages, grpo_loss, get_reward, compute_rewards
    adv = group_advantages(np.array([1.0, 0.0, 0.0, 1.0]), n=4)      # [0.866, -0.866, -0.866, 0.866]

No file I/O, Ray or tracking here; the Training Unit (`asp.trainers.grpo`) composes these. Tests: tests/rl.
"""

import importlib
from typing import Any

# name -> submodule. Loaded on first use (PEP 562), so `import asp.rl.lag` (the runtime) or `asp.rl.rewards`
# does not pay for torch, which only `loss` and `batching` need.
_EXPORTS = {
    "ADVANTAGE_SCALES": "advantages",
    "group_advantages": "advantages",
    "zero_signal_groups": "advantages",
    "PackedRows": "batching",
    "pack_rows": "batching",
    "plan_micro_batches": "batching",
    "d_off_estimate": "lag",
    "duty_cycle": "lag",
    "measured_lag": "lag",
    "AGGREGATIONS": "loss",
    "LossParts": "loss",
    "aggregate": "loss",
    "clipped_policy_loss": "loss",
    "grpo_loss": "loss",
    "kl_k3": "loss",
    "loss_denominator": "loss",
    "token_logprobs": "loss",
    "answers_match": "math_answer",
    "extract_final_answer": "math_answer",
    "math_reward": "math_answer",
    "normalize_answer": "math_answer",
    "REWARDS": "rewards",
    "RewardFn": "rewards",
    "compute_rewards": "rewards",
    "demo_reward": "rewards",
    "get_reward": "rewards",
    "register_reward": "rewards",
}


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)


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
