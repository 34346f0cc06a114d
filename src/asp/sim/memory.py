"""Fits-or-fails memory estimate of a GRPO run: per trainer device (FSDP2 rank) and per vLLM generation device.

Pure arithmetic over an `Architecture` (a Llama/Qwen-style decoder) and settings dataclasses; no I/O. The glue
that turns params into these inputs is `asp.pipeline.memory_check`; the CLI is ``asp plan memory`` and
``asp params check``; the formulas are written out in docs/memory.md. Sizes are bytes; ``GIB = 2**30``.

Parameter count (``Architecture.num_params``), with h hidden, L layers, V vocab, I intermediate, q = heads x
head_dim, kv = kv_heads x head_dim::

    V h (embedding) + [V h (lm_head, untied only)] + h (final norm)
    + L x (h q + 2 h kv + q h   (q, k, v, o projections)
           + q + 2 kv            (q/k/v biases: Qwen2 only)
           + 2 head_dim          (q/k RMSNorms: Qwen3 only)
           + 3 h I + 2 h)        (SwiGLU MLP, two RMSNorms)

Trainer device (one of ``world_size`` FSDP2 ranks, N = world_size, P = parameters):

* parameters 4P/N, gradients 4P/N (fp32 shards; under FSDP2 mixed precision the fp32 shards are the master
  weights and gradients are reduced in fp32), optimizer 8P/N (AdamW: two fp32 moments); with ``cpu_offload``
  these three live in host memory (reported as host bytes);
* gathered (FSDP2 runs when N > 1, bf16 mixed precision or cpu_offload; one plain rank otherwise): unsharded
  copies of the root module (embedding, untied lm_head, final norm: its parameters and its gradient stay
  unsharded through backward) plus two decoder layers' parameters (current + prefetched) and one layer's
  unsharded gradient before its reduce-scatter: ``b' x (2 root + 3 layer)`` with b' = 2 under bf16 mixed
  precision, else 4;
* activations for T = max(micro_batch_tokens, longest row) tokens. Per token and decoder layer the backward
  keeps ``A = b (5h + 3q + 4kv + 4I) + 8h`` bytes: in the compute dtype (b bytes) the two norm outputs before and
  after their weight (4h), q, its rotated half and q after RoPE (3q), k likewise (3kv), v (kv), the attention
  output (h; flash/SDPA attention keeps no seq^2 scores), and the SwiGLU gate, up, silu(gate) and their product
  (4I); plus the two RMSNorm inputs upcast to fp32 (8h bytes). Without activation checkpointing:
  ``T (L A + 2 b h)``; with it (one checkpoint per decoder layer): ``T (L b h + A)`` (the saved layer inputs plus
  one layer recomputed in backward);
* logits: ``T V (b + 12)`` (logits in the compute dtype, their fp32 copy's log-softmax saved for backward, and in
  backward its fp32 gradient and the fp32 gradient of the logits), plus ``T V r`` when a reference model scores
  the same micro-batch (its logits exist while the policy's are held; r = 2 under autocast, else 4: the reference
  is a plain module, FSDP's mixed precision does not reach it). For a 152k vocabulary this is the biggest
  activation term: 32k tokens x 151,936 x 14 B = 65 GiB;
* reference (kl_coef > 0): 4P, the trainer's frozen fp32 copy of the whole policy (``copy.deepcopy`` before
  sharding), unsharded and on the device even with cpu_offload;
* reserve: ``reserve_gib`` (CUDA context, allocator fragmentation, NCCL buffers).

Generation device (one vLLM instance over ``tensor_parallel_size`` = t GPUs, d engine dtype bytes): weights
``P d / t``; KV cache per token ``2 L ceil(kv_heads / t) head_dim d``; budget ``gpu_memory_utilization x
device``; allowance ``1 GiB`` (CUDA graphs, non-torch memory) + the profile run's activations
``8192 tokens x (4h + 3 I / t) d`` + sampler logits ``256 sequences x V x 4``; sequences that fit =
``(budget - weights - allowance) / (KV per token x sequence length)``. vLLM refuses to start below one.

Run the unit tests with ``.venv/bin/python -m pytest tests/sim/test_memory.py``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

GIB = 2**30
GRAPH_ALLOWANCE = GIB  # vLLM CUDA graphs and non-torch memory, per GPU
PROFILE_TOKENS = 8192  # vLLM max_num_batched_tokens of the profile run
SAMPLER_SEQS = 256  # vLLM max_num_seqs: fp32 logits of one sampling step
MAX_WORLD_SIZE = 64


@dataclass(frozen=True, slots=True)
class Architecture:
    """A Llama/Qwen-style decoder: the shapes that decide its memory."""

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    tie_word_embeddings: bool
    attention_bias: bool = False  # q/k/v biases (Qwen2)
    qk_norm: bool = False  # per-head q/k RMSNorm (Qwen3)
    max_position_embeddings: int | None = None

    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def layer_params(self) -> int:
        """Parameters of one decoder layer (formula in the module docstring)."""
        h, q, kv = self.hidden_size, self.q_dim, self.kv_dim
        attn = h * q + 2 * h * kv + q * h
        bias = q + 2 * kv if self.attention_bias else 0
        qk_norm = 2 * self.head_dim if self.qk_norm else 0
        return attn + bias + qk_norm + 3 * h * self.intermediate_size + 2 * h

    @property
    def root_params(self) -> int:
        """Embedding, lm_head when untied, final norm: the parameters outside the decoder layers."""
        emb = self.vocab_size * self.hidden_size
        return emb * (1 if self.tie_word_embeddings else 2) + self.hidden_size

    @property
    def num_params(self) -> int:
        return self.root_params + self.num_layers * self.layer_params


def _get(config: Mapping[str, Any], key: str) -> Any:
    value = config.get(key)
    if value is None:
        raise ValueError(f"config.json has no {key!r}; it is not a Llama/Qwen-style decoder config")
    return value


def from_hf_config(config: Mapping[str, Any]) -> Architecture:
    """An `Architecture` from a transformers ``config.json`` mapping (or its ``text_config``).

    Raises:
        ValueError: naming the first missing key.
    """
    if "hidden_size" not in config and isinstance(config.get("text_config"), Mapping):
        config = config["text_config"]
    heads = int(_get(config, "num_attention_heads"))
    hidden = int(_get(config, "hidden_size"))
    model_type = str(config.get("model_type", ""))
    return Architecture(
        vocab_size=int(_get(config, "vocab_size")),
        hidden_size=hidden,
        num_layers=int(_get(config, "num_hidden_layers")),
        num_heads=heads,
        num_kv_heads=int(config.get("num_key_value_heads") or heads),
        head_dim=int(config.get("head_dim") or hidden // heads),
        intermediate_size=int(_get(config, "intermediate_size")),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        attention_bias=model_type == "qwen2" or bool(config.get("attention_bias", False)),
        qk_norm=model_type.startswith("qwen3"),
        max_position_embeddings=config.get("max_position_embeddings"),
    )


def _qwen2(v: int, h: int, layers: int, heads: int, kv: int, inter: int, tied: bool, ctx: int) -> Architecture:
    dim = h // heads
    return Architecture(v, h, layers, heads, kv, dim, inter, tied, attention_bias=True, max_position_embeddings=ctx)


def _qwen3(h: int, layers: int, heads: int, kv: int, inter: int, tied: bool) -> Architecture:
    return Architecture(151936, h, layers, heads, kv, 128, inter, tied, qk_norm=True, max_position_embeddings=40960)


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
}


@dataclass(frozen=True, slots=True)
class TrainerSettings:
    """One Training Unit rank. ``compute_bytes``: 2 under bf16 mixed precision or autocast, else 4."""

    world_size: int = 1
    mixed_precision: bool = False  # FSDP2 MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)
    compute_bytes: int = 4
    activation_checkpointing: bool = False
    cpu_offload: bool = False
    micro_batch_tokens: int = 4096
    longest_row_tokens: int = 0  # a row longer than micro_batch_tokens gets a micro-batch of its own
    reference: bool = False  # kl_coef > 0
    autocast: bool = False  # autocast_dtype set: the (plain) reference model computes in 16 bits too
    device_gib: float = 80.0
    reserve_gib: float = 3.0

    @property
    def tokens(self) -> int:
        return max(self.micro_batch_tokens, self.longest_row_tokens)


@dataclass(frozen=True, slots=True)
class MemoryEstimate:
    """Bytes per component on one device and in its host's memory."""

    device: dict[str, int]
    host: dict[str, int] = field(default_factory=dict)
    capacity: int = 0

    @property
    def device_total(self) -> int:
        return sum(self.device.values())

    @property
    def host_total(self) -> int:
        return sum(self.host.values())

    @property
    def fits(self) -> bool:
        return self.device_total <= self.capacity


