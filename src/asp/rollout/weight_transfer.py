"""Weight snapshots into a running engine in bounded buckets: the plan (pure) and the packing (torch).

A snapshot (name -> tensor, Hugging Face names, CPU tensors as `asp.runtime.generation.resolve_weights` gives
them) is cut into buckets of at most ``bucket_bytes`` (a tensor larger than that travels alone), each bucket one
flat ``uint8`` buffer holding its tensors at aligned byte offsets. Only the buffer and a small description of it
(`TensorMeta` rows: name, dtype, shape, byte offset, byte size) cross process boundaries; the receiver takes
views of the buffer (`unpack_bucket`, no copy) and hands them to the model's ``load_weights`` one bucket at a
time, so the memory a reload needs besides the model is one bucket, whatever the model's size.

Pure parts (no torch): `plan_buckets` (which tensors go in which bucket, where), `plan_transfer` (which
transport a setting gets), `meta_rows` / `metas_from_rows` (the description as plain lists, which every RPC
serialiser carries). Torch parts: `tensor_metas`, `pack_bucket`, `unpack_bucket`, and for CUDA IPC `share_buffer`
/ `open_shared` (torch's ``reduce_tensor`` handle of a staging buffer, reopened on the receiver's own device).
`asp.rollout.vllm` uses them for vLLM's worker extension; tests/rollout/test_weight_transfer.py checks on CPU,
with a real torch model standing in for vLLM's, that loading bucket by bucket gives the same weights as
``load_state_dict``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    import torch

WEIGHT_TRANSFERS = ("auto", "ipc", "rpc")
DEFAULT_WEIGHT_TRANSFER: Final = "auto"  # Final: read as Literal["auto"] where a Literal is expected
DEFAULT_BUCKET_MB = 512  # 512 MiB: 32 buckets for an 8B model in bf16; < 1 % of an 80 GB GPU for staging
ALIGN_BYTES = 256  # every tensor starts at a multiple of this (any dtype's view is aligned; CUDA likes 256)
MIB = 1 << 20


@dataclass(frozen=True, slots=True)
class TensorMeta:
    """One tensor of a bucket.

    Attributes:
        name: Hugging Face parameter name (what the model's ``load_weights`` expects).
        dtype: torch dtype name without ``torch.`` (``"bfloat16"``).
        shape: tensor shape.
        nbytes: bytes of its data.
        offset: byte offset inside its bucket's buffer (a multiple of `ALIGN_BYTES`).
    """

    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    offset: int = 0


@dataclass(frozen=True, slots=True)
class Bucket:
    """Tensors sent together in one buffer of `nbytes` bytes (the end of the last tensor)."""

    tensors: tuple[TensorMeta, ...]
    nbytes: int


def _aligned(n: int, align: int) -> int:
    return -(-n // align) * align


def plan_buckets(metas: Iterable[TensorMeta], bucket_bytes: int, align: int = ALIGN_BYTES) -> list[Bucket]:
    """Cut `metas` (in order) into buckets of at most `bucket_bytes` bytes, offsets aligned to `align`.

    A tensor larger than `bucket_bytes` gets a bucket of its own (the budget bounds every other bucket).

    Args:
        metas: the tensors, in the order they are to be loaded (their ``offset`` is ignored).
        bucket_bytes: byte budget of one bucket, >= 1.
        align: byte alignment of each tensor's offset, >= 1.

    Returns:
        Buckets whose `TensorMeta.offset` fields are set; every tensor appears exactly once, in order.

    Raises:
        ValueError: for a budget or alignment < 1, a negative size or a name seen twice.
    """
    if bucket_bytes < 1 or align < 1:
        raise ValueError(f"bucket_bytes and align must be >= 1, got {bucket_bytes} and {align}")
    buckets: list[Bucket] = []
    current: list[TensorMeta] = []
    end, seen = 0, set()
    for meta in metas:
        if meta.nbytes < 0:
            raise ValueError(f"tensor {meta.name!r} has a negative size {meta.nbytes}")
        if meta.name in seen:
            raise ValueError(f"tensor {meta.name!r} appears twice in the snapshot")
        seen.add(meta.name)
        start = _aligned(end, align)
        if current and start + meta.nbytes > bucket_bytes:
            buckets.append(Bucket(tuple(current), end))
            current, start = [], 0
        current.append(TensorMeta(meta.name, meta.dtype, tuple(meta.shape), meta.nbytes, start))
        end = start + meta.nbytes
    if current:
        buckets.append(Bucket(tuple(current), end))
    return buckets


def plan_transfer(setting: str, *, cuda: bool) -> str:
    """The transport a `setting` gets: ``"ipc"`` (CUDA IPC staging buffers) or ``"rpc"`` (tensors through RPC).

    ``auto`` is ``ipc`` wherever the engine's process has CUDA (always, for a real vLLM engine), else ``rpc``.

    Raises:
        ValueError: an unknown setting, or ``ipc`` without CUDA.
    """
    if setting not in WEIGHT_TRANSFERS:
        raise ValueError(f"weight_transfer must be one of {WEIGHT_TRANSFERS}, got {setting!r}")
    if setting == "ipc" and not cuda:
        raise ValueError("weight_transfer 'ipc' needs CUDA in the engine's process; use 'auto' or 'rpc'")
    if setting == "auto":
        return "ipc" if cuda else "rpc"
    return setting


def meta_rows(bucket: Bucket) -> list[list[Any]]:
    """The bucket's description as plain lists ``[name, dtype, shape, nbytes, offset]`` (for any RPC serialiser)."""
    return [[m.name, m.dtype, list(m.shape), m.nbytes, m.offset] for m in bucket.tensors]


def metas_from_rows(rows: Sequence[Sequence[Any]]) -> Bucket:
    """Inverse of `meta_rows`."""
    metas = tuple(
        TensorMeta(str(n), str(d), tuple(int(s) for s in shape), int(b), int(o)) for n, d, shape, b, o in rows
    )
    return Bucket(metas, max((m.offset + m.nbytes for m in metas), default=0))


# ---- torch ---------------------------------------------------------------------------------------------
def torch_dtype(name: str) -> torch.dtype:
    """``"bfloat16"`` -> ``torch.bfloat16``; ValueError for anything that is not a torch dtype."""
    import torch

    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"{name!r} is not a torch dtype")
    return dtype


