"""Pinning units to nodes by custom Ray resources (``runtime.ray.actor_resources`` / ``trainer_resources``), pure
parts.

The bundles carry the custom resources next to CPUs / GPUs (so a unit's placement group lands only on nodes that
have them); with ``placement: none`` each actor asks for them itself; a cluster without enough of them is refused
before any actor starts, naming the resource and the ``ray start --resources`` that provides it. The multi-node
runs are in test_multinode.py.
"""

from __future__ import annotations

import pytest

from asp.errors import UserError
from asp.runtime.cluster import check_custom_resources, directory_problem
from asp.runtime.config import RuntimeConfig
from asp.runtime.placement import TRAINER, Placement, bundle, loose_resources, unit_bundles


def test_bundles_carry_the_custom_resources():
    assert bundle(0.5, 0.0, {"rollout": 0.5, "zero": 0.0}) == {"CPU": 0.5, "rollout": 0.5}
    cfg = RuntimeConfig(
        ray={
            "generation_units": 2,
            "actors_per_unit": 2,
            "actor_num_cpus": 0.5,
            "actor_resources": {"rollout": 0.5},
            "trainer_resources": {"train": 1.0},
        }
    )
    assert unit_bundles(cfg, 1) == {
        "gu0": [{"CPU": 0.5, "rollout": 0.5}] * 2,
        "gu1": [{"CPU": 0.5, "rollout": 0.5}] * 2,
        TRAINER: [{"train": 1.0}],  # trainer_num_cpus 0: the custom resource alone gives it a group
    }
    assert loose_resources(cfg) == {}  # in the bundles, not on the actors


def test_defaults_are_unchanged():
    assert RuntimeConfig().ray.actor_resources is None and RuntimeConfig().ray.trainer_resources is None
    assert unit_bundles(RuntimeConfig(), 1) == {"gu0": [{"CPU": 0.5}, {"CPU": 0.5}]}


def test_without_groups_each_actor_asks_for_its_custom_resources():
    cfg = RuntimeConfig(
        ray={"placement": "none", "actor_resources": {"rollout": 1.0}, "trainer_resources": {"train": 2.0}}
    )
    assert unit_bundles(cfg, 1) == {}
    placement = Placement(loose=loose_resources(cfg))
    assert placement.actor_options(0, 1) == {"resources": {"rollout": 1.0}}
    assert placement.trainer_options(0) == {"resources": {"train": 2.0}}
    assert Placement().actor_options(0, 0) == {}  # nothing asked: nothing added


def test_missing_custom_resources_are_refused_naming_them():
    cfg = RuntimeConfig(ray={"generation_units": 2, "actors_per_unit": 2, "actor_resources": {"rollout": 0.5}})
    check_custom_resources(cfg, {"CPU": 4.0, "rollout": 2.0})  # 4 actors x 0.5: enough
    with pytest.raises(UserError, match=r"needs 2 of the custom Ray resource 'rollout'.*has 1\b.*--resources"):
        check_custom_resources(cfg, {"CPU": 4.0, "rollout": 1.0})
    grpo = RuntimeConfig(grpo={"world_size": 2}, ray={"trainer_resources": {"train": 1.0}}, trainer={"kind": "grpo"})
    with pytest.raises(UserError, match=r"needs 2 of the custom Ray resource 'train'.*x 2 trainer ranks.*has 0"):
        check_custom_resources(grpo, {"CPU": 4.0})


def test_an_actor_outside_the_project_directory_is_named():
    here = ("/shared/asp", "a" * 56)
    assert directory_problem("/shared/asp", {"generation actor 0": here, "Training Unit rank 0": here}) is None
    away = ("/home/ray", "b" * 56)  # work_in found no /shared/asp on that node and stayed where Ray started it
    message = directory_problem("/shared/asp", {"generation actor 0": here, "Training Unit rank 0": away})
    assert message is not None
    assert message.startswith("1 of the runtime's actors (Training Unit rank 0) run on Ray node(s) bbbbbbbbbbbb ")
    assert "project directory /shared/asp does not exist" in message and "same path on every node" in message


def test_the_cli_says_why_a_run_stopped_in_one_line(monkeypatch, capsys):
    from asp.cli import commands
    from asp.control.core import RuntimeFailure

    message = "no generation unit is left: generation unit 1 was lost (its node 4f2a... died)"

    def lost(**_):
        raise RuntimeFailure(message)

    monkeypatch.setattr(commands, "app", lost)
    with pytest.raises(SystemExit) as stopped:
        commands.main([])
    assert stopped.value.code == 1
    assert (
        capsys.readouterr().err
        == "error: no generation unit is left: generation unit 1 was lost (its node 4f2a... died)\n"
    )

    def bug(**_):
        raise RuntimeError("a bug")

    monkeypatch.setattr(commands, "app", bug)
    with pytest.raises(RuntimeError, match="a bug"):  # anything else keeps its traceback
        commands.main([])
