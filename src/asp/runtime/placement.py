"""Ray placement groups for the runtime: one per Generation Unit, one for the Training Unit (paper section 4).

``runtime.ray.placement`` maps the paper's units onto the nodes of a Ray cluster:

* ``pack`` (default): each Generation Unit is a placement group with one bundle per generation actor
  (``{CPU: actor_num_cpus, GPU: actor_num_gpus}``) and strategy PACK, so a GU's actors share a node when they fit
  there (and spill onto other nodes when not); the Training Unit's ranks (``runtime.grpo.world_size`` when
  ``runtime.trainer.kind: grpo``, else 1; ``{CPU: trainer_num_cpus, GPU: trainer_num_gpus}`` each) are their own
  PACK group.
* ``spread``: the same groups with strategy SPREAD (a unit's bundles on different nodes where possible).
* ``none``: no groups; every actor asks Ray for its CPUs / GPUs on its own (the behaviour before placement groups).

**Pinning units to nodes** (``runtime.ray.actor_resources`` / ``trainer_resources``, default none): custom Ray
resources added to each generation actor's / trainer rank's bundle (with ``placement: none``, to the actor's own
request), so a unit lands only on nodes started with that resource (``ray start --resources '{"rollout_node": 8}'``):
e.g. the Training Unit on the node with the fast interconnect and the Generation Units on the others (docs/cluster.md).

Ray refuses a bundle that asks for nothing (every value 0), so zero amounts are left out of a bundle, and a unit
whose bundles would all be empty (e.g. the demo's Training Unit with ``trainer_num_cpus: 0``) gets **no** group:
its actors are scheduled with plain resource requests, exactly as with ``placement: none``. All groups are
created at once and must be ready within ``runtime.control.stall_timeout_s``; otherwise they are removed and a
`UserError` names the group, its bundles and the cluster's resources.

    from asp.runtime.placement import create_placement, trainer_ranks
    placement = create_placement(config, trainer_ranks(config))   # needs a connected Ray
    actor_cls.options(num_cpus=..., **placement.actor_options(gu, index)).remote(...)
    log.info("placement: %s", placement.describe())
    placement.remove()
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from asp.errors import UserError
from asp.runtime.config import RuntimeConfig

log = logging.getLogger(__name__)

Bundle = dict[str, float]
STRATEGIES = {"pack": "PACK", "spread": "SPREAD"}
TRAINER = "training unit"


def bundle(num_cpus: float, num_gpus: float, custom: Mapping[str, float] | None = None) -> Bundle:
    """The bundle of one actor: its nonzero CPU / GPU / custom resource amounts (Ray refuses zero-only bundles)."""
    amounts = [("CPU", num_cpus), ("GPU", num_gpus), *sorted((custom or {}).items())]
    return {kind: float(amount) for kind, amount in amounts if amount > 0}


def trainer_ranks(config: RuntimeConfig, trainer_factory: Any = None) -> int:
    """Ray actors of the Training Unit: the factory's ``world_size`` when it declares one (what
    `asp.runtime.trainer.build_training_unit` starts), else ``runtime.grpo.world_size`` with the GRPO trainer, else 1.
    """
    declared = getattr(trainer_factory, "world_size", None)
    if declared is not None:
        return int(declared)
    return config.grpo.world_size if config.trainer.kind == "grpo" else 1


def gu_bundles(config: RuntimeConfig) -> list[Bundle]:
    """One bundle per generation actor of a Generation Unit (all GUs alike)."""
    one = bundle(config.ray.actor_num_cpus, config.ray.actor_num_gpus, config.ray.actor_resources)
    return [dict(one) for _ in range(config.ray.actors_per_unit)]


def trainer_bundles(config: RuntimeConfig, ranks: int) -> list[Bundle]:
    """One bundle per Training Unit rank."""
    one = bundle(config.ray.trainer_num_cpus, config.ray.trainer_num_gpus, config.ray.trainer_resources)
    return [dict(one) for _ in range(ranks)]


def unit_bundles(config: RuntimeConfig, ranks: int) -> dict[str, list[Bundle]]:
    """The placement groups to create: unit name ("gu0", ..., "training unit") -> its bundles.

    Empty for ``placement: none``; a unit whose bundles all ask for nothing is left out (plain scheduling).
    """
    if config.ray.placement == "none":
        return {}
    units = {f"gu{g}": gu_bundles(config) for g in range(config.ray.generation_units)}
    units[TRAINER] = trainer_bundles(config, ranks)
    return {name: bundles for name, bundles in units.items() if any(bundles)}


@dataclass
class Placement:
    """The runtime's placement groups (unit name -> `ray.util.placement_group.PlacementGroup`).

    The option methods return extra keyword arguments for an actor's ``.options(...)``: a
    `PlacementGroupSchedulingStrategy` at the actor's bundle when its unit has a group, else nothing. Child tasks
    are not captured: the actor already holds its bundle's resources, so a task it starts (e.g. an engine's own
    Ray workers) would otherwise wait for them forever; such tasks are scheduled normally.
    """

    groups: dict[str, Any] = field(default_factory=dict)
    bundles: dict[str, list[Bundle]] = field(default_factory=dict)
    loose: dict[str, dict[str, float]] = field(default_factory=dict)  # unit -> custom resources, when it has no group

    def actor_options(self, gu: int, index: int) -> dict[str, Any]:
        """Options placing generation actor `index` (0-based within its unit) of Generation Unit `gu`."""
        return self._options(f"gu{gu}", index)

    def unit_options(self, gu: int) -> dict[str, Any]:
        """Options placing Generation Unit `gu`'s control actor (0 CPUs) beside its first generation actor."""
        return self._options(f"gu{gu}", 0)

    def trainer_options(self, rank: int) -> dict[str, Any]:
        """Options placing Training Unit rank `rank`."""
        return self._options(TRAINER, rank)

    def _options(self, unit: str, index: int) -> dict[str, Any]:
        group = self.groups.get(unit)
        if group is None:
            custom = self.loose.get(unit)
            return {"resources": dict(custom)} if custom else {}
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        strategy = PlacementGroupSchedulingStrategy(
            group, placement_group_bundle_index=index, placement_group_capture_child_tasks=False
        )
        return {"scheduling_strategy": strategy}

    def describe(self) -> dict[str, list[str]]:
        """Unit name -> node id (hex) of each bundle, from Ray's placement group table (for logs)."""
        from ray.util import placement_group_table

        out = {}
        for unit, group in self.groups.items():
            nodes = placement_group_table(group).get("bundles_to_node_id", {})
            out[unit] = [str(nodes.get(i, "?")) for i in range(len(self.bundles.get(unit, [])))]
        return out

    def remove(self) -> None:
        """Remove every group (idempotent; actors still in a group are killed by Ray)."""
        from ray.util import remove_placement_group

        for unit, group in list(self.groups.items()):
            try:
                remove_placement_group(group)
            except Exception as exc:  # already gone, or Ray shut down: nothing left to free
                log.debug("could not remove the placement group of %s: %s", unit, exc)
        self.groups.clear()


