"""Smoke run of the GRPO demo (`python -m asp.runtime.grpo_demo`) at a tiny size: the demo policy is built and
warm-started, trained asynchronously with GRPO on a C4 schedule, and every reported number is present. The
full-size run (reward going up) is the script itself; its measured numbers are in docs/grpo.md."""

from __future__ import annotations

import math

import pytest

from asp.runtime.grpo_demo import run_demo


@pytest.mark.slow
def test_grpo_demo_smoke(ray_cluster, tmp_path):
    out = run_demo(tmp_path, warm_steps=40, iterations=4, prompts=64, held_out=8, max_policy_lag=2)
    assert out["grpo/iterations"] == 4 and out["settings"]["policy_version"] == 4
    keys = ("grpo/reward_first_20pct", "grpo/reward_last_20pct", "grpo/lag_mean", "grpo/d_off_estimate_mean",
            "grpo/T_save_s", "grpo/T_gen_s", "grpo/T_train_s", "grpo/duty_cycle_measured", "held_out_reward_before",
            "held_out_reward_after")  # fmt: skip
    for key in keys:
        assert math.isfinite(out[key]), key
    assert 0 <= out["grpo/lag_mean"] <= out["grpo/lag_max"] <= 2  # max_policy_lag
    assert 0 < out["grpo/duty_cycle_measured"] <= 1 and out["grpo/T_train_s"] > 0
    assert (tmp_path / "state" / "trainer" / "step-00000004" / "model.safetensors").exists()
