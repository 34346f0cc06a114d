"""Fits-or-fails memory estimate of a GRPO run: per trainer device (FSDP2 rank) and per vLLM generation device.

Pure arithmetic over an `Architecture` (a Llama/Qwen-style decoder, dense or mixture-of-experts; its parameter
count is in `asp.sim.architecture`) and settings dataclasses; no I/O. The glue that turns params into these inputs is
`asp.steps.memory_check`; the CLI is ``asp plan memory`` and ``asp params check``; the formulas are written out in
docs/memory.md. Sizes are bytes; ``GIB = 2**30``. P below is every parameter, all experts of an MoE included.

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
  (4I); plus the two RMSNorm inputs upcast to fp32 (8h bytes). A sparse (MoE) layer keeps, instead of 4I, what
  its k active experts keep (transformers' grouped_mm experts, its default): per routed copy of the token its
  gathered input, the gate/up output, silu(gate), their product and the expert's output (``k (2h + 4 I_e)``), a
  shared expert's ``4 I_s + h`` and its gate's output, plus ``4E + 40k`` bytes of routing (fp32 router
  probabilities, int64 top-k indices, sort permutation and inverse, the routing weights):
  ``A_s = b (5h + 3q + 4kv + k (2h + 4 I_e) + [4 I_s + h + 1]) + 8h + 4E + 40k``. Without activation
  checkpointing: ``T (sum over layers of A + 2 b h)``; with it (one checkpoint per decoder layer):
  ``T (L b h + max A)`` (the saved layer inputs plus one layer recomputed in backward);
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
device`` (with ``kv_cache_gib`` set: weights + allowance + that KV cache, which must fit the device); allowance
``1 GiB`` (CUDA graphs, non-torch memory) + the profile run's activations ``8192 tokens x (4h + M) d`` with
M = 3 I / t for a dense MLP and ``k (3 I_e / t + h) + 3 I_s / t`` for an MoE
block (vLLM's fused-MoE workspaces: each token's k gate/up, activation and output rows; the larger when a model
has both) + sampler logits ``256 sequences x V x 4``; sequences that fit =
``(budget - weights - allowance) / (KV per token x sequence length)``. vLLM refuses to start below one.

An MoE loads, stores, differentiates and optimizes every expert (weights, gradients, AdamW state, FSDP2's gathered
layers and vLLM's weights count all E experts); only the activations follow the k experts a token is routed to.

Run the unit tests with ``.venv/bin/python -m pytest tests/sim/test_memory.py tests/sim/test_memory_moe.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from asp.sim.architecture import BUILTIN, Architecture, from_hf_config  # noqa: F401 (re-exported)

GIB = 2**30
GRAPH_ALLOWANCE = GIB  # vLLM CUDA graphs and non-torch memory, per GPU
PROFILE_TOKENS = 8192  # vLLM max_num_batched_tokens of the profile run
SAMPLER_SEQS = 256  # vLLM max_num_seqs: fp32 logits of one sampling step
MAX_WORLD_SIZE = 64
# Defaults that asp.config takes from here (one literal each): runtime.grpo.micro_batch_tokens,
# runtime.memory.device_gib / reserve_gib, and the vLLM share of a GPU (EngineParams.vllm, VLLMOptions)
MICRO_BATCH_TOKENS = 4096
DEVICE_GIB = 80.0
RESERVE_GIB = 3.0
GPU_MEMORY_UTILIZATION = 0.85


@dataclass(frozen=True, slots=True)
class TrainerSettings:
    """One Training Unit rank. ``compute_bytes``: 2 under bf16 mixed precision or autocast, else 4. The settings
    `runtime.grpo` declares (world_size, activation_checkpointing, cpu_offload) have no default here."""

    world_size: int
    activation_checkpointing: bool
    cpu_offload: bool
    mixed_precision: bool = False  # FSDP2 MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)
    compute_bytes: int = 4
    micro_batch_tokens: int = MICRO_BATCH_TOKENS
    longest_row_tokens: int = 0  # a row longer than micro_batch_tokens gets a micro-batch of its own
    reference: bool = False  # kl_coef > 0
    autocast: bool = False  # autocast_dtype set: the (plain) reference model computes in 16 bits too
    device_gib: float = DEVICE_GIB
    reserve_gib: float = RESERVE_GIB

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


def moe_activation_bytes_per_token(arch: Architecture, b: int) -> int:
    """Bytes one sparse layer's MoE block keeps per token for backward, besides its input (the norm output):
    ``b (k (2h + 4 I_e) + [4 I_s + h + 1]) + 4E + 40k`` (module docstring; tests/sim/test_memory_moe.py measures
    it with autograd's saved-tensor hooks on transformers' MoE blocks)."""
    h, k = arch.hidden_size, arch.experts_per_token
    experts = k * (2 * h + 4 * arch.expert_intermediate_size)
    shared = 4 * arch.shared_expert_intermediate_size + h + 1 if arch.shared_expert_intermediate_size else 0
    return b * (experts + shared) + 4 * arch.num_experts + 40 * k


def activation_bytes_per_token_layer(arch: Architecture, b: int, sparse: bool = False) -> int:
    """A (dense layer) or A_s (``sparse``: an MoE layer) in the module docstring: bytes one decoder layer keeps per
    token for backward."""
    h = arch.hidden_size
    common = b * (5 * h + 3 * arch.q_dim + 4 * arch.kv_dim) + 8 * h
    return common + (moe_activation_bytes_per_token(arch, b) if sparse else b * 4 * arch.intermediate_size)


def activation_bytes(arch: Architecture, s: TrainerSettings) -> int:
    b, h, layers = s.compute_bytes, arch.hidden_size, arch.num_layers
    dense = activation_bytes_per_token_layer(arch, b) if arch.dense_layers else 0
    sparse = activation_bytes_per_token_layer(arch, b, sparse=True) if arch.sparse_layers else 0
    if s.activation_checkpointing:
        per_token = layers * b * h + max(dense, sparse)
    else:
        per_token = arch.dense_layers * dense + arch.sparse_layers * sparse + 2 * b * h
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
    """One vLLM instance: ``dtype_bytes`` of the weights and KV cache, ``max_seq_len`` its max_model_len;
    ``tensor_parallel_size`` has no default (the engine's vLLM params declare it)."""

    tensor_parallel_size: int
    dtype_bytes: int = 2
    gpu_memory_utilization: float = GPU_MEMORY_UTILIZATION
    max_seq_len: int = 4096
    device_gib: float = DEVICE_GIB
    kv_cache_gib: float | None = None  # vLLM's kv_cache_memory_bytes: a KV cache of this size, not a share


@dataclass(frozen=True, slots=True)
class GenerationEstimate:
    weights: int
    allowance: int
    budget: int
    kv_bytes_per_token: int
    max_seq_len: int
    capacity: int  # the device's bytes

    @property
    def kv_cache(self) -> int:
        return self.budget - self.weights - self.allowance

    @property
    def sequences(self) -> int:
        """Max-length sequences the KV cache holds (0 when the weights leave nothing)."""
        return max(0, self.kv_cache // (self.kv_bytes_per_token * self.max_seq_len))

    @property
    def fits(self) -> bool:
        return self.sequences >= 1 and self.budget <= self.capacity


def _vllm_mlp_width(arch: Architecture, t: int) -> int:
    """Per-token MLP activations of vLLM's profile run, in elements (module docstring): the larger layer kind's."""
    dense = 3 * arch.intermediate_size // t if arch.dense_layers else 0
    if not arch.sparse_layers:
        return dense
    k, h = arch.experts_per_token, arch.hidden_size
    sparse = k * (3 * arch.expert_intermediate_size // t + h) + 3 * arch.shared_expert_intermediate_size // t
    return max(dense, sparse)


def generation_memory(arch: Architecture, s: GenerationSettings) -> GenerationEstimate:
    """Per-GPU memory of one vLLM instance (formulas in the module docstring)."""
    t, d = s.tensor_parallel_size, s.dtype_bytes
    weights = math.ceil(arch.num_params * d / t)
    kv = 2 * arch.num_layers * math.ceil(arch.num_kv_heads / t) * arch.head_dim * d
    act = PROFILE_TOKENS * (4 * arch.hidden_size + _vllm_mlp_width(arch, t)) * d
    allowance = GRAPH_ALLOWANCE + act + SAMPLER_SEQS * arch.vocab_size * 4
    capacity = int(s.device_gib * GIB)
    if s.kv_cache_gib is None:
        budget = int(s.gpu_memory_utilization * capacity)
    else:  # vLLM sizes the KV cache as asked and takes weights and activations besides
        budget = weights + allowance + int(s.kv_cache_gib * GIB)
    return GenerationEstimate(weights, allowance, budget, kv, s.max_seq_len, capacity)


def gib(n: float) -> str:
    """Bytes as GiB: one decimal, or two significant digits below 0.1 GiB (the tiny demo policy)."""
    v = n / GIB
    return f"{v:.1f}" if v >= 0.1 or v == 0 else f"{v:.2g}"


def _breakdown(est: MemoryEstimate) -> str:
    return ", ".join(f"{k} {gib(v)}" for k, v in est.device.items() if v)


def _first_fit(arch: Architecture, s: TrainerSettings, values: range, key: str) -> tuple[int, int] | None:
    """The first value of `key` in `values` whose estimate fits, with its device total."""
    for v in values:
        change: dict[str, Any] = {key: v}
        est = trainer_memory(arch, replace(s, **change))
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
            change: dict[str, Any] = {key: value, **({"compute_bytes": 2} if key == "mixed_precision" else {})}
            changed = replace(s, **change)
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
            out.append(f"set runtime.engine.vllm.tensor_parallel_size to {t} (and runtime.ray.actor_num_gpus {t})")
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
    if s.kv_cache_gib is not None:
        return _kv_cache_problem(est, s)
    fixes = generation_suggestions(arch, s) or ["use a larger device or a smaller policy"]
    kv_need = est.kv_bytes_per_token * s.max_seq_len
    return (
        f"generation device: vLLM (tensor_parallel_size {s.tensor_parallel_size}) has "
        f"{gib(est.budget)} GiB (gpu_memory_utilization {s.gpu_memory_utilization} x {s.device_gib:g} GiB); "
        f"weights {gib(est.weights)} + allowance {gib(est.allowance)} leave {gib(max(est.kv_cache, 0))} GiB of KV "
        f"cache, less than one {s.max_seq_len}-token sequence ({gib(kv_need)} GiB). To fit: {'; or '.join(fixes)}."
    )


def _kv_cache_problem(est: GenerationEstimate, s: GenerationSettings) -> str:
    """A KV cache set in GiB (kv_cache_gib) that, with the weights, exceeds the device or holds no sequence."""
    kv_need = est.kv_bytes_per_token * s.max_seq_len
    room = est.capacity - est.weights - est.allowance
    if est.budget > est.capacity:
        what = f"needs {gib(est.budget)} GiB of the device's {gib(est.capacity)} GiB"
        fix = f"lower kv_cache_gib to {gib(room)} GiB or less" if room >= kv_need else "use a larger device"
    else:
        what = f"holds less than one {s.max_seq_len}-token sequence ({gib(kv_need)} GiB)"
        fix = f"raise kv_cache_gib to {gib(kv_need)} GiB or more, or lower max_model_len"
    return (
        f"generation device: vLLM (tensor_parallel_size {s.tensor_parallel_size}) with a KV cache of "
        f"{s.kv_cache_gib:g} GiB (kv_cache_gib) + weights {gib(est.weights)} GiB + allowance {gib(est.allowance)} GiB "
        f"{what}. To fit: {fix}."
    )
