"""Save and load a trained length predictor as a directory (safetensors only, written atomically).

Layout of a saved predictor::

    predictor.json          format, backbone path, kind, pooling, max_length, target transform, LoRA/head, meta
    adapter/                peft LoRA adapter (adapter_config.json + adapter_model.safetensors)
    head.safetensors        regression head
    backbone.safetensors    instead of adapter/: the whole fine-tuned backbone (``lora_r`` 0, small encoders)
    lexical.safetensors     the TF-IDF ridge (``lexical_weight`` > 0): feature ids, idf, weights, intercept, penalty
    tokenizer/              the tokenizer (as used in training, pad token included)

The backbone weights are not copied: ``predictor.json`` records their local path (or the reference the caller
gives as ``backbone_ref``, e.g. the params' ``builtin:minilm``), and ``load_predictor`` loads them from there (or
from ``backbone_path`` when the model moved or a reference was recorded).

The same model and tokenizer always give the same bytes: peft's ``adapter_config.json`` is rewritten with its
module lists sorted (peft keeps them as sets, written in hash order) and the recorded backbone reference, and
peft's boilerplate model card (``README.md``, naming the backbone's absolute path) is not kept.
A step, not part of the pure predictor package: it writes files (``asp.io.atomic_path``).
Run the tests with ``.venv/bin/python -m pytest tests/predictor/test_checkpoint.py -q``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from transformers import PreTrainedTokenizerBase

from asp.errors import UserError
from asp.io import atomic_path
from asp.predictor.lexical import LexicalModel
from asp.predictor.model import LengthPredictor, load_backbone

FORMAT = "asp-length-predictor"
VERSION = 1
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_FILES = ("adapter/adapter_config.json", "adapter/adapter_model.safetensors")
SET_VALUED = ("target_modules", "exclude_modules", "modules_to_save")  # lists peft holds as sets
REQUIRED_KEYS = (
    "backbone_path",
    "kind",
    "pooling",
    "max_length",
    "lora_r",
    "lora_alpha",
    "lora_dropout",
    "target_modules",
    "head",
    "head_hidden",
    "head_dropout",
    "target_transform",
)


def canonical_adapter_config(config: dict[str, Any], backbone_ref: str | None = None) -> dict[str, Any]:
    """peft's adapter config with set-valued module lists sorted and, when given, ``backbone_ref`` as the base
    model (peft writes the absolute path the backbone was loaded from)."""
    out = dict(config)
    for key in SET_VALUED:
        if isinstance(out.get(key), list):
            out[key] = sorted(out[key])
    if backbone_ref is not None:
        out["base_model_name_or_path"] = backbone_ref
    return out


def _save_adapter(model: LengthPredictor, adapter_dir: Path, backbone_ref: str | None) -> None:
    """peft's ``save_pretrained``, then a canonical ``adapter_config.json`` and no model card (see module doc);
    a fully fine-tuned backbone (``lora_r`` 0) goes to backbone.safetensors next to ``adapter_dir`` instead."""
    if model.spec.lora_r == 0:
        weights = {k: v.detach().cpu().contiguous() for k, v in model.backbone.state_dict().items()}
        save_file(weights, str(adapter_dir.parent / "backbone.safetensors"))
        return
    model.backbone.save_pretrained(str(adapter_dir), safe_serialization=True, save_embedding_layers=False)
    config_path = adapter_dir / ADAPTER_CONFIG
    config = canonical_adapter_config(json.loads(config_path.read_text()), backbone_ref)
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    (adapter_dir / "README.md").unlink(missing_ok=True)


def save_predictor(
    model: LengthPredictor,
    tokenizer: PreTrainedTokenizerBase,
    out_dir: str | os.PathLike,
    meta: dict[str, Any],
    *,
    backbone_ref: str | None = None,
) -> Path:
    """Write adapter, head, tokenizer and predictor.json into ``out_dir`` (replaced atomically).

    Args:
        model: the trained predictor.
        tokenizer: its tokenizer.
        out_dir: target directory; an existing one is replaced only after everything was written.
        meta: JSON-serialisable extra information (training metrics, data hashes, params). Keep wall-clock
            values out of it: the same training run should give the same bytes.
        backbone_ref: what to record as the backbone instead of the directory it was loaded from (which may
            differ between machines, e.g. a package's install path); ``load_predictor`` then needs
            ``backbone_path`` unless the reference is itself a directory.

    Returns:
        The directory path.
    """
    try:
        meta_json = json.loads(json.dumps(meta))
    except (TypeError, ValueError) as e:
        raise ValueError(f"predictor meta must be JSON-serialisable: {e}") from e
    info = {
        "format": FORMAT,
        "version": VERSION,
        **model.spec.to_dict(),
        **({"backbone_path": backbone_ref} if backbone_ref is not None else {}),
        "hidden_size": int(model.head[1].in_features),
        "meta": meta_json,
    }
    out = Path(out_dir)
    with atomic_path(out) as tmp:
        tmp.mkdir()
        _save_adapter(model, tmp / "adapter", backbone_ref)
        head = {k: v.detach().cpu().contiguous() for k, v in model.head.state_dict().items()}
        save_file(head, str(tmp / "head.safetensors"))
        if model.lexical is not None:
            arrays = {k: torch.from_numpy(v) for k, v in model.lexical.to_arrays().items()}
            save_file(arrays, str(tmp / "lexical.safetensors"))
        tokenizer.save_pretrained(str(tmp / "tokenizer"))
        (tmp / "predictor.json").write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    return out


def read_predictor_info(pred_dir: str | os.PathLike) -> dict[str, Any]:
    """Parse and check ``predictor.json`` of a saved predictor; UserError naming the file when it is bad."""
    d = Path(pred_dir)
    if not d.is_dir():
        raise UserError(f"predictor directory {d} does not exist; run the train_predictor stage first")
    f = d / "predictor.json"
    if not f.is_file():
        raise UserError(f"{f} is missing, so {d} is not a saved predictor; re-run the train_predictor stage")
    try:
        info = json.loads(f.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{f} is corrupt ({e}); re-run the train_predictor stage") from e
    if not isinstance(info, dict) or info.get("format") != FORMAT:
        raise UserError(f"{f} is not an asp length-predictor file (format != {FORMAT!r}); re-run train_predictor")
    missing = [k for k in REQUIRED_KEYS if k not in info]
    if missing:
        raise UserError(f"{f} lacks the keys {missing}; re-run the train_predictor stage")
    if int(info.get("version", 0)) > VERSION:
        raise UserError(f"{f} has format version {info['version']}, newer than this asp ({VERSION}); upgrade asp")
    weights = ("backbone.safetensors",) if int(info["lora_r"]) == 0 else ADAPTER_FILES
    lexical = ("lexical.safetensors",) if float(info.get("lexical_weight", 0.0)) > 0 else ()
    for rel in (*weights, *lexical, "head.safetensors", "tokenizer"):
        if not (d / rel).exists():
            raise UserError(f"saved predictor {d} is incomplete: {d / rel} is missing; re-run train_predictor")
    return info


def load_predictor(
    pred_dir: str | os.PathLike, *, backbone_path: str | os.PathLike | None = None, dtype: str
) -> tuple[LengthPredictor, PreTrainedTokenizerBase, dict[str, Any]]:
    """Rebuild a saved predictor in eval mode.

    Args:
        pred_dir: directory written by ``save_predictor``.
        backbone_path: use this backbone directory instead of the recorded one (e.g. on another machine, or when
            a reference such as ``builtin:minilm`` was recorded).
        dtype: backbone dtype, see ``load_backbone``.

    Returns:
        (model, tokenizer, meta) where meta is the dict given to ``save_predictor``; ``model.spec`` holds the
        rest of predictor.json (max_length, kind, pooling, ...).

    Raises:
        UserError: missing or corrupt files, or a backbone that does not fit the saved adapter / head.
    """
    d = Path(pred_dir)
    info = read_predictor_info(d)
    bb = load_backbone(
        backbone_path or info["backbone_path"],
        kind=info["kind"],
        max_length=int(info["max_length"]),
        dtype=dtype,
        tokenizer_path=d / "tokenizer",
    )
    hidden = int(getattr(bb.model.config, "hidden_size", -1))
    if "hidden_size" in info and hidden != int(info["hidden_size"]):
        raise UserError(
            f"backbone {bb.path} has hidden size {hidden} but the predictor in {d} was trained on one "
            f"with {info['hidden_size']}; point it at the backbone it was trained with"
        )
    try:
        model = LengthPredictor(
            bb,
            lora_r=info["lora_r"],
            lora_alpha=info["lora_alpha"],
            lora_dropout=info["lora_dropout"],
            target_modules=info["target_modules"],
            head=info["head"],
            head_hidden=info["head_hidden"],
            head_dropout=info["head_dropout"],
            adapter_dir=d / "adapter",
            pooling=info["pooling"],
            truncation_side=info.get("truncation_side", "right"),
            lexical_weight=float(info.get("lexical_weight", 0.0)),
        )
        if int(info["lora_r"]) == 0:
            model.backbone.load_state_dict(load_file(str(d / "backbone.safetensors")), strict=True)
        model.head.load_state_dict(load_file(str(d / "head.safetensors")), strict=True)
        if model.spec.lexical_weight > 0:
            arrays = {k: v.numpy() for k, v in load_file(str(d / "lexical.safetensors")).items()}
            model.lexical = LexicalModel.from_arrays(arrays)
    except (SafetensorError, RuntimeError, ValueError, KeyError, OSError) as e:
        raise UserError(
            f"saved predictor {d} could not be loaded ({type(e).__name__}: {e}); its adapter or head "
            "file is corrupt or belongs to another backbone; re-run train_predictor"
        ) from e
    model.eval()
    return model, bb.tokenizer, info["meta"]
