"""Tests for asp.demo.tokenizer: vocabulary, chat template and the save/load round trip through every loader."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from asp.demo.policy import build_model
from asp.demo.task import generate_problems, intended_length, reference_response
from asp.demo.tokenizer import build_tokenizer

CHAT = [{"role": "user", "content": "Add mod 10: A3 B4"}]
TEXTS = ["Add mod 10: A3 B4", "A3=3 B4=7 answer: 7", "  tabs\tnew\nlines é ü 東 ~`{}"]


def test_one_token_per_character_and_exact_decode() -> None:
    tk = build_tokenizer()
    ids = tk("A3=3 B4=7")["input_ids"]
    assert tk.convert_ids_to_tokens(ids) == ["A", "3", "=", "3", "Ġ", "B", "4", "=", "7"]  # Ġ: byte-level space
    for text in TEXTS:
        assert tk.decode(tk(text)["input_ids"]) == text
    assert len(tk("é")["input_ids"]) == 2  # one token per UTF-8 byte, never <unk>
    for rec in generate_problems(50, seed=3):
        assert len(tk(reference_response(rec))["input_ids"]) == intended_length(rec)


def test_chat_template_generation_prompt() -> None:
    tk = build_tokenizer()
    text = tk.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    assert text == "<bos><|user|>Add mod 10: A3 B4<|assistant|>"
    ids = tk(text)["input_ids"]  # the template writes <bos>; encoding adds nothing
    assert ids[:2] == [tk.bos_token_id, tk.convert_tokens_to_ids("<|user|>")] and len(ids) == 2 + 17 + 1
    full = tk.apply_chat_template([*CHAT, {"role": "assistant", "content": "A3=3"}], tokenize=False)
    assert full == "<bos><|user|>Add mod 10: A3 B4<|assistant|>A3=3<eos>"
    with pytest.raises(Exception, match="only user and assistant"):
        tk.apply_chat_template([{"role": "system", "content": "hi"}, *CHAT], tokenize=False)


def test_checkpoint_dir_tokenizes_identically_through_every_loader(tmp_path: Path) -> None:
    # A Qwen2 config.json next to the tokenizer makes AutoTokenizer pick Qwen2Tokenizer and rebuild it from the
    # saved vocabulary (transformers 5); PreTrainedTokenizerFast reads tokenizer.json as is. Both must agree.
    tk = build_tokenizer()
    build_model(
        tk, seed=0, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32, max_position_embeddings=64
    ).save_pretrained(tmp_path)
    tk.save_pretrained(tmp_path)
    for loaded in (AutoTokenizer.from_pretrained(tmp_path), PreTrainedTokenizerFast.from_pretrained(tmp_path)):
        assert loaded.padding_side == "left"
        assert loaded.chat_template == tk.chat_template
        assert (loaded.bos_token, loaded.eos_token, loaded.pad_token, loaded.unk_token) == (
            "<bos>",
            "<eos>",
            "<pad>",
            "<unk>",
        )
        assert len(loaded) == len(tk) == 6 + 256  # specials + byte symbols
        chat = loaded.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
        for text in [*TEXTS, chat]:
            assert loaded(text)["input_ids"] == tk(text)["input_ids"]
        batch = loaded(["A3", "A3=3 B4"], padding=True)
        assert batch["input_ids"][0][:5] == [loaded.pad_token_id] * 5  # left padding
        assert batch["attention_mask"][0] == [0] * 5 + [1, 1]
