"""The shapes of a Llama/Qwen-style decoder that decide its memory, dense or mixture-of-experts (MoE).

Pure data: `Architecture` (parameter counts), `from_hf_config` (a transformers ``config.json`` mapping ->
`Architecture`) and `BUILTIN` (published configs, by name). `asp.sim.memory` turns them into bytes; docs/memory.md
writes the formulas out. With h hidden, L layers, V vocab, I the dense MLP's intermediate size, q = heads x
head_dim, kv = kv_heads x head_dim, E routed experts of intermediate size I_e, k of them per token, I_s the shared
expert's intermediate size (Qwen2-MoE), L_s of the L layers sparse (an MoE block instead of the dense MLP)::

    parameters = V h (embedding) + [V h (lm_head, untied only)] + h (final norm)
                 + L x (h q + 2 h kv + q h + [q + 2 kv] (Qwen2 q/k/v biases) + [2 head_dim] (Qwen3 q/k norms) + 2 h)
                 + (L - L_s) x 3 h I                                  (dense SwiGLU MLPs)
                 + L_s x (h E (router) + E x 3 h I_e + [3 h I_s + h] (shared expert + its sigmoid gate))

The active parameters (what one token passes through) replace E x 3 h I_e by k x 3 h I_e. Training keeps every
expert's parameters, gradients and AdamW moments (the total); the activations follow the k active experts.

Families read from ``config.json``: dense Llama / Qwen2 / Qwen3, and the MoE families ``qwen2_moe``
(``num_experts``, ``moe_intermediate_size``, ``shared_expert_intermediate_size``), ``qwen3_moe`` (the same without
shared experts; ``decoder_sparse_step`` and ``mlp_only_layers`` choose the sparse layers) and ``mixtral``
(``num_local_experts``, experts of ``intermediate_size``). tests/sim/test_memory_moe.py checks the count against
``sum(p.numel())`` of randomly initialised tiny transformers models of each family.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any


@dataclass(frozen=True, slots=True)
class Architecture:
    """A Llama/Qwen-style decoder, dense (``num_experts`` 0) or MoE: the shapes that decide its memory."""

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int  # the dense MLP's (the layers that are not sparse)
    tie_word_embeddings: bool
    attention_bias: bool = False  # q/k/v biases (Qwen2)
    qk_norm: bool = False  # per-head q/k RMSNorm (Qwen3)
    max_position_embeddings: int | None = None
    num_experts: int = 0  # routed experts per sparse layer; 0: a dense model
    experts_per_token: int = 0  # k: routed experts each token passes through
    expert_intermediate_size: int = 0  # I_e of one routed expert (a SwiGLU MLP)
    shared_expert_intermediate_size: int = 0  # I_s of the always-on shared expert (Qwen2-MoE); 0: none
    sparse_layers: int = 0  # L_s: decoder layers with the MoE block; the other layers have the dense MLP

    def __post_init__(self) -> None:
        if self.num_experts < 0 or self.sparse_layers < 0:
            raise ValueError("num_experts and sparse_layers must be >= 0")
        if self.num_experts == 0:
            if self.sparse_layers:
                raise ValueError(f"sparse_layers = {self.sparse_layers} without experts (num_experts 0)")
            return
        if not 1 <= self.experts_per_token <= self.num_experts:
            raise ValueError(f"experts per token {self.experts_per_token} must lie in [1, {self.num_experts}]")
        if self.expert_intermediate_size < 1:
            raise ValueError("an MoE needs the experts' intermediate size (moe_intermediate_size)")
        if not 1 <= self.sparse_layers <= self.num_layers:
            raise ValueError(f"sparse_layers = {self.sparse_layers} must lie in [1, num_layers = {self.num_layers}]")

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def dense_layers(self) -> int:
        return self.num_layers - self.sparse_layers

    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def attention_params(self) -> int:
        """Parameters every decoder layer has besides its MLP: q/k/v/o projections, biases, q/k norms, two norms."""
        h, q, kv = self.hidden_size, self.q_dim, self.kv_dim
        bias = q + 2 * kv if self.attention_bias else 0
        qk_norm = 2 * self.head_dim if self.qk_norm else 0
        return h * q + 2 * h * kv + q * h + bias + qk_norm + 2 * h

    @property
    def dense_mlp_params(self) -> int:
        return 3 * self.hidden_size * self.intermediate_size

    def moe_params(self, experts: int) -> int:
        """One sparse layer's MoE block counting `experts` routed experts: router, experts, shared expert + gate."""
        h = self.hidden_size
        shared = 3 * h * self.shared_expert_intermediate_size + h if self.shared_expert_intermediate_size else 0
        return h * self.num_experts + experts * 3 * h * self.expert_intermediate_size + shared

    @property
    def layer_params(self) -> int:
        """Parameters of the largest decoder layer (a sparse one in an MoE, with all its experts): what FSDP2
        gathers for one layer."""
        mlp = [self.dense_mlp_params] if self.dense_layers else []
        mlp += [self.moe_params(self.num_experts)] if self.sparse_layers else []
        return self.attention_params + max(mlp)

    @property
    def root_params(self) -> int:
        """Embedding, lm_head when untied, final norm: the parameters outside the decoder layers."""
        emb = self.vocab_size * self.hidden_size
        return emb * (1 if self.tie_word_embeddings else 2) + self.hidden_size

    def _params(self, experts: int) -> int:
        dense = self.dense_layers * self.dense_mlp_params
        sparse = self.sparse_layers * self.moe_params(experts) if self.sparse_layers else 0
        return self.root_params + self.num_layers * self.attention_params + dense + sparse

    @property
    def num_params(self) -> int:
        """All parameters (every expert): what the trainer stores, differentiates and optimizes, what vLLM loads."""
        return self._params(self.num_experts)

    @property
    def active_params(self) -> int:
        """Parameters one token passes through (k routed experts per sparse layer); `num_params` when dense."""
        return self._params(self.experts_per_token)


