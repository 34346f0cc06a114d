"""Weight flow and trainer checkpoints of the GRPO Training Unit (paper appendix C): safetensors weights, DCP state.

Snapshot path (every Δ applied updates): `cpu_snapshot` copies the model's unique tensors to CPU (tied
weights once) -- T_save, together with publishing; `convert` applies the conversion hook (``identity``,
``bfloat16``, ``float16``) -- T_convert; `SnapshotPublisher.publish` hands it over:

* ``object_store`` (default): safetensors bytes put in the Ray object store; the payload is the ObjectRef
  (without a running Ray, e.g. in a single process, the bytes themselves). The last `keep` refs are held
  so Ray keeps them alive; older ones are released.
* ``files``: ``<dir>/snapshot-<version>.safetensors`` written atomically on a shared path; the payload is
  the path; only the last `keep` files are kept (and none newer than the one just written: those are left
  over from an attempt that a resume abandoned).

Generation actors turn a payload back into tensors with `asp.runtime.generation.resolve_weights` and load
it in place after their current minibatch -- T_load, reported by the actors.

Trainer checkpoint (`save_checkpoint` / `load_checkpoint`): a directory ``step-<step>/`` with the resumable
state as a `torch.distributed.checkpoint` (DCP) checkpoint -- ``.metadata`` and one ``__<rank>_0.distcp`` file per
rank holding that rank's shards of the weights and of the AdamW moments and steps (`get_state_dict`; tensors only),
``model.safetensors`` (the whole model's weights, tied weights once: what `asp heldout-reward` and other tools
read), ``rng.safetensors`` (torch CPU / CUDA RNG states), ``trainer.json`` (step, version, counters, optimizer
hyper-parameters) and ``manifest.json`` (every file's size, `asp.runtime.checkpoint.write_manifest`); written to
``.step-<step>.tmp`` by every rank and renamed by rank 0. DCP reshards on load, so a run may resume with another
number of ranks. `load_checkpoint` checks the directory before touching the model
(`asp.runtime.checkpoint.checkpoint_problem`: a truncated or missing file is named, not a raw safetensors error);
`latest_checkpoint` is the newest intact one.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import warnings
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from asp.runtime.checkpoint import checkpoint_problem, write_manifest
from asp.trainers.distributed import is_distributed, rank_and_world, tied_duplicates

if TYPE_CHECKING:
    from ray import ObjectRef

log = logging.getLogger(__name__)
SNAPSHOT_RE = re.compile(r"snapshot-(\d+)\.safetensors$")
CHECKPOINT_RE = re.compile(r"step-(\d+)$")


def cpu_snapshot(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Detached, contiguous CPU copies of the model's tensors, each storage once (tied weights: first name).

    Returns:
        name -> tensor, in `state_dict` order (e.g. ``model.embed_tokens.weight`` kept, tied
        ``lm_head.weight`` dropped (`tied_duplicates`): loading the first also sets the second).
    """
    drop = tied_duplicates(model)
    return {
        name: tensor.detach().to("cpu", copy=True).contiguous()
        for name, tensor in model.state_dict().items()
        if name not in drop
    }


def _cast(dtype: torch.dtype) -> Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]]:
    def convert(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}

    return convert


CONVERTERS: dict[str, Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]]] = {
    "identity": lambda state: state,
    "bfloat16": _cast(torch.bfloat16),
    "float16": _cast(torch.float16),
}