def create_placement(config: RuntimeConfig, trainer_ranks: int) -> Placement:
    """Create the runtime's placement groups and wait until every one is placed.

    Args:
        config: ``placement``, the actor / trainer resources and ``stall_timeout_s`` (the longest wait).
        trainer_ranks: Ray actors of the Training Unit (see `trainer_ranks`).

    Returns:
        The `Placement` (no groups for ``placement: none``).

    Raises:
        UserError: a group was not placed within ``stall_timeout_s``; every group created is removed first.
    """
    import ray
    from ray.util import placement_group

    wanted = unit_bundles(config, trainer_ranks)
    placement = Placement(bundles=wanted, loose=loose_resources(config))
    if not wanted:
        return placement
    strategy, tag = STRATEGIES[config.ray.placement], uuid.uuid4().hex[:8]
    try:
        for unit, bundles in wanted.items():
            placement.groups[unit] = placement_group(bundles, strategy=strategy, name=_group_name(unit, tag))
        refs = {unit: group.ready() for unit, group in placement.groups.items()}
        ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=config.control.stall_timeout_s)
    except BaseException:
        placement.remove()
        raise
    missing = [unit for unit, ref in refs.items() if ref not in ready]
    if missing:
        placement.remove()
        raise UserError(_not_placed_message(config, missing, wanted, ray.cluster_resources()))
    log.info("placement groups (%s): %s", strategy, placement.describe())
    return placement


def loose_resources(config: RuntimeConfig) -> dict[str, dict[str, float]]:
    """With ``placement: none``: unit name -> the custom resources each of its actors asks Ray for (no groups)."""
    if config.ray.placement != "none":
        return {}  # a unit with custom resources always has a group: they are in its bundles
    units = {f"gu{g}": config.ray.actor_resources for g in range(config.ray.generation_units)}
    units[TRAINER] = config.ray.trainer_resources
    return {unit: {k: float(v) for k, v in custom.items() if v > 0} for unit, custom in units.items() if custom}


def _group_name(unit: str, tag: str) -> str:
    """A readable group name (``ray list placement-groups``), unique per run: names are global in a namespace."""
    return f"asp-{unit.replace(' ', '-')}-{tag}"


def _not_placed_message(
    config: RuntimeConfig, missing: list[str], wanted: Mapping[str, list[Bundle]], cluster: Mapping[str, float]
) -> str:
    """One paragraph: which groups Ray could not place, their bundles, what the cluster has, what to change."""
    custom = sorted({kind for unit in missing for b in wanted[unit] for kind in b} - {"CPU", "GPU"})
    have = {kind: cluster.get(kind, 0.0) for kind in ("CPU", "GPU", *custom) if kind in cluster or kind in custom}
    groups = "; ".join(f"{unit} with bundles {wanted[unit]}" for unit in missing)
    return (
        f"Ray could not place the placement group of {groups} within {config.control.stall_timeout_s:g} s "
        f"(runtime.control.stall_timeout_s, runtime.ray.placement: {config.ray.placement}); the cluster has {have} "
        "in all, and a bundle must fit on one node (with pack, a whole unit on one node first). Use smaller "
        "runtime.ray.actor_num_cpus / actor_num_gpus (or trainer_num_cpus / trainer_num_gpus), fewer actors_per_unit "
        "or Training Unit ranks, more or bigger nodes (with the custom resources of runtime.ray.actor_resources / "
        "trainer_resources), free resources held by other jobs, or runtime.ray.placement: none."
    )
