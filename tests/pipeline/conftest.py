"""Shared setup for the stage tests: tiny params, real MLflow runs in the session's temporary SQLite store, and the two
upstream artifacts that need a real model (a tiny demo policy, a MiniLM predictor trained for one epoch), each
built once per session by the stage itself.

Upstream inputs that need no model (prompt and profile Parquet files) are written directly by `write_prompts`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch
from mlflow import MlflowClient

from asp.config import Params, deep_merge, validate_params
from asp.demo.task import generate_problems, intended_length
from asp.pipeline import policy, train_predictor
from asp.steps.loaders import load_trained_predictor
from asp.steps.paths import rebase
from asp.tracking import MlflowTracker, end_run, start_run

EXPERIMENT = "stage-tests"

# The demo policy at toy size: a few warm-start steps, a 2-prompt x 2-sample check (about a second of compute).
TINY_POLICY = {
    "demo": {
        "hidden_size": 32,
        "num_layers": 1,
        "num_heads": 2,
        "intermediate_size": 64,
        "warm_start_steps": 8,
        "batch_size": 8,
        "warm_start_problems": 64,
        "target_reward": None,  # tests/pipeline/test_policy.py checks the target on its own
    },
    "eval": {"prompts": 4, "samples": 2, "max_new_tokens": 16, "batch_size": 8},
}
# MiniLM + LoRA, one epoch over ~20 prompts of at most 32 tokens.
TINY_PREDICTOR = {"epochs": 1, "batch_size": 8, "max_length": 32}
TRAIN_THREADS = 2  # torch threads of the session's train_predictor run and of test_determinism's rerun
N_PROFILE, N_HELDOUT, N_TRAIN = 24, 12, 40


def make_params(overlay: dict[str, Any] | None = None) -> Params:
    """The demo params with `overlay` merged in (validated like params.yaml)."""
    return validate_params(deep_merge(Params.defaults().model_dump(mode="json"), overlay or {}), "test params")


@pytest.fixture(scope="session")
def new_tracker(_mlflow_store: str, tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], MlflowTracker]:
    """Start a real MLflow run in the session's temporary SQLite store (one store: creating one costs seconds),
    with artifacts under a temporary directory (never the repo's mlartifacts/)."""
    client = MlflowClient(tracking_uri=_mlflow_store)
    if client.get_experiment_by_name(EXPERIMENT) is None:
        client.create_experiment(EXPERIMENT, artifact_location=tmp_path_factory.mktemp("mlartifacts").as_uri())

    def start(run_name: str) -> MlflowTracker:
        return start_run(_mlflow_store, EXPERIMENT, run_name)

    return start


def artifact_paths(tracker: MlflowTracker, folder: str | None = None) -> set[str]:
    """Paths of the artifacts logged to the tracker's run (one folder level)."""
    return {f.path for f in tracker.client.list_artifacts(tracker.run_id, folder)}


def write_prompts(
    prompts_dir: Path, records: list[dict], roles: dict[str, list[int]], template: Callable[[str], str] = str
) -> dict[str, pd.DataFrame]:
    """Write `<role>.parquet` (prompt_id, prompt, problem, answer) for each role = indices into `records`, as the
    prepare stage does; `prompt` = `template(problem)`."""
    prompts_dir.mkdir(parents=True, exist_ok=True)
    frames = {}
    for role, idx in roles.items():
        df = pd.DataFrame(
            {
                "prompt_id": [f"q{i:03d}" for i in idx],
                "prompt": [template(records[i]["problem"]) for i in idx],
                "problem": [records[i]["problem"] for i in idx],
                "answer": [records[i]["answer"] for i in idx],
            }
        )
        df.to_parquet(prompts_dir / f"{role}.parquet", index=False)
        frames[role] = df
    return frames


def chat_template(tokenizer: Any) -> Callable[[str], str]:
    """`write_prompts`' template for a policy's tokenizer: the problem as one user turn, generation prompt added."""

    def template(problem: str) -> str:
        messages = [{"role": "user", "content": problem}]
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    return template


@dataclass(frozen=True)
class Built:
    """A stage run done once for several tests: its params, paths, returned metrics and MLflow run."""

    params: Params
    paths: Any
    metrics: dict[str, Any]
    tracker: MlflowTracker
    extra: dict[str, Any]


@pytest.fixture(scope="session")
def demo_policy(tmp_path_factory: pytest.TempPathFactory, new_tracker: Callable[[str], MlflowTracker]) -> Built:
    """The policy stage at toy size (source: build), logged to its own MLflow store."""
    root = tmp_path_factory.mktemp("policy")
    params = make_params({"policy": TINY_POLICY})
    paths = rebase(policy.Paths(), root)
    tracker = new_tracker("policy")
    metrics = policy.run(params, paths, tracker)
    end_run(tracker)
    return Built(params, paths, metrics, tracker, {})


@pytest.fixture(scope="session")
def predictor_inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Prompts (train / profile / held-out) and profiled mean lengths of demo problems.

    True mean length = the demo reference length (5 * steps + 9 tokens) times a seeded factor in [0.8, 1.25]:
    learnable from the text, not exactly. One held-out prompt (the last) has no profile row.
    """
    root = tmp_path_factory.mktemp("predictor_inputs")
    records = generate_problems(N_TRAIN, seed=3)  # 2 profile, 1 held-out, 3 train texts > 32 tokens
    frames = write_prompts(
        root / "prompts",
        records,
        {
            "train": list(range(N_TRAIN)),
            "profile": list(range(N_PROFILE)),
            "heldout": list(range(N_PROFILE, N_PROFILE + N_HELDOUT + 1)),
        },
    )
    rng = np.random.default_rng(5)
    profiled = list(range(N_PROFILE + N_HELDOUT))
    true = np.array([intended_length(records[i]) for i in profiled]) * np.exp(rng.uniform(-0.22, 0.22, len(profiled)))
    stats = pd.DataFrame(
        {
            "prompt_id": [f"q{i:03d}" for i in profiled],
            "role": ["profile"] * N_PROFILE + ["heldout"] * N_HELDOUT,
            "mean_length": true,
        }
    )
    (root / "profile").mkdir()
    stats.to_parquet(root / "profile" / "prompts.parquet", index=False)
    factors = rng.uniform(0.5, 1.5, (len(profiled), 4))
    factors /= factors.mean(axis=1, keepdims=True)  # 4 samples per prompt whose mean is its mean_length
    samples = pd.DataFrame(
        {
            "prompt_id": np.repeat(stats["prompt_id"].to_numpy(), 4),
            "role": np.repeat(stats["role"].to_numpy(), 4),
            "sample": np.tile(np.arange(4), len(profiled)),
            "length": (true[:, None] * factors).ravel(),
            "finish_reason": "stop",
        }
    )
    samples.to_parquet(root / "profile" / "samples.parquet", index=False)
    return {"root": root, "frames": frames, "stats": stats, "samples": samples}


@pytest.fixture(scope="session")
def trained_predictor(
    tmp_path_factory: pytest.TempPathFactory,
    predictor_inputs: dict[str, Any],
    new_tracker: Callable[[str], MlflowTracker],
) -> Built:
    """The train_predictor stage on `predictor_inputs` (MiniLM backbone, one epoch), with a real tracker."""
    root = tmp_path_factory.mktemp("train_predictor")
    params = make_params({"predictor": TINY_PREDICTOR})
    inputs = predictor_inputs["root"]
    paths = rebase(train_predictor.Paths(prompts=inputs / "prompts", profile=inputs / "profile"), root)
    tracker = new_tracker("train_predictor")
    # torch's thread count changes float summation order, hence the bytes; tests that ran earlier in this process
    # (an hf engine, an in-process GRPO trainer) may have changed it, so the run uses the count that
    # test_determinism's fresh-process rerun uses (TRAIN_THREADS)
    before = torch.get_num_threads()
    torch.set_num_threads(TRAIN_THREADS)
    try:
        metrics = train_predictor.run(params, paths, tracker)
    finally:
        torch.set_num_threads(before)
    end_run(tracker)
    return Built(params, paths, metrics, tracker, predictor_inputs)


@pytest.fixture(scope="session")
def loaded_predictor(trained_predictor: Built) -> tuple[Any, Any, dict[str, Any]]:
    """(model, tokenizer, meta) of the trained predictor, read back with the stages' shared loader."""
    return load_trained_predictor(trained_predictor.paths.out_dir, trained_predictor.params.predictor)


def read_metrics(path: Path) -> dict[str, Any]:
    """A metrics JSON file with `null` (how non-finite values are written: JSON has no NaN) read back as NaN."""
    return {k: float("nan") if v is None else v for k, v in json.loads(path.read_text()).items()}
