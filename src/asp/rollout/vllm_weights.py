"""Weight reload for `asp.rollout.vllm.VLLMEngine`: the worker extension and the engine-side sender.

vLLM's documented way for an RL trainer to change a running engine's weights is a worker extension
(``LLM(worker_extension_cls=...)`` mixes its methods into every worker) called through ``LLM.collective_rpc``,
which feeds (Hugging Face name, tensor) pairs to the model's ``load_weights`` (that handles fused QKV /
gate-up projections and tensor-parallel sharding). What crosses the RPC decides the cost:

* ``ipc`` (`weight_transfer: auto` wherever CUDA exists, i.e. every real vLLM engine): the generation actor's
  process, which shares its node and GPUs with the engine's workers, packs one bucket of the snapshot
  (`asp.rollout.weight_transfer`, at most ``weight_bucket_mb``) into a staging buffer on each worker's GPU and
  sends CUDA IPC handles of it (a few hundred bytes); each worker maps the buffer, takes views of its tensors
  and calls ``load_weights`` with them, then synchronizes so the buffer can be refilled. No tensor goes through
  vLLM's RPC serialisation, and the staging memory is one bucket per GPU. Workers say which GPU they use
  (``asp_device_uuid``, the physical UUID); a worker GPU that the actor's process cannot see, or a first IPC
  bucket that fails (e.g. a container that forbids CUDA IPC), makes ``auto`` fall back to ``rpc`` for the rest
  of the engine's life (``ipc`` set explicitly: an error).
* ``rpc``: each bucket packed on the CPU and sent as one ``bytes`` argument of ``collective_rpc`` (vLLM's RPC
  carries it as msgpack binary); the worker takes views of it and loads them. Bounded messages, but the bytes are
  copied through vLLM's RPC: the fallback where IPC is unavailable. Raw tensors are never passed: vLLM 0.33's
  engine core decodes ``collective_rpc`` arguments without type information, so a ``torch.Tensor`` argument
  reaches the workers as a ``[dtype, shape, data]`` list (the contract test in tests/rollout/test_rollout_vllm.py
  shows this with vLLM's own encoder and decoder) -- which is why the earlier (name, tensor) path is gone.

After the last bucket the engine drops its prefix cache (blocks computed with the old weights). A reload that
fails once a bucket has been sent may leave the workers with a mix of two snapshots: `BucketedLoader.partial` is
then set and the engine refuses to generate until a reload succeeds (the generation actor offers the snapshot again
with its next minibatch), so no sample is ever produced by a mixed policy and labelled with either version.

Each bucket goes to the model's ``load_weights`` between `AspWorkerExtension.asp_reload_begin` and
``asp_reload_end`` (vLLM's layerwise in-place reload, where the installed vLLM has it: the layers get their checkpoint
layout back, and each is processed into its kernel layout once all its weights arrived, whatever the bucket
boundaries; on vLLM's CPU build plain ``load_weights`` into the running model fails).

Tests: the rpc path against real vLLM (CPU build) in tests/rollout/test_vllm_real.py; the IPC path, which needs
CUDA, with stand-ins for vLLM's ``LLM`` and worker (named as such) around a real tiny torch model in
tests/rollout/test_vllm_weights.py, the CPU standing in for the CUDA device.
"""

from __future__ import annotations

import logging
import pickle
from collections.abc import Callable, Mapping
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any

from asp.rollout.weight_transfer import (
    Bucket,
    meta_rows,
    metas_from_rows,
    open_shared,
    pack_bucket,
    plan_buckets,
    share_buffer,
    tensor_metas,
    unpack_bucket,
)

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)


class IpcUnavailable(RuntimeError):
    """CUDA IPC cannot reach the workers (a worker GPU the sender cannot see, or opening a handle failed)."""