def _get(config: Mapping[str, Any], key: str) -> Any:
    value = config.get(key)
    if value is None:
        raise ValueError(f"config.json has no {key!r}; it is not a Llama/Qwen-style decoder config")
    return value


def _moe_fields(config: Mapping[str, Any], layers: int, dense_intermediate: int) -> dict[str, int]:
    """The MoE fields of a config.json (empty for a dense model); raises `ValueError` for an MoE not modelled."""
    for key in ("n_routed_experts", "n_shared_experts", "first_k_dense_replace"):
        if config.get(key):
            raise ValueError(
                f"config.json has {key!r}: a DeepSeek-style mixture of experts, which this estimate does not model "
                "(it reads qwen2_moe, qwen3_moe and mixtral configs)"
            )
    experts = int(config.get("num_experts") or config.get("num_local_experts") or 0)
    if experts == 0:
        return {}
    per_token = int(_get(config, "num_experts_per_tok"))
    step = int(config.get("decoder_sparse_step") or 1)
    dense_only = set(config.get("mlp_only_layers") or [])
    sparse = sum(1 for i in range(layers) if i not in dense_only and (i + 1) % step == 0)
    return {
        "num_experts": experts,
        "experts_per_token": per_token,
        # Qwen-MoE: moe_intermediate_size; Mixtral: every expert has the (dense) intermediate_size
        "expert_intermediate_size": int(config.get("moe_intermediate_size") or dense_intermediate),
        "shared_expert_intermediate_size": int(config.get("shared_expert_intermediate_size") or 0),
        "sparse_layers": sparse,
    }


