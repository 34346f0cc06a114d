"""The key metrics of each stage: what a stage's Prefect artifact shows (every metric stays in its MLflow run).

    key_metrics("schedule", {"schedule/predicted_CV": 0.018, "schedule/ablation/C0/CV": 0.049, ...})
    # -> [("schedule/predicted_CV", 0.018), ...], in the order of KEY_METRICS["schedule"]

`KEY_METRICS` is the one table of them: per dvc.yaml stage, the metrics (names as in its metrics file, nested
keys joined with '/') a person changing that stage's params looks at first, in the order shown. A stage the
table does not list (one a user added to dvc.yaml) shows its first `FALLBACK` metrics by name.
`tests/orchestration/test_key_metrics.py` checks every name against the committed metrics files and the table's
stages against dvc.yaml, so a renamed metric or a new stage is noticed.
"""

from __future__ import annotations

from collections.abc import Mapping

FALLBACK = 25

KEY_METRICS: dict[str, tuple[str, ...]] = {
    "policy": (
        "policy/final_loss",
        "policy/mean_reward",
        "policy/spearman",
        "policy/mean_length",
        "policy/truncation_rate",
        "policy/tokens_per_s",
        "policy/seconds",
    ),
    "prepare": (
        "prepare/prompts",
        "prepare/profile_prompts",
        "prepare/heldout_prompts",
        "prepare/dropped",
        "prepare/dropped_too_long",
        "prepare/prompt_tokens_max",
    ),
    "profile": (
        "profile/prompts",
        "profile/samples",
        "profile/mean_length",
        "profile/p99_length",
        "profile/truncation_rate",
        "profile/tokens_per_s",
        "profile/wall_s_this_run",
    ),
    "train_predictor": (
        "predictor/best_val_tau",
        "predictor/best_epoch",
        "predictor/epochs_run",
        "predictor/train_prompts",
        "predictor/val_prompts",
        "predictor/train_wall_s",
    ),
    "evaluate": (
        "predictor/kendall_tau",
        "predictor/spearman",
        "predictor/pairwise_accuracy",
        "predictor/mae_tokens",
        "predictor/mae_calibrated_tokens",
        "predictor/heldout_prompts",
    ),
    "predict": (
        "predict/prompts",
        "predict/mean_predicted_length",
        "predict/prompts_per_s",
        "predict/truncated_prompts",
    ),
    "schedule": (  # the schedule built (predicted loads), then the held-out ablation: ASP (C4) against C0
        "schedule/prompts",
        "schedule/minibatches",
        "schedule/groups",
        "schedule/predicted_CV",
        "schedule/predicted_spread",
        "schedule/predicted_P",
        "schedule/predicted_D",
        "schedule/predicted_mean_group_load",
        "schedule/ablation/C4/CV",
        "schedule/ablation/C4/spread",
        "schedule/ablation/C4/P",
        "schedule/ablation/C0/CV",
        "schedule/ablation/C0/P",
    ),
    "trainer_alone": (
        "trainer_alone/timed",
        "trainer_alone/step_s",
        "trainer_alone/step_min_s",
        "trainer_alone/step_max_s",
        "trainer_alone/sequences",
        "trainer_alone/response_tokens",
    ),
    "simulate": (
        "simulate/enabled",
        "simulate/C4/mean_iteration_time_s",
        "simulate/C0/mean_iteration_time_s",
        "simulate/C4/tokens_per_s",
        "simulate/C0/tokens_per_s",
        "simulate/C4/policy_lag_mean",
        "simulate/C4/generation_utilization",
        "simulate/gen_fit/r2_heldout",
        "simulate/length_model/mean_ratio",
    ),
    "launch": (
        "runtime/summary/iterations",
        "runtime/summary/prompts_trained",
        "runtime/summary/mean_iteration_time_s",
        "runtime/summary/tokens_per_s",
        "runtime/summary/policy_lag_mean",
        "runtime/summary/policy_lag_max",
        "runtime/summary/stale_dropped_prompts",
        "grpo/reward_first_20pct",
        "grpo/reward_last_20pct",
        "grpo/heldout_reward_before",
        "grpo/heldout_reward_after",
        "runtime/summary/wall_s",
    ),
    "sim_check": (
        "sim_check/checked",
        "sim_check/max_time_error",
        "sim_check/mean_iteration_time_s_error",
        "sim_check/generation_time_mean_s_error",
        "sim_check/train_step_mean_s_error",
        "sim_check/iteration_in_probe_range",
    ),
}


def key_metrics(stage: str, metrics: Mapping[str, float]) -> list[tuple[str, float]]:
    """The stage's key metrics found in `metrics`, in `KEY_METRICS` order; for a stage not in the table, the first
    `FALLBACK` metrics by name. Metrics a run did not write (e.g. the ablation without profiled lengths) are left
    out."""
    names = KEY_METRICS.get(stage)
    if names is None:
        return [(k, metrics[k]) for k in sorted(metrics)[:FALLBACK]]
    return [(k, metrics[k]) for k in names if k in metrics]