class AspWorkerExtension:
    """Mixed into every vLLM worker via ``worker_extension_cls``; called through ``LLM.collective_rpc``.

    Relies on two attributes of vLLM's GPU worker: ``model_runner.model`` (the model, with ``load_weights``) and
    ``device`` (its ``torch.device``).
    """

    def asp_device_uuid(self) -> str:
        """The physical UUID of this worker's GPU (the same in every process, whatever its device numbering)."""
        import torch

        return str(torch.cuda.get_device_properties(self._asp_device_index()).uuid)

    def asp_load_bucket_bytes(self, data: bytes, rows: list[list[Any]]) -> int:
        """Load one bucket sent as bytes (the ``rpc`` transport); returns the number of tensors."""
        import torch

        buffer = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)
        return self._asp_load_buffer(buffer, metas_from_rows(rows))

    def asp_load_ipc_bucket(self, handles: bytes, rows: list[list[Any]]) -> int:
        """Map this GPU's staging buffer (``handles``: pickled {GPU UUID: IPC handle}), load the bucket's tensors.

        Returns once the copies into the model are done, so the sender may refill the buffer.
        """
        shared = pickle.loads(handles)  # noqa: S301 -- from our own engine process: IPC handles, no tensor data
        uuid = self.asp_device_uuid()
        if uuid not in shared:
            raise IpcUnavailable(f"no staging buffer for this worker's GPU {uuid} (have {sorted(shared)})")
        buffer = open_shared(shared[uuid], self._asp_device_index())
        count = self._asp_load_buffer(buffer, metas_from_rows(rows))
        del buffer
        return count

    def asp_reload_begin(self) -> bool:
        """Start a reload (before the first bucket): where vLLM has in-place layerwise reloading, restore every
        layer's checkpoint layout so that the buckets' (Hugging Face name, tensor) pairs can be loaded; each layer
        is processed back into its kernel layout as soon as all its weights have arrived (whatever the bucket
        boundaries), the rest at `asp_reload_end`. Returns whether that path is used (False: plain
        ``load_weights`` per bucket, vLLM versions without it).

        Why: on vLLM's CPU backend (oneDNN) linear weights are repacked into kernel tensors after loading, so
        ``model.load_weights`` alone fails (``Attempted to load weight ... into parameter (torch.Size([0]))``);
        vLLM's own ``reload_weights`` is this begin / load / end sequence in one call, which buckets sent as
        separate RPCs cannot use.
        """
        layerwise = _layerwise() if getattr(self, "vllm_config", None) is not None else None
        if layerwise is None:
            self._asp_layerwise = False
            return False
        model = self._asp_model()
        if getattr(self, "_asp_layerwise", False):
            # the last reload stopped part-way: drop the weights its layers buffered, or they would be loaded again
            # (with the failed snapshot's) once this reload completes those layers
            _drop_buffered(model)
        with self._asp_config():
            layerwise.initialize_layerwise_reload(model)
        self._asp_layerwise = True
        return True

    def asp_reload_end(self) -> bool:
        """Finish a reload started by `asp_reload_begin`: process the layers not processed yet (vLLM's
        ``finalize_layerwise_reload``). Returns whether the layerwise path was used."""
        if not getattr(self, "_asp_layerwise", False):
            return False
        layerwise = _layerwise()
        assert layerwise is not None
        with self._asp_config():
            layerwise.finalize_layerwise_reload(self._asp_model(), self.vllm_config.model_config)  # type: ignore[attr-defined]
        self._asp_layerwise = False
        return True

    def _asp_model(self) -> Any:
        return self.model_runner.model  # type: ignore[attr-defined]

    def _asp_config(self) -> Any:
        config = getattr(self, "vllm_config", None)
        if config is None:
            return nullcontext()
        from vllm.config import set_current_vllm_config

        return set_current_vllm_config(config)

    def _asp_load_buffer(self, buffer: torch.Tensor, bucket: Bucket) -> int:
        import torch

        weights = list(unpack_bucket(buffer, bucket))
        model = self._asp_model()
        with self._asp_config():
            model.load_weights(weights=weights)
            head = self._asp_tied_head()
            for name, tensor in weights:
                if head is not None and name.endswith("embed_tokens.weight"):
                    # tied embeddings: the model's loader skips lm_head, which shares the embedding's parameter, but
                    # its layer keeps a processed copy of it (vLLM's CPU build packs the logits GEMM's weight), so
                    # the layerwise reload would give it back the old one: load the head from the new embedding
                    _weight_loader(head.weight)(head.weight, tensor)
        if buffer.is_cuda:
            torch.cuda.synchronize(buffer.device)
        return len(bucket.tensors)

    def _asp_tied_head(self) -> Any:
        """The model's ``lm_head`` when its weights are tied to the input embedding, else None."""
        config = getattr(getattr(getattr(self, "vllm_config", None), "model_config", None), "hf_config", None)
        if not getattr(config, "tie_word_embeddings", False):
            return None
        head = getattr(self._asp_model(), "lm_head", None)
        return head if hasattr(head, "weight") else None

    def _asp_device_index(self) -> int | None:
        import torch

        device = getattr(self, "device", None)
        return device.index if device is not None and device.index is not None else torch.cuda.current_device()


