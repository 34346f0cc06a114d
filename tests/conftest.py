"""Shared test setup: offline env, quiet progress bars, MLflow in a temporary SQLite store; ONE local Ray
cluster for the whole session and a tiny random Qwen2 (runtime and trainer tests).

Ray starts once (about 5 s, dashboard off) with 4 logical CPUs; every `run_async` call joins it and kills
its own actors on exit. `tiny_qwen` builds a random 2-layer Qwen2 with a word-level tokenizer.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from asp.env import set_offline_defaults

set_offline_defaults()
os.environ.setdefault("ASP_PROGRESS", "0")


@pytest.fixture(scope="session", autouse=True)
def _mlflow_store(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Every test logs to a throwaway SQLite store, never the repo's mlflow.db."""
    root = tmp_path_factory.mktemp("mlflow")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    os.environ["MLFLOW_TRACKING_URI"] = uri
    return uri


os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
RAY_CPUS = 4


@pytest.fixture(scope="session")
def ray_cluster():
    """The session's local Ray cluster (started here, shut down at the end)."""
    import ray

    if not ray.is_initialized():
        ray.init(num_cpus=RAY_CPUS, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


WORDS = ["<pad>", "<eos>", "<unk>"] + [f"w{i}" for i in range(45)] + [f"#{i}" for i in range(64)]


@pytest.fixture(scope="session")
def tiny_qwen(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random tiny Qwen2ForCausalLM (hidden 32, 2 layers) + word-level tokenizer saved to a temp dir."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    path = tmp_path_factory.mktemp("tiny_qwen")
    backend = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token="<eos>", pad_token="<pad>", unk_token="<unk>", padding_side="left"
    )
    config = Qwen2Config(
        vocab_size=len(WORDS),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        eos_token_id=1,
        pad_token_id=0,
        bos_token_id=None,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
