"""Placement groups for the Generation Units and the Training Unit (`asp.runtime.placement`).

Pure: the bundles of each unit from a config (zero amounts left out, a unit that asks for nothing gets no
group, ``placement: none`` none at all). On the session's local Ray cluster (4 CPUs) with CPU bundles: one
group per GU plus the Training Unit's, each generation actor inside its GU's group at its own bundle (checked
from inside the actor), groups removed afterwards; a group that cannot be placed raises `UserError` within
``stall_timeout_s`` and leaves nothing reserved; a `run_async` run with ``placement: pack`` over two GUs.
"""

from __future__ import annotations

import functools
import sys
import time

import pytest
from pydantic import ValidationError
from ray import cloudpickle as ray_cloudpickle

from asp.errors import UserError
from asp.runtime import run_async
from asp.runtime.config import RuntimeConfig
from asp.runtime.engines import EngineSpec
from asp.runtime.placement import (
    TRAINER,
    Placement,
    bundle,
    create_placement,
    gu_bundles,
    trainer_bundles,
    trainer_ranks,
    unit_bundles,
)
from asp.trainers import SimulatedTrainer

from .helpers import fast_config, make_plan, read_ledger

# ---- pure: bundles from a config ------------------------------------------------------------------------------


def test_bundle_leaves_out_zero_amounts():
    assert bundle(0.5, 0.0) == {"CPU": 0.5}
    assert bundle(0.0, 2.0) == {"GPU": 2.0}
    assert bundle(1.0, 1.0) == {"CPU": 1.0, "GPU": 1.0}
    assert bundle(0.0, 0.0) == {}  # Ray refuses such a bundle: its unit gets no group


def test_trainer_ranks_follow_the_grpo_world_size():
    assert trainer_ranks(RuntimeConfig(grpo={"world_size": 4}, trainer={"kind": "grpo"})) == 4
    assert trainer_ranks(RuntimeConfig(trainer={"kind": "simulated"})) == 1
    # the simulated trainer runs on one rank: params validation refuses a grpo.world_size > 1 beside it, so a
    # config that would ask trainer_ranks for more than one simulated rank cannot be built
    with pytest.raises(ValidationError, match="'simulated' runs on one rank"):
        RuntimeConfig(grpo={"world_size": 4}, trainer={"kind": "simulated"})
    declared = functools.partial(SimulatedTrainer, 0.0, 0.0)
    declared.world_size = 2  # a factory that says how many ranks it starts wins (build_training_unit uses it)
    assert trainer_ranks(RuntimeConfig(trainer={"kind": "grpo"}), declared) == 2
    assert trainer_ranks(RuntimeConfig(grpo={"world_size": 3}, trainer={"kind": "grpo"}), functools.partial(int)) == 3


def test_unit_bundles_one_group_per_gu_and_one_for_the_trainer():
    cfg = RuntimeConfig(
        ray={
            "generation_units": 2,
            "actors_per_unit": 3,
            "actor_num_cpus": 1,
            "actor_num_gpus": 1,
            "trainer_num_gpus": 2,
        }
    )
    assert gu_bundles(cfg) == [{"CPU": 1.0, "GPU": 1.0}] * 3
    assert trainer_bundles(cfg, 2) == [{"GPU": 2.0}] * 2
    assert unit_bundles(cfg, 2) == {
        "gu0": [{"CPU": 1.0, "GPU": 1.0}] * 3,
        "gu1": gu_bundles(cfg),
        TRAINER: [{"GPU": 2.0}] * 2,
    }


def test_units_asking_for_nothing_get_no_group():
    demo = RuntimeConfig()  # the demo: actors 0.5 CPU, trainer 0 CPU / 0 GPU
    assert unit_bundles(demo, 1) == {"gu0": [{"CPU": 0.5}, {"CPU": 0.5}]}
    free = RuntimeConfig(ray={"actor_num_cpus": 0, "trainer_num_cpus": 0})
    assert unit_bundles(free, 1) == {}
    assert unit_bundles(RuntimeConfig(ray={"placement": "none", "trainer_num_cpus": 1}), 1) == {}


def test_without_groups_the_options_are_empty():
    placement = Placement()
    assert placement.actor_options(0, 1) == placement.trainer_options(0) == placement.unit_options(0) == {}
    assert placement.describe() == {}
    placement.remove()  # nothing to remove


# ---- on the local cluster ----------------------------------------------------------------------------------


def asp_groups() -> dict[str, str]:
    """Name -> state of every placement group this project created in the session (removed ones included)."""
    from ray.util import placement_group_table

    return {g["name"]: g["state"] for g in placement_group_table().values() if g["name"].startswith("asp-")}


def wait_removed(names: set[str], timeout_s: float = 10.0) -> dict[str, str]:
    """The states of `names` once all are REMOVED (removal is asynchronous) or the timeout passed."""
    deadline = time.monotonic() + timeout_s
    while True:
        states = {n: s for n, s in asp_groups().items() if n in names}
        if all(s == "REMOVED" for s in states.values()) or time.monotonic() > deadline:
            return states
        time.sleep(0.1)


class Probe:
    """Reports the placement group and node it runs in."""

    def where(self) -> tuple[str | None, str]:
        import ray

        ctx = ray.get_runtime_context()
        return ctx.get_placement_group_id(), ctx.get_node_id()