def _layerwise() -> Any:
    """vLLM's layerwise reload module (``vllm.model_executor.model_loader.reload``), or None where this vLLM has
    none (or vLLM is not installed: the stand-in workers of the CPU tests)."""
    try:
        from vllm.model_executor.model_loader import reload
    except ImportError:
        return None
    needed = ("initialize_layerwise_reload", "finalize_layerwise_reload")
    return reload if all(hasattr(reload, n) for n in needed) else None


def _weight_loader(param: Any) -> Any:
    """A vLLM parameter's ``weight_loader`` (during a layerwise reload, the one that buffers until its layer is
    complete), or vLLM's default copy."""
    loader = getattr(param, "weight_loader", None)
    if loader is not None:
        return loader
    from vllm.model_executor.model_loader.weight_utils import default_weight_loader

    return default_weight_loader


def _drop_buffered(model: Any) -> None:
    """Forget the weights each layer buffered during an unfinished layerwise reload (vLLM keeps them per layer until
    the layer is complete)."""
    from vllm.model_executor.model_loader.reload.layerwise import get_layerwise_info

    for layer in model.modules():
        info = get_layerwise_info(layer)
        if info.can_load():
            info.loaded_weights.clear()
            info.load_numel = 0


class BucketedLoader:
    """Sends snapshots to an engine's workers bucket by bucket (see the module docstring).

    Args:
        rpc: ``rpc(method, *args)`` calls the worker extension's `method` on every worker (``LLM.collective_rpc``)
            and returns their answers.
        transfer: ``"ipc"`` or ``"rpc"`` (`asp.rollout.weight_transfer.plan_transfer`).
        bucket_bytes: bucket budget in bytes (``weight_bucket_mb * MIB``).
        staging_devices: for ipc, {worker GPU UUID: this process's ``torch.device`` for it}, computed on first
            use from the workers' UUIDs (`cuda_staging_devices`); a stand-in mapping in CPU tests.
        fallback: on `IpcUnavailable` switch to rpc (``weight_transfer: auto``) instead of raising.
    """

    def __init__(
        self,
        rpc: Callable[..., list[Any]],
        transfer: str,
        bucket_bytes: int,
        staging_devices: Callable[[list[str]], Mapping[str, torch.device]] | None = None,
        fallback: bool = False,
    ) -> None:
        if transfer not in ("ipc", "rpc"):
            raise ValueError(f"transfer must be 'ipc' or 'rpc', got {transfer!r}")
        self.rpc, self.transfer, self.bucket_bytes = rpc, transfer, int(bucket_bytes)
        self.staging_devices = staging_devices or cuda_staging_devices
        self.fallback = fallback
        self.partial = False  # a reload failed part-way: the workers may hold a mix of two snapshots
        self.ipc_worked = False  # after one IPC bucket went through, IPC errors are errors, not "unavailable"
        self.buckets_sent = 0
        self._devices: Mapping[str, torch.device] | None = None
        self._begun = False

    def load(self, state: Mapping[str, torch.Tensor]) -> int:
        """Load every tensor of `state` into every worker, bucket by bucket; returns the number of buckets.

        Raises:
            whatever the transport raises; `partial` is then True if any bucket was sent (until a load succeeds).
        """
        buckets = plan_buckets(tensor_metas(state), self.bucket_bytes)
        try:
            self._begun = False
            if self.transfer == "ipc":
                try:
                    self._send_ipc(state, buckets)
                except IpcUnavailable as exc:
                    if not self.fallback:
                        raise
                    log.warning("CUDA IPC weight transfer unavailable (%s); falling back to rpc for this engine", exc)
                    self.transfer = "rpc"
                    self._send_rpc(state, buckets)
            else:
                self._send_rpc(state, buckets)
            if self._begun:
                self.rpc("asp_reload_end")
        except BaseException:
            if self.partial:
                log.error("weight reload failed part-way: the engine generates nothing until a reload succeeds")
            raise
        self.partial = False
        return len(buckets)

    def _begin(self) -> None:
        """Before the first bucket of a load: the workers restore their layers' checkpoint layout
        (`AspWorkerExtension.asp_reload_begin`); from here on a failure leaves them `partial`."""
        if not self._begun:
            self.partial = True
            self.rpc("asp_reload_begin")
            self._begun = True

    def _send_rpc(self, state: Mapping[str, torch.Tensor], buckets: list[Bucket]) -> None:
        import torch

        buffer = torch.empty(max((b.nbytes for b in buckets), default=0), dtype=torch.uint8)
        for bucket in buckets:
            data = pack_bucket(state, bucket, buffer).numpy().tobytes()
            self._begin()
            self.rpc("asp_load_bucket_bytes", data, meta_rows(bucket))
            self.buckets_sent += 1

    def _send_ipc(self, state: Mapping[str, torch.Tensor], buckets: list[Bucket]) -> None:
        import torch

        if self._devices is None:
            self._devices = self.staging_devices(list(self.rpc("asp_device_uuid")))
        size = max((b.nbytes for b in buckets), default=0)
        staging = {uuid: torch.empty(max(size, 1), dtype=torch.uint8, device=d) for uuid, d in self._devices.items()}
        first, *others = staging
        try:
            for bucket in buckets:
                packed = pack_bucket(state, bucket, staging[first])
                for uuid in others:
                    staging[uuid][: bucket.nbytes].copy_(packed)
                for buf in staging.values():
                    if buf.is_cuda:
                        torch.cuda.synchronize(buf.device)
                handles = pickle.dumps({uuid: share_buffer(buf) for uuid, buf in staging.items()})
                self._begin()
                try:
                    self.rpc("asp_load_ipc_bucket", handles, meta_rows(bucket))
                except Exception as exc:
                    if self.ipc_worked:
                        raise
                    raise IpcUnavailable(f"the first IPC bucket failed: {type(exc).__name__}: {exc!s:.300}") from exc
                self.ipc_worked = True
                self.buckets_sent += 1
        finally:
            cuda = any(buf.is_cuda for buf in staging.values())
            del staging
            if cuda:
                torch.cuda.ipc_collect()
                torch.cuda.empty_cache()


def cuda_staging_devices(worker_uuids: list[str]) -> dict[str, torch.device]:
    """{worker GPU UUID: this process's device for it}, one entry per distinct GPU.

    Raises:
        IpcUnavailable: no CUDA here, or a worker GPU this process cannot see (e.g. workers on another node).
    """
    import torch

    if not torch.cuda.is_available():
        raise IpcUnavailable("CUDA is not available in the engine's process")
    local = {
        str(torch.cuda.get_device_properties(i).uuid): torch.device("cuda", i)
        for i in range(torch.cuda.device_count())
    }
    missing = sorted(set(worker_uuids) - set(local))
    if missing:
        raise IpcUnavailable(f"worker GPU(s) {missing} are not visible to the engine's process")
    return {uuid: local[uuid] for uuid in dict.fromkeys(worker_uuids)}
