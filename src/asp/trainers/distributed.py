"""Several ranks for the GRPO Training Unit: FSDP2 sharding, the data-parallel split of micro-batches, reductions.

The `TrainingUnit` actors (`asp.runtime.trainer`) start one torch.distributed process group before the trainer is
built; `GRPOTrainer` then asks `is_distributed()` and, when it is, shards its policy with `shard_model`
(FSDP2 `fully_shard` on each decoder layer, then on the root; optional bf16 `MixedPrecisionPolicy` and
`CPUOffloadPolicy`). Each rank trains its share of the global batch's micro-batches (`split_micro_batches`,
padded with dummy passes so every rank runs the same number of forward/backward passes). Each rank's loss is its
part of the global-batch loss times the world size, because FSDP averages gradients over ranks in its
reduce-scatter: the update equals the 1-rank update of the same global batch. (FSDP's `set_gradient_divide_factor`
(1.0) would say the same without the scaling, but it reduces with ``PREMUL_SUM``, which gloo lacks.)
Without a process group (world size 1) none of this runs and the model stays a plain module.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

import torch

from asp.config import GRPOParams

T = TypeVar("T")


def is_distributed() -> bool:
    """True inside a rank of a started torch.distributed process group."""
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def rank_and_world() -> tuple[int, int]:
    """(rank, world size) of this process; (0, 1) without a process group."""
    if not is_distributed():
        return 0, 1
    return torch.distributed.get_rank(), torch.distributed.get_world_size()


def resolve_backend(backend: str, device: str) -> str:
    """``auto`` -> ``nccl`` on a CUDA device, ``gloo`` otherwise; ``gloo`` / ``nccl`` unchanged."""
    if backend != "auto":
        return backend
    return "nccl" if torch.device(device).type == "cuda" else "gloo"


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The transformer blocks of a Hugging Face causal LM (``model.model.layers`` for Llama / Qwen / Mistral)."""
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__} has no model.layers: cannot find its decoder layers to shard")
    return list(layers)


def tied_duplicates(model: torch.nn.Module) -> set[str]:
    """State-dict names whose storage an earlier name already holds (tied weights; e.g. ``lm_head.weight``).

    Call it before sharding (a sharded model's storages differ); `cpu_snapshot` drops the same names, so both
    exports carry tied weights once.
    """
    seen: set[int] = set()
    out: set[str] = set()
    for name, tensor in model.state_dict().items():
        ptr = tensor.untyped_storage().data_ptr()
        if ptr in seen:
            out.add(name)
        seen.add(ptr)
    return out


def checkpoint_layers(model: torch.nn.Module) -> int:
    """Recompute each decoder layer's activations in backward (non-reentrant `torch.utils.checkpoint`).

    The layer's own ``forward`` is wrapped (the module tree and parameter names stay as they are), so FSDP2's
    hooks around the layer's call still gather the parameters for the forward and again for the recomputation.

    Returns:
        The number of layers wrapped.
    """
    from torch.utils.checkpoint import checkpoint

    layers = decoder_layers(model)
    for layer in layers:
        inner = layer.forward

        def forward(*args: Any, _inner: Any = inner, **kwargs: Any) -> Any:
            return checkpoint(_inner, *args, use_reentrant=False, **kwargs)

        layer.forward = forward
    return len(layers)


def shard_model(model: torch.nn.Module, cfg: GRPOParams, device: torch.device) -> None:
    """FSDP2-shard `model` over every rank: `fully_shard` on each decoder layer, then on the root module.

    Args:
        model: the policy, fp32, on the CPU (``cpu_offload``) or on `device`.
        cfg: ``mixed_precision`` (``bfloat16``: bf16 parameters in compute, fp32 gradient reduction and master
            weights) and ``cpu_offload`` (sharded parameters, gradients and optimizer state in host memory).
        device: the compute device; its type names the device mesh.
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    mesh = init_device_mesh(device.type, (torch.distributed.get_world_size(),))
    options: dict[str, Any] = {"mesh": mesh}
    if cfg.mixed_precision == "bfloat16":
        options["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    options["offload_policy"] = CPUOffloadPolicy() if cfg.cpu_offload else OffloadPolicy()
    for module in [*decoder_layers(model), model]:
        fully_shard(module, **options)


def split_micro_batches(plans: Sequence[T], rank: int, world: int) -> list[T | None]:
    """This rank's micro-batches (every `world`-th, from `rank`), padded with None to the same count on every rank.

    `plans` are sorted by length (`plan_micro_batches`), so round-robin gives each rank a similar token load.
    None stands for a dummy pass (zero loss): FSDP's collectives need the same number of passes on every rank.
    """
    mine: list[T | None] = list(plans[rank::world])
    passes = -(-len(plans) // world)
    return mine + [None] * (passes - len(mine))


def all_reduce(values: list[float], device: torch.device, op: str = "sum") -> list[float]:
    """Sum (or max) `values` over every rank; unchanged without a process group."""
    if not is_distributed():
        return values
    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    reduce_op = torch.distributed.ReduceOp.MAX if op == "max" else torch.distributed.ReduceOp.SUM
    torch.distributed.all_reduce(tensor, op=reduce_op)
    return tensor.tolist()


def full_state(model: torch.nn.Module, drop: set[str]) -> dict[str, torch.Tensor] | None:
    """The whole model's weights gathered on rank 0 (CPU, `drop` names left out); None on the other ranks.

    Every rank must call it (the shards are all-gathered).
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    state = get_model_state_dict(model, options=options)
    if torch.distributed.get_rank() != 0:
        return None
    return {name: t.detach().contiguous() for name, t in state.items() if name not in drop}


def grad_norm_value(norm: torch.Tensor) -> float:
    """`clip_grad_norm_`'s result as a float (a DTensor over the ranks' shards is made whole first)."""
    full = getattr(norm, "full_tensor", None)
    return float(full() if full is not None else norm)