def from_hf_config(config: Mapping[str, Any]) -> Architecture:
    """An `Architecture` from a transformers ``config.json`` mapping (or its ``text_config``).

    Raises:
        ValueError: naming the first missing key, or a mixture of experts this estimate does not model.
    """
    if "hidden_size" not in config and isinstance(config.get("text_config"), Mapping):
        config = config["text_config"]
    heads = int(_get(config, "num_attention_heads"))
    hidden = int(_get(config, "hidden_size"))
    layers = int(_get(config, "num_hidden_layers"))
    intermediate = int(_get(config, "intermediate_size"))
    model_type = str(config.get("model_type", ""))
    qkv_bias = model_type == "qwen2" or (model_type == "qwen2_moe" and bool(config.get("qkv_bias", True)))
    return Architecture(
        vocab_size=int(_get(config, "vocab_size")),
        hidden_size=hidden,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=int(config.get("num_key_value_heads") or heads),
        head_dim=int(config.get("head_dim") or hidden // heads),
        intermediate_size=intermediate,
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        attention_bias=qkv_bias or bool(config.get("attention_bias", False)),
        qk_norm=model_type.startswith("qwen3"),
        max_position_embeddings=config.get("max_position_embeddings"),
        **_moe_fields(config, layers, intermediate),
    )


def _qwen2(v: int, h: int, layers: int, heads: int, kv: int, inter: int, tied: bool, ctx: int) -> Architecture:
    dim = h // heads
    return Architecture(v, h, layers, heads, kv, dim, inter, tied, attention_bias=True, max_position_embeddings=ctx)


def _qwen3(h: int, layers: int, heads: int, kv: int, inter: int, tied: bool) -> Architecture:
    return Architecture(151936, h, layers, heads, kv, 128, inter, tied, qk_norm=True, max_position_embeddings=40960)


def _moe(dense: Architecture, experts: int, k: int, expert_inter: int, shared_inter: int = 0) -> Architecture:
    """`dense` with every layer sparse: `experts` routed experts of `expert_inter`, `k` per token."""
    return replace(
        dense,
        num_experts=experts,
        experts_per_token=k,
        expert_intermediate_size=expert_inter,
        shared_expert_intermediate_size=shared_inter,
        sparse_layers=dense.num_layers,
    )


# Published config.json values (Qwen2.5: the -Instruct configs; the base models state a longer context).
BUILTIN: dict[str, Architecture] = {
    "qwen2.5-0.5b": _qwen2(151936, 896, 24, 14, 2, 4864, True, 32768),
    "qwen2.5-1.5b": _qwen2(151936, 1536, 28, 12, 2, 8960, True, 32768),
    "qwen2.5-3b": _qwen2(151936, 2048, 36, 16, 2, 11008, True, 32768),
    "qwen2.5-7b": _qwen2(152064, 3584, 28, 28, 4, 18944, False, 32768),
    "qwen2.5-14b": _qwen2(152064, 5120, 48, 40, 8, 13824, False, 32768),
    "qwen2.5-32b": _qwen2(152064, 5120, 64, 40, 8, 27648, False, 32768),
    "qwen3-1.7b": _qwen3(2048, 28, 16, 8, 6144, True),
    "qwen3-4b": _qwen3(2560, 36, 32, 8, 9728, True),
    "qwen3-8b": _qwen3(4096, 36, 32, 8, 12288, False),
    "llama-3.1-8b": Architecture(128256, 4096, 32, 32, 8, 128, 14336, False, max_position_embeddings=131072),
    # MoE: Qwen3-30B-A3B (128 experts of 768, 8 per token, every layer sparse; intermediate_size 6144 unused),
    # Qwen1.5-MoE-A2.7B (60 experts of 1408, 4 per token, a shared expert of 5632 with a sigmoid gate),
    # Mixtral-8x7B-v0.1 (8 experts of 14336, 2 per token).
    "qwen3-30b-a3b": _moe(_qwen3(2048, 48, 32, 4, 6144, False), 128, 8, 768),
    "qwen1.5-moe-a2.7b": _moe(_qwen2(151936, 2048, 24, 16, 16, 5632, False, 8192), 60, 4, 1408, 5632),
    "mixtral-8x7b": _moe(
        Architecture(32000, 4096, 32, 32, 8, 128, 14336, False, max_position_embeddings=32768), 8, 2, 14336
    ),
}