def tensor_metas(state: Mapping[str, torch.Tensor]) -> list[TensorMeta]:
    """`TensorMeta` (offset 0) of every tensor of `state`, in its order."""
    return [
        TensorMeta(name, str(t.dtype).removeprefix("torch."), tuple(t.shape), t.numel() * t.element_size())
        for name, t in state.items()
    ]


def _as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """A flat ``uint8`` view of a tensor's data (contiguous copy first if needed)."""
    import torch

    return tensor.detach().contiguous().reshape(-1).view(torch.uint8)


def pack_bucket(state: Mapping[str, torch.Tensor], bucket: Bucket, out: torch.Tensor) -> torch.Tensor:
    """Copy the bucket's tensors from `state` into `out` (a flat ``uint8`` tensor of >= ``bucket.nbytes``).

    `out` may live on another device than the tensors (e.g. a CUDA staging buffer filled from CPU tensors).

    Returns:
        ``out[: bucket.nbytes]``.

    Raises:
        ValueError: `out` too small, or a tensor whose dtype / shape differs from the bucket's description.
    """
    if out.numel() < bucket.nbytes:
        raise ValueError(f"buffer of {out.numel()} bytes is smaller than the bucket ({bucket.nbytes} bytes)")
    for meta in bucket.tensors:
        tensor = state[meta.name]
        if str(tensor.dtype).removeprefix("torch.") != meta.dtype or tuple(tensor.shape) != meta.shape:
            raise ValueError(f"{meta.name}: {tensor.dtype} {tuple(tensor.shape)} does not match {meta}")
        if meta.nbytes:
            out[meta.offset : meta.offset + meta.nbytes].copy_(_as_bytes(tensor), non_blocking=True)
    return out[: bucket.nbytes]


def unpack_bucket(buffer: torch.Tensor, bucket: Bucket) -> list[tuple[str, torch.Tensor]]:
    """(name, tensor) views into a packed `buffer` (no copy), in the bucket's order."""
    if buffer.numel() < bucket.nbytes:
        raise ValueError(f"buffer of {buffer.numel()} bytes is smaller than the bucket ({bucket.nbytes} bytes)")
    out = []
    for meta in bucket.tensors:
        raw = buffer[meta.offset : meta.offset + meta.nbytes]
        out.append((meta.name, raw.view(torch_dtype(meta.dtype)).reshape(meta.shape)))
    return out


# ---- CUDA IPC ------------------------------------------------------------------------------------------
def share_buffer(buffer: torch.Tensor) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """torch's inter-process handle of `buffer`: ``(rebuild function, arguments)``, picklable.

    For a CUDA tensor this is a CUDA IPC memory handle (the receiver maps the same device memory, no copy); the
    sender must keep `buffer` alive until the receiver has finished with it.
    """
    from torch.multiprocessing.reductions import reduce_tensor

    return reduce_tensor(buffer)


def open_shared(handle: tuple[Callable[..., Any], tuple[Any, ...]], device_index: int | None = None) -> torch.Tensor:
    """Rebuild the tensor of a `share_buffer` handle; a CUDA handle is opened on `device_index`.

    The sender's device index can differ from the receiver's for the same GPU (each process numbers the devices it
    sees), so the receiver passes its own index for the GPU the handle was made on.
    """
    func, args = handle
    if device_index is not None:
        names = list(inspect.signature(func).parameters)
        if "storage_device" in names:  # torch's rebuild_cuda_tensor
            args = tuple(device_index if i == names.index("storage_device") else a for i, a in enumerate(args))
    return func(*args)
