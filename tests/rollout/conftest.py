"""Tiny local checkpoints for the rollout tests: a random 2-layer Qwen2 and a word-level tokenizer.

`build_tiny_checkpoint(path, eos_logit=...)` saves config, safetensors weights and tokenizer to `path`.
With ``eos_logit`` set, the residual stream is dominated by one constant embedding dimension (0) and the
lm_head reads EOS from that dimension only, so the EOS logit is about ``eos_logit * sqrt(hidden)`` at every
step: +20 makes EOS near-certain (every sample stops at once), -20 makes it impossible (every sample runs
to the cap).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

PAD, EOS, UNK = "<pad>", "<eos>", "<unk>"
WORDS = [PAD, EOS, UNK] + [f"w{i}" for i in range(45)]  # 48 tokens: pad=0, eos=1, unk=2, "wK" = K + 3
EOS_ID, PAD_ID = 1, 0


def build_tokenizer() -> PreTrainedTokenizerFast:
    """Word-level tokenizer: whitespace-split words ``w0``..``w44`` plus pad/eos/unk, left padding."""
    backend = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(WORDS)}, unk_token=UNK))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token=EOS, pad_token=PAD, unk_token=UNK, padding_side="left"
    )


def build_tiny_checkpoint(
    path: Path, eos_logit: float | None = None, max_positions: int = 128, hidden_size: int = 32, tied: bool = False
) -> Path:
    """Save a tiny random Qwen2ForCausalLM (hidden `hidden_size`, 4 heads, 2 layers) and its tokenizer to `path`.

    vLLM's CPU attention kernels take head sizes of 32 and more: its engines get ``hidden_size=128``. ``tied``: the
    output head shares the input embedding (as the demo policy and small Qwen2 models do).
    """
    config = Qwen2Config(
        vocab_size=len(WORDS),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        eos_token_id=EOS_ID,
        pad_token_id=PAD_ID,
        bos_token_id=None,
        tie_word_embeddings=tied,
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    if eos_logit is not None:
        with torch.no_grad():
            model.model.embed_tokens.weight[:, 0] = 50.0
            model.lm_head.weight[:, 0] = 0.0
            model.lm_head.weight[EOS_ID, 0] = eos_logit
    model.save_pretrained(path)
    build_tokenizer().save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random tiny checkpoint (EOS about as likely as any other token)."""
    return build_tiny_checkpoint(tmp_path_factory.mktemp("tiny_random"))


@pytest.fixture(scope="session")
def stop_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny checkpoint whose first sampled token is EOS with probability ~1."""
    return build_tiny_checkpoint(tmp_path_factory.mktemp("tiny_stop"), eos_logit=20.0)


@pytest.fixture(scope="session")
def never_stop_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny checkpoint that never samples EOS."""
    return build_tiny_checkpoint(tmp_path_factory.mktemp("tiny_never"), eos_logit=-20.0)
