"""The demo pipeline on real vLLM (CPU build): configs/demo-vllm.yaml over the tiny end-to-end params.

Every stage runs in order in one temporary directory, logged to the session's temporary MLflow store: the profile
stage generates with a vLLM engine, and the launch runs GRPO with two vLLM generation actors on the local Ray
cluster, each weight update reloaded into the running engines (rpc buckets through vLLM's worker extension),
partial rollouts on (responses cut at the token budget and continued from their token ids) and the drift watch on.
The policy is the demo's Qwen2 at a size vLLM's CPU attention takes (head size 32).

    .venv/bin/python -m pytest tests/e2e/test_vllm_demo.py -q
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml
from mlflow import MlflowClient

from asp.config import validate_params

from .conftest import ROOT, TINY, tiny_params
from .test_stages_demo import run_stages

PRESET = yaml.safe_load((ROOT / "configs/demo-vllm.yaml").read_text())
VLLM_POLICY = {"policy": {"demo": {"hidden_size": 64, "num_heads": 2, "intermediate_size": 128}}}
ITERATIONS = 8  # x 8 prompts; q_max 8 holds generation back until training catches up, so that later minibatches
# are certain to be generated after a weight update (with the default q_max all could be, under load, before one)
RUN = {
    "profile": {"engine": {"vllm": {"enforce_eager": True}}},  # engines start without a compile warm-up (tests only)
    "runtime": {
        "engine": {"vllm": {"enforce_eager": True}},
        "iterations": ITERATIONS,
        "checkpoint_interval": 2,
        "heldout_problems": 0,
        "partial": {"token_budget": 16},
        "grpo": {"warmup_steps": 0},
        "queue": {"q_max": 8},
        "trainer": {"kind": "grpo"},
    },
}


@pytest.mark.slow
def test_demo_pipeline_on_vllm(tmp_path: Path, ray_cluster) -> None:
    params = validate_params(tiny_params(VLLM_POLICY, PRESET, RUN))
    assert params.profile.engine.kind == params.runtime.engine.kind == "vllm" and params.runtime.partial.enabled
    _, run_ids = run_stages(params, tmp_path, "e2e-vllm")

    prep = TINY["prepare"]
    samples = pd.read_parquet(tmp_path / "outputs/profile/samples.parquet")
    assert len(samples) == (prep["profile_prompts"] + prep["heldout_prompts"]) * TINY["profile"]["n_samples"]
    assert set(samples.finish_reason) <= {"stop", "length"}
    assert samples.length.max() <= TINY["profile"]["max_new_tokens"]
    assert MlflowClient().get_run(run_ids["profile"]).data.params["profile.engine.kind"] == "vllm"

    lm = json.loads((tmp_path / "metrics/launch.json").read_text())
    assert lm["runtime/summary/finished"] == 1 and lm["runtime/summary/iterations"] == ITERATIONS
    iterations = pd.read_parquet(tmp_path / "outputs/launch/iterations.parquet")
    assert iterations.step.tolist() == list(range(1, ITERATIONS + 1))
    minibatches = pd.read_parquet(tmp_path / "outputs/launch/minibatches.parquet")
    assert minibatches.policy_version.max() >= 1  # generated with weights GRPO updated and the engines reloaded
    assert (minibatches.reload_s > 0).any()  # a reload before a continuation goes on its first task's minibatch
    assert lm["runtime/summary/reloads"] >= (minibatches.reload_s > 0).sum()
    launch = MlflowClient().get_run(run_ids["launch"]).data
    assert launch.params["runtime.engine.kind"] == "vllm" and launch.params["runtime.partial.enabled"] == "True"
    assert any(k.startswith("drift/summary/") for k in lm)