def activation_bytes_per_token_layer(arch: Architecture, b: int) -> int:
    """A in the module docstring: bytes one decoder layer keeps per token for backward."""
    h = arch.hidden_size
    return b * (5 * h + 3 * arch.q_dim + 4 * arch.kv_dim + 4 * arch.intermediate_size) + 8 * h


def activation_bytes(arch: Architecture, s: TrainerSettings) -> int:
    b, h, layers = s.compute_bytes, arch.hidden_size, arch.num_layers
    a = activation_bytes_per_token_layer(arch, b)
    per_token = layers * b * h + a if s.activation_checkpointing else layers * a + 2 * b * h
    return s.tokens * per_token


def trainer_memory(arch: Architecture, s: TrainerSettings) -> MemoryEstimate:
    """Per-rank memory of the GRPO Training Unit (components in the module docstring)."""
    p, n = arch.num_params, s.world_size
    shard = math.ceil(p / n)
    gathered_b = 2 if s.mixed_precision else 4
    sharded = n > 1 or s.mixed_precision or s.cpu_offload  # GRPOSpec.needs_process_group: FSDP2
    states = {"parameters": 4 * shard, "gradients": 4 * shard, "optimizer": 8 * shard}
    device = {} if s.cpu_offload else dict(states)
    device["gathered"] = gathered_b * (2 * arch.root_params + 3 * arch.layer_params) if sharded else 0
    device["activations"] = activation_bytes(arch, s)
    ref_logits = (2 if s.autocast else 4) if s.reference else 0
    device["logits"] = s.tokens * arch.vocab_size * (s.compute_bytes + 12 + ref_logits)
    host = dict(states) if s.cpu_offload else {}
    if s.reference:
        device["reference"] = 4 * p
    device["reserve"] = int(s.reserve_gib * GIB)
    return MemoryEstimate(device, host, int(s.device_gib * GIB))


