"""Checks and loaders for local Hugging Face model directories (never a hub download).

`check_model_dir` validates that a path is a complete local checkpoint (config, tokenizer, safetensors
weights) and raises `asp.errors.UserError` naming the path and what is missing. `load_tokenizer` loads
the tokenizer the way every engine in `asp.rollout` does, so prompt token ids agree between engines.

Why not plain `AutoTokenizer`: in transformers 5, for ``model_type: qwen2`` directories AutoTokenizer
replaces a generic ``tokenizer.json`` tokenizer (``TokenizersBackend`` / ``PreTrainedTokenizerFast``)
by ``Qwen2Tokenizer``, which rebuilds a byte-level BPE from the vocabulary and silently mis-encodes
custom tokenizers (e.g. the demo's character tokenizer loses every space). When ``tokenizer.json``
exists we therefore load exactly that serialized pipeline; otherwise we fall back to AutoTokenizer.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from asp.errors import UserError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

TOKENIZER_FILES: tuple[str, ...] = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt")


def check_model_dir(model_path: str | Path) -> Path:
    """Check that `model_path` is a local model directory with config, tokenizer and safetensors weights.

    Args:
        model_path: a local directory (a hub id such as ``Qwen/Qwen3-8B`` is rejected: nothing is downloaded).

    Returns:
        The path as a resolved `Path`.

    Raises:
        UserError: naming the path and what is missing (directory, config.json, tokenizer files, weights).
    """
    path = Path(model_path).expanduser()
    if not path.exists():
        raise UserError(
            f"model path {str(path)!r} does not exist. Point it at a local Hugging Face checkpoint directory "
            "(config.json, tokenizer files, *.safetensors); models are never downloaded from a hub."
        )
    if not path.is_dir():
        raise UserError(f"model path {str(path)!r} is a file, not a checkpoint directory.")
    missing = []
    if not (path / "config.json").is_file():
        missing.append("config.json")
    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        missing.append(f"tokenizer files (one of {', '.join(TOKENIZER_FILES)})")
    if not any(path.glob("*.safetensors")):
        missing.append("weights (*.safetensors; convert .bin checkpoints with save_pretrained)")
    if missing:
        raise UserError(
            f"model directory {str(path)!r} is incomplete: missing {'; '.join(missing)}. "
            "Save the model and its tokenizer there with save_pretrained."
        )
    return path.resolve()


def load_tokenizer(model_path: str | Path, padding_side: str = "left") -> PreTrainedTokenizerBase:
    """Load a checkpoint's tokenizer from local files only (see the module docstring for the rule).

    Args:
        model_path: a directory accepted by `check_model_dir`.
        padding_side: ``"left"`` for batched generation.

    Returns:
        A `transformers` tokenizer with a pad token (falls back to the EOS token when none is set).
    """
    path = Path(model_path)
    if (path / "tokenizer.json").is_file():
        from transformers import PreTrainedTokenizerFast  # not AutoTokenizer: importing it costs seconds (auto maps)

        tok = PreTrainedTokenizerFast.from_pretrained(str(path), local_files_only=True)
    else:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True, trust_remote_code=False)
    tok.padding_side = padding_side
    if tok.pad_token_id is None:
        if tok.eos_token_id is None:
            raise UserError(f"tokenizer in {str(path)!r} has neither a pad nor an eos token; set one and re-save it.")
        tok.pad_token = tok.eos_token
    return tok
