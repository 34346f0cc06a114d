"""Launch-stage helpers without Ray: the persisted iteration history, the checkpoint key, the GRPO summary and the
held-out reward before / after training (measured on the demo task only, on problems not among the run's prompts)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from asp.pipeline.launch import Paths, ResumePoint, heldout_metrics
from asp.runtime import grpo_summary
from asp.steps.launch_state import fingerprint_extra, read_history
from asp.trainers.heldout import HELDOUT_SEED_OFFSET, heldout_problems
from tests.trainers.test_heldout import save_tiny_demo_policy

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
        return fingerprint_extra(make_params({"runtime": {"grpo": grpo, "trainer": {"kind": "grpo"}}}).runtime)

    assert key(micro_batch_tokens=1024, num_threads=2, world_size=2) == key()  # DCP reshards across world sizes
    assert key(lr=1e-3) != key() and key(mixed_precision="bfloat16") != key()
    simulated = fingerprint_extra(make_params({"runtime": {"trainer": {"kind": "simulated"}}}).runtime)
    assert simulated == {"trainer": "simulated", "mode": "async"}
    sync = fingerprint_extra(make_params({"runtime": {"mode": "sync", "trainer": {"kind": "simulated"}}}).runtime)
    assert sync != simulated  # an async run is not resumed in sync mode


def test_grpo_summary_first_last_fifth_lag_and_timings() -> None:
    rows = [
        {
            "train/reward_mean": i / 10,
            "train/lag_mean": 1 + i % 2,
            "train/lag_max": 2 + i % 2,
            "train/t_train_s": 0.5,
            "train/t_gen_s": 0.25,
            "train/duty_cycle": 0.9,
            "train/duty_cycle_measured": 0.95 if i == 9 else 0.1,
        }
        for i in range(10)
    ]
    s = grpo_summary([{"runtime/iteration_time_s": 1.0}, *rows])  # rows without a reward are ignored
    assert s["grpo/iterations"] == 10
    assert s["grpo/reward_first_20pct"] == pytest.approx(0.05) and s["grpo/reward_last_20pct"] == pytest.approx(0.85)
    assert s["grpo/lag_mean"] == pytest.approx(1.5) and s["grpo/lag_max"] == 3
    assert s["grpo/T_train_s"] == 0.5 and s["grpo/T_gen_s"] == 0.25 and s["grpo/duty_cycle_measured"] == 0.95
    assert s["grpo/T_save_s"] != s["grpo/T_save_s"]  # NaN: never measured


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Paths, ResumePoint]:
    """A policy stage output (a tiny random demo policy) and a run state whose only trainer checkpoint, at step 3,
    holds the policy's own weights (so before and after decode alike)."""
    import torch
    from transformers import AutoModelForCausalLM

    from asp.trainers.weights import save_checkpoint

    root = tmp_path_factory.mktemp("launch_heldout")
    model_dir = save_tiny_demo_policy(root / "model")
    (root / "policy").mkdir()
    (root / "policy" / "policy.json").write_text(json.dumps({"model_path": str(model_dir)}))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), local_files_only=True)
    save_checkpoint(root / "state" / "trainer", 3, model, torch.optim.AdamW(model.parameters()), {}, keep=2)
    point = ResumePoint(plan=None, config=None, extra={}, directory=root / "state", state=None, reason="")
    return Paths(policy=root / "policy"), point


def _heldout_params(**overlay: object) -> object:
    runtime = {"trainer": {"kind": "grpo"}, "heldout_problems": 5, "sampling": {"max_new_tokens": 8}}
    runtime |= overlay.pop("runtime", {})
    return make_params({"runtime": runtime, **overlay})


def test_heldout_reward_on_new_problems_with_the_final_weights(tiny_run: tuple[Paths, ResumePoint]) -> None:
    paths, point = tiny_run
    draw = heldout_problems(5, seed=0)[0]  # what the stage would take with nothing to leave out
    prompts = pd.DataFrame({"problem": [draw[1]["problem"], "A1 B2"], "prompt": ["x", "y"]})  # one is a run prompt
    m = heldout_metrics(_heldout_params(), paths, point, prompts, trainer_step=3)
    assert m["grpo/heldout_measured"] == 1 and m["grpo/heldout_problems"] == 5 and m["grpo/heldout_samples"] == 4
    assert m["grpo/heldout_weights_step"] == 3 and m["grpo/heldout_temperature"] == 1.0
    assert m["grpo/heldout_skipped_seen"] == heldout_problems(5, seed=0, exclude={draw[1]["problem"], "A1 B2"})[1]
    assert "none among the run's prompts" in m["grpo/heldout_note"]
    assert m["grpo/heldout_reward_after"] == m["grpo/heldout_reward_before"]  # the checkpoint holds the same weights
    assert m["grpo/heldout_gain"] == 0 and m["grpo/heldout_gain_se"] == 0 and m["grpo/heldout_seconds"] > 0
    assert 0 <= m["grpo/heldout_reward_before"] <= 1
    assert HELDOUT_SEED_OFFSET == 900  # the problems `asp heldout-reward` decodes too (common.seed + 900)

    late = heldout_metrics(_heldout_params(), paths, point, prompts, trainer_step=4)
    assert late["grpo/heldout_note"].endswith("trainer weights of step 3, not the last step 4")


def test_heldout_reward_not_measured_says_why(tiny_run: tuple[Paths, ResumePoint], tmp_path: Path) -> None:
    paths, point = tiny_run
    prompts = pd.DataFrame({"problem": ["A1"], "prompt": ["x"]})
    file_data = _heldout_params(prepare={"dataset": "data/math.jsonl"})
    off = _heldout_params(runtime={"heldout_problems": 0})
    no_ckpt = ResumePoint(plan=None, config=None, extra={}, directory=tmp_path, state=None, reason="")
    for params, pt, why in (
        (file_data, point, "not measured: data/math.jsonl has no held-out split excluded from GRPO training"),
        (off, point, "not measured: runtime.heldout_problems is 0"),
        (_heldout_params(), no_ckpt, f"not measured: no trainer checkpoint in {tmp_path}"),
    ):
        assert heldout_metrics(params, paths, pt, prompts, 3) == {"grpo/heldout_measured": 0, "grpo/heldout_note": why}
