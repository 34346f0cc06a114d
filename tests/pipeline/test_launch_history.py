"""Launch-stage helpers without Ray: the persisted iteration history, the checkpoint key and the GRPO summary."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from asp.pipeline.launch import fingerprint_extra, read_history
from asp.runtime import grpo_summary

from .conftest import make_params


def test_history_keeps_steps_up_to_the_checkpoint_and_skips_a_cut_line(tmp_path: Path) -> None:
    path = tmp_path / "iterations.jsonl"
    rows = [json.dumps({"step": s, "train/reward_mean": s / 10}) for s in (1, 2, 3, 4)]
    path.write_text("\n".join(rows) + '\n{"step": 5, "train/rew')  # killed while writing step 5
    assert [r["step"] for r in read_history(path, upto_step=3)] == [1, 2, 3]
    assert [r["step"] for r in read_history(path, upto_step=10)] == [1, 2, 3, 4]
    assert read_history(path, upto_step=0) == [] and read_history(tmp_path / "none", 5) == []


def test_checkpoint_key_ignores_operational_grpo_settings() -> None:
    def key(**grpo: object) -> dict:
        return fingerprint_extra(make_params({"runtime": {"trainer": "grpo", "grpo": grpo}}).runtime)

    assert key(micro_batch_tokens=1024, num_threads=2) == key()
    assert key(lr=1e-3) != key()
    assert fingerprint_extra(make_params({"runtime": {"trainer": "simulated"}}).runtime) == {"trainer": "simulated"}


def test_grpo_summary_first_last_fifth_lag_and_timings() -> None:
    rows = [
        {"train/reward_mean": i / 10, "train/lag_mean": 1 + i % 2, "train/lag_max": 2 + i % 2, "train/t_train_s": 0.5,
         "train/t_gen_s": 0.25, "train/duty_cycle": 0.9, "train/duty_cycle_measured": 0.95 if i == 9 else 0.1}
        for i in range(10)
    ]  # fmt: skip
    s = grpo_summary([{"runtime/iteration_time_s": 1.0}, *rows])  # rows without a reward are ignored
    assert s["grpo/iterations"] == 10
    assert s["grpo/reward_first_20pct"] == pytest.approx(0.05) and s["grpo/reward_last_20pct"] == pytest.approx(0.85)
    assert s["grpo/lag_mean"] == pytest.approx(1.5) and s["grpo/lag_max"] == 3
    assert s["grpo/T_train_s"] == 0.5 and s["grpo/T_gen_s"] == 0.25 and s["grpo/duty_cycle_measured"] == 0.95
    assert s["grpo/T_save_s"] != s["grpo/T_save_s"]  # NaN: never measured