def convert(name: str, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Apply the conversion hook `name` (a key of `CONVERTERS`; add layout converters there)."""
    if name not in CONVERTERS:
        raise ValueError(f"unknown weight conversion {name!r}; choose one of {sorted(CONVERTERS)}")
    return CONVERTERS[name](state)


class SnapshotPublisher:
    """Publishes snapshots through the Ray object store or as safetensors files (see the module docstring).

    Args:
        transport: ``"object_store"`` or ``"files"``.
        directory: where ``files`` snapshots go (required for files).
        keep: snapshots retained.
    """

    def __init__(self, transport: str, directory: str | Path | None, keep: int) -> None:
        if transport not in ("object_store", "files"):
            raise ValueError(f"transport must be 'object_store' or 'files', got {transport!r}")
        if transport == "files" and directory is None:
            raise ValueError("the files transport needs a snapshot directory")
        self.transport, self.keep = transport, max(1, keep)
        self.directory = Path(directory) if directory is not None else None
        self.refs: deque[Any] = deque(maxlen=self.keep)

    def publish(self, version: int, state: Mapping[str, torch.Tensor]) -> ObjectRef | bytes | str:
        """Hand `state` over; return the payload for `WeightUpdate.payload` (ObjectRef, bytes or path)."""
        from safetensors.torch import save, save_file

        if self.transport == "files":
            assert self.directory is not None
            self.directory.mkdir(parents=True, exist_ok=True)
            path = self.directory / f"snapshot-{version:08d}.safetensors"
            tmp = path.with_name(f".{path.name}.tmp")
            save_file(dict(state), str(tmp), metadata={"version": str(version)})
            os.replace(tmp, path)
            self._prune_files(version)
            return str(path)
        blob = save(dict(state), metadata={"version": str(version)})
        try:
            import ray

            if ray.is_initialized():
                ref = ray.put(blob)
                self.refs.append(ref)  # held: Ray frees a snapshot once the trainer and every actor drop it
                return ref
        except ImportError:
            pass
        return blob

    def _prune_files(self, version: int) -> None:
        """Keep the last `keep` snapshots up to `version` (newer ones are from an attempt a resume abandoned)."""
        assert self.directory is not None
        snaps = sorted((int(m.group(1)), p) for p in self.directory.iterdir() if (m := SNAPSHOT_RE.match(p.name)))
        kept = [p for v, p in snaps if v <= version][-self.keep :]
        for _, path in snaps:
            if path not in kept:
                path.unlink(missing_ok=True)


# ---- trainer checkpoints -----------------------------------------------------------------------------
def save_checkpoint(
    root: Path,
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    meta: dict[str, Any],
    keep: int,
    weights: Mapping[str, torch.Tensor] | None = None,
) -> Path:
    """Write ``root/step-<step>/`` atomically (see the module docstring) and delete all but the last `keep`.

    With a process group every rank calls it (each writes its shards; `root` must be on a path all ranks share);
    rank 0 writes the rest and renames the directory after the shards are complete.

    Args:
        weights: the whole model's weights (`GRPOTrainer.full_weights`) on rank 0, written as
            ``model.safetensors``; ignored on the other ranks. None: `cpu_snapshot(model)` (an unsharded model).

    Returns:
        The checkpoint directory.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    root = Path(root)
    final, tmp = root / f"step-{step:08d}", root / f".step-{step:08d}.tmp"
    leader = rank_and_world()[0] == 0
    if leader:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    _barrier()
    try:
        model_state, optim_state = get_state_dict(model, optimizer)
        state = {"model": model_state, "optim": optim_state["state"]}
        with _single_process_quiet():
            dcp.save(state, checkpoint_id=str(tmp), no_dist=not is_distributed())
        if leader:
            weights = weights if weights is not None else cpu_snapshot(model)
            _finish_checkpoint(tmp, final, weights, {**meta, "step": step}, optim_state["param_groups"])
            _prune_checkpoints(root, step, keep)
    except BaseException:
        if leader:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    _barrier()
    return final


def _finish_checkpoint(
    tmp: Path, final: Path, weights: Mapping[str, torch.Tensor], meta: dict[str, Any], groups: list[Any]
) -> None:
    """Rank 0: consolidated weights, RNG, ``trainer.json`` and the manifest into `tmp`, then rename it to `final`."""
    from safetensors.torch import save_file

    save_file(dict(weights), str(tmp / "model.safetensors"))
    save_file(_rng_state(), str(tmp / "rng.safetensors"))
    plain = [{k: list(v) if isinstance(v, tuple) else v for k, v in g.items()} for g in groups]
    (tmp / "trainer.json").write_text(json.dumps({**meta, "param_groups": plain}, indent=1))
    write_manifest(tmp)
    if final.is_dir():
        shutil.rmtree(final)
    os.replace(tmp, final)


def _prune_checkpoints(root: Path, step: int, keep: int) -> None:
    """Keep the last `keep` checkpoints up to `step`; later ones belong to an attempt a resume abandoned."""
    found = sorted((int(m.group(1)), p) for p in root.iterdir() if (m := CHECKPOINT_RE.match(p.name)))
    kept = [p for s, p in found if s <= step][-keep:]
    for _, path in found:
        if path not in kept:
            shutil.rmtree(path, ignore_errors=True)


def load_checkpoint(directory: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Load weights, optimizer state and RNG from a `save_checkpoint` directory; return its ``trainer.json``.

    With a process group every rank calls it. The sharded state is resharded to this run's ranks, so a
    checkpoint written by another number of ranks loads too.

    Raises:
        ValueError: the checkpoint is missing or damaged (`checkpoint_problem`; nothing was loaded).
        FileNotFoundError: a file of a checkpoint without manifest is missing.
    """
    import torch.distributed.checkpoint as dcp
    from safetensors.torch import load_file
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    directory = Path(directory)
    problem = checkpoint_problem(directory)
    if problem:
        raise ValueError(f"damaged trainer checkpoint: {problem}")
    meta = json.loads((directory / "trainer.json").read_text())
    meta.pop("param_groups", None)  # the optimizer's own (same hyper-parameters: the run fingerprint checks them)
    model_state, optim_state = get_state_dict(model, optimizer)  # templates: this run's shards (optimizer: zeros)
    state = {"model": model_state, "optim": optim_state["state"]}
    with _single_process_quiet():
        dcp.load(state, checkpoint_id=str(directory), no_dist=not is_distributed())
    set_state_dict(model, optimizer, model_state_dict=model_state, optim_state_dict=optim_state)
    rng = load_file(str(directory / "rng.safetensors"))
    torch.set_rng_state(rng["cpu"])
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state(rng["cuda"])
    return meta


def latest_checkpoint(root: Path) -> Path | None:
    """The newest intact ``step-*`` directory under `root` (damaged ones skipped with a warning), or None."""
    if not Path(root).is_dir():
        return None
    for path in sorted((p for p in Path(root).iterdir() if CHECKPOINT_RE.match(p.name)), reverse=True):
        problem = checkpoint_problem(path)
        if problem is None:
            return path
        log.warning("skipping damaged trainer checkpoint: %s", problem)
    return None


@contextlib.contextmanager
def _single_process_quiet() -> Iterator[None]:
    """Silence DCP's warning that it saves / loads in a single process (the 1-rank trainer's normal case)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
        yield


def _barrier() -> None:
    """Wait for every rank (nothing without a process group)."""
    if is_distributed():
        torch.distributed.barrier()


def _rng_state() -> dict[str, torch.Tensor]:
    out = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["cuda"] = torch.cuda.get_rng_state()
    return out
