"""Checks of the Ray cluster a run uses, before any actor works: resources in all, custom resources, one directory.

`check_resources`: the cluster's CPUs / GPUs (and the custom resources of ``runtime.ray.actor_resources`` /
``trainer_resources``) cover what the Generation Units' actors and the Training Unit's ranks ask for, else a
`UserError` naming the knob to change. `check_same_directory` (launch joined to a cluster by ``runtime.ray.address``):
every actor works in the driver's directory, i.e. its node has the project at the same path (the policy, weight
snapshots and trainer checkpoints are relative paths), else a `UserError` naming the nodes (`directory_problem`).
Tests: tests/runtime/test_multinode_units.py (pure), tests/runtime/test_multinode.py (a multi-node cluster).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from asp.errors import UserError
from asp.runtime.config import RuntimeConfig
from asp.runtime.placement import trainer_ranks


def check_resources(config: RuntimeConfig) -> None:
    """Raise `UserError` when Ray cannot give the generation actors and trainer their CPUs / GPUs."""
    import ray

    available = ray.cluster_resources()  # totals: what Ray can give once other work finishes
    for kind, per_actor, trainer, knob in (
        ("CPU", config.ray.actor_num_cpus, config.ray.trainer_num_cpus, "ray.num_cpus"),
        ("GPU", config.ray.actor_num_gpus, config.ray.trainer_num_gpus, "ray.num_gpus"),
    ):
        trainer = trainer * trainer_ranks(config)
        need = config.total_actors * per_actor + trainer
        have = available.get(kind, 0.0)
        if need > have + 1e-9:
            raise UserError(
                f"the runtime needs {need:g} {kind}s ({config.ray.generation_units} units x "
                f"{config.ray.actors_per_unit} actors x {per_actor:g} + trainer {trainer:g}) but Ray can give "
                f"{have:g}. Use fewer "
                f"runtime.ray.generation_units / actors_per_unit, a smaller runtime.ray.actor_num_{kind.lower()}s, or "
                f"more resources (runtime.{knob} or a bigger cluster)."
            )
    check_custom_resources(config, available)


def check_custom_resources(config: RuntimeConfig, available: Mapping[str, float]) -> None:
    """Raise `UserError` when the cluster lacks the custom resources of runtime.ray.actor_resources /
    trainer_resources."""
    actor, trainer = config.ray.actor_resources or {}, config.ray.trainer_resources or {}
    ranks = trainer_ranks(config)
    for name in sorted(set(actor) | set(trainer)):
        need = config.total_actors * actor.get(name, 0.0) + ranks * trainer.get(name, 0.0)
        have = available.get(name, 0.0)
        if need > have + 1e-9:
            raise UserError(
                f"the runtime needs {need:g} of the custom Ray resource {name!r} (runtime.ray.actor_resources x "
                f"{config.total_actors} actors + runtime.ray.trainer_resources x {ranks} trainer ranks) but the "
                f"cluster has {have:g}. Start the nodes meant for these units with `ray start --resources "
                f"'{{\"{name}\": N}}'` (docs/cluster.md), or change runtime.ray.actor_resources / trainer_resources."
            )


def actor_place(actor: Any) -> tuple[str, str]:
    """In an actor (through ``__ray_call__``): its working directory and its node's id."""
    import ray

    return os.getcwd(), ray.get_runtime_context().get_node_id()


def check_same_directory(actors: Mapping[str, Any]) -> None:
    """Raise `UserError` when an actor does not work in the driver's directory (its node lacks the project)."""
    import ray

    places = ray.get([h.__ray_call__.remote(actor_place) for h in actors.values()])
    problem = directory_problem(os.getcwd(), dict(zip(actors, places, strict=True)))
    if problem:
        raise UserError(problem)


def directory_problem(cwd: str, places: Mapping[str, tuple[str, str]]) -> str | None:
    """The message when an actor's working directory (``places``: name -> (directory, node id)) is not `cwd`.

    The runtime's actors work in the driver's directory (`asp.runtime.trainer.work_in`): the policy, weight
    snapshots and trainer checkpoints are paths relative to it, so on another node a different directory means
    checkpoints written where no rerun finds them."""
    away = {name: node for name, (directory, node) in places.items() if directory != cwd}
    if not away:
        return None
    nodes = sorted(set(away.values()))
    return (
        f"{len(away)} of the runtime's actors ({', '.join(list(away)[:4])}{', ...' if len(away) > 4 else ''}) "
        f"run on Ray node(s) {', '.join(n[:12] for n in nodes)} where the project directory {cwd} does not exist. "
        "The actors read the policy and write snapshots and trainer checkpoints relative to it: put the project on "
        "storage mounted at the same path on every node (docs/cluster.md), or pin the units to nodes that have it "
        "(runtime.ray.actor_resources / trainer_resources)."
    )