@dataclass(frozen=True, slots=True)
class GenerationSettings:
    """One vLLM instance: ``dtype_bytes`` of the weights and KV cache, ``max_seq_len`` its max_model_len."""

    dtype_bytes: int = 2
    tensor_parallel_size: int = 1
    gpu_memory_utilization: float = 0.85
    max_seq_len: int = 4096
    device_gib: float = 80.0


@dataclass(frozen=True, slots=True)
class GenerationEstimate:
    weights: int
    allowance: int
    budget: int
    kv_bytes_per_token: int
    max_seq_len: int

    @property
    def kv_cache(self) -> int:
        return self.budget - self.weights - self.allowance

    @property
    def sequences(self) -> int:
        """Max-length sequences the KV cache holds (0 when the weights leave nothing)."""
        return max(0, self.kv_cache // (self.kv_bytes_per_token * self.max_seq_len))

    @property
    def fits(self) -> bool:
        return self.sequences >= 1


def generation_memory(arch: Architecture, s: GenerationSettings) -> GenerationEstimate:
    """Per-GPU memory of one vLLM instance (formulas in the module docstring)."""
    t, d = s.tensor_parallel_size, s.dtype_bytes
    weights = math.ceil(arch.num_params * d / t)
    kv = 2 * arch.num_layers * math.ceil(arch.num_kv_heads / t) * arch.head_dim * d
    act = PROFILE_TOKENS * (4 * arch.hidden_size + 3 * arch.intermediate_size // t) * d
    allowance = GRAPH_ALLOWANCE + act + SAMPLER_SEQS * arch.vocab_size * 4
    budget = int(s.gpu_memory_utilization * s.device_gib * GIB)
    return GenerationEstimate(weights, allowance, budget, kv, s.max_seq_len)


def gib(n: float) -> str:
    """Bytes as GiB: one decimal, or two significant digits below 0.1 GiB (the tiny demo policy)."""
    v = n / GIB
    return f"{v:.1f}" if v >= 0.1 or v == 0 else f"{v:.2g}"


def _breakdown(est: MemoryEstimate) -> str:
    return ", ".join(f"{k} {gib(v)}" for k, v in est.device.items() if v)


def _first_fit(arch: Architecture, s: TrainerSettings, values: range, key: str) -> tuple[int, int] | None:
    """The first value of `key` in `values` whose estimate fits, with its device total."""
    for v in values:
        est = trainer_memory(arch, replace(s, **{key: v}))
        if est.fits:
            return v, est.device_total
    return None


def _largest_micro_batch(arch: Architecture, s: TrainerSettings) -> tuple[int, int] | None:
    """The largest micro_batch_tokens (a multiple of 256 at or above the longest row) that fits."""
    lo, hi = max(256, s.longest_row_tokens), s.micro_batch_tokens - 1
    if hi < lo or not trainer_memory(arch, replace(s, micro_batch_tokens=lo)).fits:
        return None
    while lo < hi:  # fits(lo) holds; find the largest fitting value in [lo, hi]
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if trainer_memory(arch, replace(s, micro_batch_tokens=mid)).fits else (lo, mid - 1)
    m = max(lo // 256 * 256, max(256, s.longest_row_tokens))
    return m, trainer_memory(arch, replace(s, micro_batch_tokens=m)).device_total


def trainer_suggestions(arch: Architecture, s: TrainerSettings, max_world_size: int = MAX_WORLD_SIZE) -> list[str]:
    """Single changes that make the trainer fit, each checked with the estimator (empty when none does)."""
    out = []
    ws = _first_fit(arch, s, range(s.world_size + 1, max_world_size + 1), "world_size")
    if ws:
        out.append(f"raise runtime.grpo.world_size to {ws[0]} ({gib(ws[1])} GiB)")
    flags = (
        ("activation_checkpointing", "activation_checkpointing: true", True),
        ("mixed_precision", "mixed_precision: bfloat16", True),
        ("cpu_offload", "cpu_offload: true", True),
    )
    for key, text, value in flags:
        if not getattr(s, key):
            changed = replace(s, **{key: value}, **({"compute_bytes": 2} if key == "mixed_precision" else {}))
            est = trainer_memory(arch, changed)
            if est.fits:
                out.append(f"set runtime.grpo.{text} ({gib(est.device_total)} GiB)")
    mb = _largest_micro_batch(arch, s)
    if mb:
        out.append(f"lower runtime.grpo.micro_batch_tokens to {mb[0]} ({gib(mb[1])} GiB)")
    return out


def _combined(arch: Architecture, s: TrainerSettings, max_world_size: int) -> str:
    """Bf16 mixed precision + activation checkpointing with the smallest world_size at which a micro-batch of
    min(micro_batch_tokens, max(longest row, 8192)) tokens fits, or why nothing does."""
    tokens = min(s.micro_batch_tokens, max(s.longest_row_tokens, 8192))
    both = replace(s, mixed_precision=True, compute_bytes=2, activation_checkpointing=True, micro_batch_tokens=tokens)
    ws = _first_fit(arch, both, range(s.world_size, max_world_size + 1), "world_size")
    if ws:
        mb = f" and micro_batch_tokens {tokens}" if tokens != s.micro_batch_tokens else ""
        return (
            "no single change fits; together: mixed_precision bfloat16, activation_checkpointing true, "
            f"world_size {ws[0]}{mb} ({gib(ws[1])} GiB)"
        )
    most = trainer_memory(arch, replace(both, world_size=max_world_size, cpu_offload=True))
    return (
        f"even with world_size {max_world_size}, bfloat16, activation checkpointing and cpu_offload it needs "
        f"{gib(most.device_total)} GiB (logits {gib(most.device['logits'])}, activations "
        f"{gib(most.device['activations'])}): lower the longest row (max_new_tokens, max_model_len) or use larger "
        "devices"
    )


def generation_suggestions(arch: Architecture, s: GenerationSettings) -> list[str]:
    """Changes that make one vLLM instance hold a max-length sequence, each checked with the estimator."""
    out = []
    for t in (2, 4, 8):
        bigger = t > s.tensor_parallel_size and arch.num_heads % t == 0
        if bigger and generation_memory(arch, replace(s, tensor_parallel_size=t)).fits:
            out.append(f"set runtime.engine.vllm.tensor_parallel_size to {t} (and runtime.actor_num_gpus {t})")
            break
    est = generation_memory(arch, s)
    need = est.weights + est.allowance + est.kv_bytes_per_token * s.max_seq_len
    util = math.ceil(need / (s.device_gib * GIB) * 100) / 100
    if s.gpu_memory_utilization < util <= 0.95:
        out.append(f"raise runtime.engine.vllm.gpu_memory_utilization to {util:.2f}")
    longest = est.kv_cache // est.kv_bytes_per_token if est.kv_cache > 0 else 0
    if longest >= 16:
        out.append(f"lower runtime.engine.vllm.max_model_len to {longest} or less")
    return out


def trainer_problem(arch: Architecture, s: TrainerSettings, max_world_size: int = MAX_WORLD_SIZE) -> str | None:
    est = trainer_memory(arch, s)
    if est.fits:
        return None
    fixes = trainer_suggestions(arch, s, max_world_size) or [_combined(arch, s, max_world_size)]
    return (
        f"trainer device: needs {gib(est.device_total)} GiB of {gib(est.capacity)} GiB per rank "
        f"(world_size {s.world_size}, {s.tokens} tokens per micro-batch; {_breakdown(est)}). "
        f"To fit: {'; or '.join(fixes)}."
    )


def generation_problem(arch: Architecture, s: GenerationSettings) -> str | None:
    est = generation_memory(arch, s)
    if est.fits:
        return None
    fixes = generation_suggestions(arch, s) or ["use a larger device or a smaller policy"]
    kv_need = est.kv_bytes_per_token * s.max_seq_len
    return (
        f"generation device: vLLM (tensor_parallel_size {s.tensor_parallel_size}) has "
        f"{gib(est.budget)} GiB (gpu_memory_utilization {s.gpu_memory_utilization} x {s.device_gib:g} GiB); "
        f"weights {gib(est.weights)} + allowance {gib(est.allowance)} leave {gib(max(est.kv_cache, 0))} GiB of KV "
        f"cache, less than one {s.max_seq_len}-token sequence ({gib(kv_need)} GiB). To fit: {'; or '.join(fixes)}."
    )


def check_fit(
    arch: Architecture,
    trainer: TrainerSettings | None = None,
    generation: GenerationSettings | None = None,
    max_world_size: int = MAX_WORLD_SIZE,
) -> list[str]:
    """Problems (empty when everything fits), each with the numbers and what to change."""
    problems = [trainer_problem(arch, trainer, max_world_size) if trainer else None]
    problems.append(generation_problem(arch, generation) if generation else None)
    return [p for p in problems if p]