ray_cloudpickle.register_pickle_by_value(sys.modules[__name__])  # Probe travels by value: tests/ is not importable


def test_each_actor_lands_in_its_units_group(ray_cluster):
    ray = ray_cluster
    cfg = fast_config(ray={"generation_units": 2, "actors_per_unit": 2, "actor_num_cpus": 0.5, "trainer_num_cpus": 1})
    before = set(asp_groups())
    placement = create_placement(cfg, trainer_ranks(cfg))
    created = set(asp_groups()) - before
    probe, handles = ray.remote(Probe), []
    try:
        assert set(placement.groups) == {"gu0", "gu1", TRAINER}
        assert len(created) == 3 and all(asp_groups()[n] == "CREATED" for n in created)
        nodes = placement.describe()  # unit -> node of each bundle, from Ray's placement group table
        assert {unit: len(bundle_nodes) for unit, bundle_nodes in nodes.items()} == {"gu0": 2, "gu1": 2, TRAINER: 1}
        # each actor asks for its whole bundle: two actors given the same bundle could not both start
        for g, i in [(0, 0), (0, 1), (1, 0), (1, 1)]:
            assert placement.actor_options(g, i)["scheduling_strategy"].placement_group_bundle_index == i
            handles.append(probe.options(num_cpus=0.5, **placement.actor_options(g, i)).remote())
        handles.append(probe.options(num_cpus=1, **placement.trainer_options(0)).remote())
        handles.append(probe.options(num_cpus=0, **placement.unit_options(1)).remote())
        where = ray.get([h.where.remote() for h in handles], timeout=30)
        expected = [("gu0", 0), ("gu0", 1), ("gu1", 0), ("gu1", 1), (TRAINER, 0), ("gu1", 0)]
        for (group_id, node), (unit, index) in zip(where, expected, strict=True):
            assert group_id == placement.groups[unit].id.hex()
            assert node == nodes[unit][index]
    finally:
        for handle in handles:
            ray.kill(handle)
        placement.remove()
    assert placement.groups == {}
    assert set(wait_removed(created).values()) == {"REMOVED"}


@pytest.mark.parametrize(("placement", "strategy"), [("pack", "PACK"), ("spread", "SPREAD")])
def test_the_groups_use_the_configured_strategy(ray_cluster, placement, strategy):
    from ray.util import placement_group_table

    made = create_placement(fast_config(ray={"placement": placement, "actors_per_unit": 3}), 1)
    try:
        table = placement_group_table(made.groups["gu0"])
        assert table["strategy"] == strategy and list(table["bundles"].values()) == [{"CPU": 0.25}] * 3
    finally:
        made.remove()


def test_placement_none_makes_no_group(ray_cluster):
    before = asp_groups()
    placement = create_placement(fast_config(ray={"placement": "none", "trainer_num_cpus": 1}), 1)
    assert placement.groups == {} and asp_groups() == before


@pytest.mark.parametrize(
    ("overrides", "unit", "bundles"),
    [
        ({"actor_num_cpus": 8}, "gu0", "[{'CPU': 8.0}, {'CPU': 8.0}]"),  # more than the 4 CPUs of the node
        ({"trainer_num_gpus": 1}, TRAINER, "[{'GPU': 1.0}]"),  # a GPU on a CPU-only cluster
    ],
)
def test_a_group_that_cannot_be_placed_is_refused_quickly(ray_cluster, overrides, unit, bundles):
    cfg = fast_config(ray=overrides, control={"stall_timeout_s": 1.0})
    before = set(asp_groups())
    start = time.monotonic()
    with pytest.raises(UserError, match="could not place") as info:
        create_placement(cfg, 1)
    assert time.monotonic() - start < 10
    message = str(info.value)
    assert f"{unit} with bundles {bundles}" in message and "'CPU': 4.0" in message
    assert "runtime.ray.placement: none" in message and "stall_timeout_s" in message
    created = set(asp_groups()) - before
    assert created and set(wait_removed(created).values()) == {"REMOVED"}  # the placeable ones too


def test_run_async_packs_two_units_and_removes_their_groups(ray_cluster, tmp_path):
    plan, prompts = make_plan(8, 3)
    cfg = fast_config(ray={"generation_units": 2, "actors_per_unit": 2, "placement": "pack"})
    before = set(asp_groups())
    seen: list[dict[str, str]] = []
    summary = run_async(
        plan,
        prompts,
        EngineSpec("standin"),
        cfg,
        trainer_factory=functools.partial(SimulatedTrainer, 0.0, 0.0, str(tmp_path / "ledger.jsonl")),
        on_iteration=lambda cu, metrics: seen.append({n: s for n, s in asp_groups().items() if n not in before}),
    )
    assert summary.metrics["runtime/summary/prompts_trained"] == 24
    assert sorted(p for line in read_ledger(tmp_path / "ledger.jsonl") for p in line["prompt_ids"]) == list(range(24))
    assert seen and sorted(seen[0].values()) == ["CREATED", "CREATED"]  # one group per GU, none for a 0-CPU trainer
    assert set(wait_removed(set(seen[0])).values()) == {"REMOVED"}
