"""`make_engine`: the generation engine of a kind (``"hf"`` / ``"vllm"``) for a local checkpoint directory, its
options checked against what the engine takes (re-exported by `asp.rollout`)."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import TYPE_CHECKING, Any

from asp.errors import UserError
from asp.rollout.base import Engine
from asp.rollout.model_dir import check_model_dir

if TYPE_CHECKING:
    from asp.rollout.hf import HFEngine
    from asp.rollout.vllm import VLLMEngine

ENGINE_KINDS = ("hf", "vllm")


def make_engine(kind: str, model_path: str | Path, **kwargs: Any) -> Engine:
    """Build a generation engine.

    Args:
        kind: ``"hf"`` or ``"vllm"``.
        model_path: local checkpoint directory (config.json, tokenizer files, *.safetensors).
        **kwargs: engine options: `HFEngine` (device, dtype, logprobs_mode, attn_implementation, num_threads) or
            `VLLMEngine` (the fields of `asp.rollout.vllm.VLLMOptions`: those of ``runtime.engine.vllm``, i.e.
            `asp.config.VllmRuntimeParams`, plus dtype, seed and logprobs_mode).

    Raises:
        UserError: unknown kind, a missing or incomplete model directory, vLLM not installed, or an
            option the engine does not take.
    """
    if kind not in ENGINE_KINDS:
        raise UserError(f"unknown generation engine {kind!r}; choose one of {', '.join(ENGINE_KINDS)}.")
    path = check_model_dir(model_path)
    cls: type[HFEngine] | type[VLLMEngine]
    if kind == "hf":
        from asp.rollout.hf import HFEngine

        cls = HFEngine
        allowed = [p for p in inspect.signature(cls.__init__).parameters if p not in ("self", "model_path")]
    else:
        from asp.rollout.vllm import VLLMEngine, VLLMOptions

        cls = VLLMEngine
        allowed = list(VLLMOptions.model_fields)
    unknown = sorted(set(kwargs) - set(allowed))
    if unknown:
        raise UserError(f"engine {kind!r} does not take option(s) {unknown}; it takes {allowed}.")
    return cls(path, **kwargs)
