"""The Training Unit seen from the runtime: the `Trainer` protocol and `TrainingUnit`, its Ray actor wrapper.

A trainer consumes one `GlobalBatch` per `step` and returns a `StepResult` (new policy version, metrics, a
small JSON-able state for the runtime checkpoint, and optionally a `WeightUpdate` for the generation
actors). The implementations live in `asp.trainers` (simulated; GRPO with its weight flow); the runtime only
calls the picklable zero-argument factory it is given, inside the `TrainingUnit` actor(s): one per rank
(`build_training_unit`); several ranks form one torch.distributed process group and the runtime talks to rank 0.
The runtime's actors work in the driver's directory (`work_in`), so relative paths (the launch stage's
``outputs/launch_state/...``) mean the same in the driver and in its actors, also on a cluster joined by address.
"""

from __future__ import annotations

import datetime
import os
import socket
from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable

from asp.control.messages import GlobalBatch, StepResult, WeightUpdate


@runtime_checkable
class Trainer(Protocol):
    """What the Training Unit runs. `version` is the policy version (0 before any step)."""

    version: int

    def step(self, batch: GlobalBatch) -> StepResult:
        """Train on one global batch; return the new version, metrics, state and optional weight update."""
        ...

    def restore(self, state: Mapping[str, Any]) -> WeightUpdate | None:
        """Continue from the `StepResult.state` stored in a runtime checkpoint; return the snapshot the
        generation actors must load to match the restored weights (None: keep theirs)."""
        ...


def work_in(cwd: str | None) -> None:
    """In an actor: change to the driver's working directory `cwd` when this node has it (a Ray worker of a cluster
    joined by address starts wherever the cluster was started)."""
    if cwd and os.path.isdir(cwd):
        os.chdir(cwd)


class TrainingUnit:
    """Ray actor wrapper around a `Trainer` built from a picklable zero-argument factory; one actor per rank.

    One rank (`world_size` 1, no process group): the trainer is built in the constructor. Several ranks (or a
    factory with ``needs_process_group``): `start_group` on rank 0, the leader, picks the rendezvous address,
    has every other rank `join_group`, and each rank starts the torch.distributed group, then builds its trainer.
    The runtime talks to the leader only: it forwards `step` / `restore` to the other ranks, runs its own part
    (the ranks meet in the trainer's collectives) and returns rank 0's result.
    """

    def __init__(
        self, trainer_factory: Callable[[], Trainer], rank: int, world_size: int, cwd: str | None = None
    ) -> None:
        work_in(cwd)
        self.factory, self.rank, self.world_size = trainer_factory, rank, world_size
        self.error: str | None = None
        self.trainer: Any = None
        self.peers: list[Any] = []
        if not _needs_group(trainer_factory, world_size):
            self._build()

    def _build(self) -> None:
        try:
            self.trainer = self.factory()
        except Exception as exc:
            self.error = f"{type(exc).__name__}: {exc}"

    def start_group(self, peers: list[Any], backend: str, timeout_s: float) -> None:
        """Rank 0: start the process group with `peers` (ranks 1..) at this node's address, then build."""
        import ray

        address, port = ray.util.get_node_ip_address(), free_port()
        self.peers = list(peers)
        for peer in self.peers:
            peer.join_group.remote(address, port, backend, timeout_s)
        self.join_group(address, port, backend, timeout_s)

    def join_group(self, address: str, port: int, backend: str, timeout_s: float) -> None:
        """Join the process group whose rank 0 listens at `address`:`port`, then build the trainer."""
        try:
            init_process_group(address, port, self.rank, self.world_size, backend, timeout_s)
        except Exception as exc:
            self.error = f"rank {self.rank} could not join the process group: {type(exc).__name__}: {exc}"
            return
        self._build()

    def ready(self) -> str | None:
        """None when every rank built its trainer, else the first error message."""
        import ray

        errors = [self.error, *ray.get([peer.ready.remote() for peer in self.peers])]
        return next((e for e in errors if e), None)

    def restore(self, state: Mapping[str, Any]) -> WeightUpdate | None:
        refs = [peer.restore.remote(state) for peer in self.peers]
        update = self.trainer.restore(state)
        _wait(refs)
        return update

    def step(self, batch: GlobalBatch) -> StepResult:
        refs = [peer.step.remote(batch) for peer in self.peers]
        result = self.trainer.step(batch)
        _wait(refs)
        return result


def _wait(refs: list[Any]) -> None:
    """Wait for the other ranks' calls (raising their error, if any)."""
    if refs:
        import ray

        ray.get(refs)


def _needs_group(trainer_factory: Any, world_size: int) -> bool:
    return bool(getattr(trainer_factory, "needs_process_group", world_size > 1))


def free_port() -> int:
    """A TCP port free on this node right now (the process group's rendezvous port)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


def init_process_group(address: str, port: int, rank: int, world_size: int, backend: str, timeout_s: float) -> None:
    """Start this rank's torch.distributed default process group (TCP rendezvous at rank 0's `address`:`port`)."""
    import torch

    if backend == "nccl" and torch.cuda.is_available():
        torch.cuda.set_device(0)  # a Ray GPU actor sees its own GPU(s) only (CUDA_VISIBLE_DEVICES)
    torch.distributed.init_process_group(
        backend,
        init_method=f"tcp://{address}:{port}",
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=timeout_s),
    )


_RANKS: dict[str, list[Any]] = {}


def build_training_unit(
    config: Any, trainer_factory: Callable[[], Trainer], placement: Any = None
) -> tuple[Any, list[Any]]:
    """Start the Training Unit's rank actors (``trainer_factory.world_size``, 1 if it has none) without waiting.

    Args:
        config: the `RuntimeConfig` (``ray.trainer_num_cpus`` / ``ray.trainer_num_gpus`` per rank,
            ``control.stall_timeout_s``).
        trainer_factory: the picklable factory; may carry ``world_size``, ``needs_process_group`` and ``backend``.
        placement: None, or an object whose ``trainer_options(rank)`` returns extra ``.options(...)`` kwargs.

    Returns:
        (the leader's handle (rank 0, the one the Control Unit calls), every rank's handle). Wait for
        ``leader.ready.remote()``; `rank_handles(leader)` finds them all again (for teardown).
    """
    import ray

    world = int(getattr(trainer_factory, "world_size", 1))
    cls = ray.remote(TrainingUnit)
    ranks = []
    for rank in range(world):
        options = {"num_cpus": config.ray.trainer_num_cpus, "num_gpus": config.ray.trainer_num_gpus}
        if placement is not None:
            options.update(placement.trainer_options(rank))
        ranks.append(cls.options(**options).remote(trainer_factory, rank, world, os.getcwd()))
    if _needs_group(trainer_factory, world):
        backend = str(getattr(trainer_factory, "backend", "gloo"))
        ranks[0].start_group.remote(ranks[1:], backend, max(float(config.control.stall_timeout_s), 60.0))
    _RANKS[ranks[0]._actor_id.hex()] = ranks
    return ranks[0], ranks


def rank_handles(leader: Any) -> list[Any]:
    """Every rank's handle of the Training Unit led by `leader` (just `leader` if it was not built here)."""
    return _RANKS.pop(leader._actor_id.hex(), [leader]) if hasattr(leader, "_actor_id") else [leader]
