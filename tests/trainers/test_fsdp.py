"""The GRPO Training Unit on several ranks (FSDP2 over gloo on the CPU): two ranks forked with torch.multiprocessing
train the tiny Qwen2 and must match one rank exactly (loss, weights after AdamW, the exported snapshot); a sharded
(DCP) checkpoint of two ranks resumes on one rank and on two ranks with the same weights and step; a two-rank launch
through the runtime (slow); and the factory's refusal of several ranks with the simulated trainer."""

from __future__ import annotations

import dataclasses
import os
import pickle
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp
from pydantic import ValidationError

from asp.config import GRPOParams
from asp.rollout.hf import HFEngine
from asp.runtime import RuntimeConfig
from asp.runtime.generation import resolve_weights
from asp.runtime.trainer import free_port
from asp.trainers import make_trainer_factory
from asp.trainers.distributed import split_micro_batches
from asp.trainers.grpo import GRPOSpec
from tests.trainers.test_grpo import batch_from, spec

ATOL = 1e-6


def two_rank_spec(base: GRPOSpec, **grpo) -> GRPOSpec:
    return dataclasses.replace(base, config=base.config.model_copy(update={"world_size": 2, **grpo}))


def variant(base: GRPOSpec, snapshots: Path, **grpo) -> GRPOSpec:
    """`base` with other knobs, no checkpoints, snapshots as files in `snapshots`."""
    config = base.config.model_copy(update={"snapshot_dir": str(snapshots), **grpo})
    return dataclasses.replace(base, config=config, state_dir=None)


def _rank_main(rank: int, port: int, fsdp_spec: GRPOSpec, batches: list, out: str) -> None:
    """One rank: two steps (checkpoint after each), then a fresh trainer resumes step 1 and redoes step 2."""
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=2)
    try:
        trainer = fsdp_spec()
        first, second = trainer.step(batches[0]), trainer.step(batches[1])
        after_two = trainer.full_weights()
        again = fsdp_spec()
        again.restore(first.state)
        redo = again.step(batches[1])
        redone = again.full_weights()
        variants = {}
        for name, knobs in (
            ("checkpointing", {"activation_checkpointing": True}),
            ("bf16", {"mixed_precision": "bfloat16"}),
        ):
            trainer = variant(fsdp_spec, Path(out).with_name(name), **knobs)()
            variants[name] = (trainer.step(batches[0]).metrics["train/loss"], trainer.full_weights())
        if rank == 0:
            keep = ("version", "metrics", "state", "weights")
            results = [{k: getattr(r, k) for k in keep} for r in (first, second, redo)]
            for r in results:
                r["weights"] = resolve_weights(r["weights"].payload) if r["weights"] is not None else None
            saved = {"results": results, "after_two": after_two, "redone": redone, "variants": variants}
            Path(out).write_bytes(pickle.dumps(saved))
    finally:
        torch.distributed.destroy_process_group()


@pytest.fixture(scope="module")
def two_ranks(tiny_qwen, tmp_path_factory):
    """The 1-rank spec, the two batches and the 2-rank run's results (one spawn for all the tests)."""
    tmp = tmp_path_factory.mktemp("fsdp")
    engine = HFEngine(tiny_qwen, num_threads=1, device="cpu", dtype="auto")
    batches = [batch_from(engine, step=s, seed=s, ids=(0, 1, 2, 5)) for s in (1, 2)]
    one = spec(tiny_qwen, tmp / "one", micro_batch_tokens=40)
    out = tmp / "out.pkl"
    # fork: the ranks start in 0.1 s (spawn re-imports torch + transformers: 40 s on 2 cores); they never touch the
    # session's Ray (files transport), use one thread, and leave through os._exit
    two_spec = two_rank_spec(spec(tiny_qwen, tmp / "two", micro_batch_tokens=40, transport="files"))
    mp.start_processes(_rank_main, args=(free_port(), two_spec, batches, str(out)), nprocs=2, start_method="fork")
    return one, batches, pickle.loads(out.read_bytes()), tmp


def assert_same_weights(a: dict, b: dict) -> None:
    assert sorted(a) == sorted(b)
    for name, tensor in a.items():
        torch.testing.assert_close(b[name], tensor, atol=ATOL, rtol=0, msg=name)


def test_two_ranks_train_like_one(two_ranks):
    one_spec, batches, two, _ = two_ranks
    one = one_spec()
    for k, batch in enumerate(batches):
        r1, r2 = one.step(batch), two["results"][k]
        # the micro-batches are split over the ranks (an odd count: one rank pads with a dummy pass)
        assert r2["metrics"]["train/micro_batches"] == r1.metrics["train/micro_batches"] >= 3
        for key in ("train/loss", "train/grad_norm", "train/ratio_mean", "train/response_tokens", "train/reward_mean"):
            assert r2["metrics"][key] == pytest.approx(r1.metrics[key], rel=1e-5, abs=1e-7), key
        assert r2["version"] == r1.version == k + 1
        # the exported snapshot (gathered by rank 0) is the 1-rank model's weights after the same AdamW steps
        assert_same_weights(one.model.state_dict(), r2["weights"])
    assert_same_weights(one.model.state_dict(), two["after_two"])


def test_activation_checkpointing_and_bf16_mixed_precision(two_ranks, tmp_path):
    one_spec, batches, two, _ = two_ranks
    first = two["results"][0]
    # recomputing each decoder layer in backward changes nothing, on one rank and on two (FSDP2)
    loss, weights = two["variants"]["checkpointing"]
    assert loss == pytest.approx(first["metrics"]["train/loss"], rel=1e-6)
    assert_same_weights(first["weights"], weights)
    one = variant(one_spec, tmp_path, activation_checkpointing=True)()
    assert one.step(batches[0]).metrics["train/loss"] == pytest.approx(loss, rel=1e-6)
    assert_same_weights(first["weights"], one.model.state_dict())
    # FSDP2's bf16 parameters in compute (fp32 master weights and reduction): close to fp32, and the weights fp32
    loss, weights = two["variants"]["bf16"]
    assert loss == pytest.approx(first["metrics"]["train/loss"], rel=0.05, abs=1e-3)
    assert all(t.dtype == torch.float32 for t in weights.values())


def test_sharded_checkpoint_resumes_on_one_and_on_two_ranks(two_ranks):
    one_spec, batches, two, tmp = two_ranks
    first, second, redo = two["results"]
    step1 = Path(first["state"]["checkpoint"])
    assert first["state"]["checkpoint_step"] == 1 and step1 == tmp / "two" / "trainer" / "step-00000001"
    files = sorted(p.name for p in step1.iterdir())
    assert files == [
        ".metadata",
        "__0_0.distcp",
        "__1_0.distcp",
        "manifest.json",
        "model.safetensors",
        "rng.safetensors",
        "trainer.json",
    ]
    # two ranks resumed from step 1 redo step 2 exactly
    assert redo["version"] == second["version"] == 2 and redo["state"]["checkpoint_step"] == 2
    assert redo["metrics"]["train/loss"] == pytest.approx(second["metrics"]["train/loss"], rel=1e-6)
    assert_same_weights(two["after_two"], two["redone"])
    # one rank resumes the 2-rank checkpoint (DCP reshards): the same weights, then the same step 2
    one = one_spec()
    update = one.restore(first["state"])
    assert one.version == update.version == 1
    assert_same_weights(first["weights"], one.model.state_dict())
    result = one.step(batches[1])
    assert result.metrics["train/loss"] == pytest.approx(second["metrics"]["train/loss"], rel=1e-5)
    assert_same_weights(two["after_two"], one.model.state_dict())


def test_split_micro_batches_pads_ranks_with_dummy_passes():
    plans = [[0], [1, 2], [3], [4, 5], [6]]
    assert split_micro_batches(plans, 0, 2) == [[0], [3], [6]]
    assert split_micro_batches(plans, 1, 2) == [[1, 2], [4, 5], None]  # one dummy pass: 3 passes each
    assert split_micro_batches([], 1, 2) == []
    assert split_micro_batches(plans, 0, 1) == plans


def test_rank_settings_that_cannot_work_are_refused_by_the_params():
    """The runtime params refuse them (tests/test_config.py: `asp params check` exits 2 naming the keys)."""
    with pytest.raises(ValidationError, match="world_size = 2 but runtime.trainer.kind = 'simulated'"):
        RuntimeConfig(iterations=5, grpo=GRPOParams(world_size=2), trainer={"kind": "simulated"})
    assert RuntimeConfig(iterations=5, grpo=GRPOParams(world_size=2), trainer={"kind": "grpo"}).grpo.world_size == 2
    for knobs, match in (({"cpu_offload": True}, "cpu_offload needs a CUDA device"), ({"backend": "nccl"}, "nccl")):
        with pytest.raises(ValidationError, match=match):
            RuntimeConfig(iterations=5, grpo=GRPOParams(**knobs))
        assert RuntimeConfig(
            iterations=5, grpo=GRPOParams(**knobs), trainer={"kind": "simulated"}
        )  # unused: not checked
        assert RuntimeConfig(iterations=5, grpo=GRPOParams(**knobs, device="cuda"))


@pytest.mark.slow
def test_two_rank_launch_trains_every_prompt_once(ray_cluster, tiny_qwen, tmp_path):
    from asp.runtime import EngineSpec, run_async
    from tests.runtime.helpers import fast_config, make_plan

    plan, prompts = make_plan(40, 2)  # 80 prompts, 4 per global batch: 20 steps
    grpo = GRPOParams(world_size=2, lr=2e-2, warmup_steps=0, micro_batch_tokens=64)
    cfg = fast_config(
        global_batch_prompts=4, grpo=grpo, sampling={"n_samples": 4, "max_new_tokens": 6}, queue={"q_max": 8}
    )
    trainer = make_trainer_factory(
        "grpo",
        cfg,
        policy_path=tiny_qwen,
        prompts=prompts,
        answers=dict.fromkeys(prompts, "x"),
        grpo=grpo,
        reward="tests.trainers.test_grpo:share_of_w_words",
        state_dir=tmp_path / "state",
    )
    engine = EngineSpec("hf", str(tiny_qwen), {"device": "cpu", "dtype": "float32", "num_threads": 1})
    summary = run_async(plan, prompts, engine, cfg, trainer_factory=trainer, checkpoint_dir=tmp_path / "ck")
    its = summary.iterations
    assert [it["step"] for it in its] == list(range(1, 21)) and summary.policy_version == 20
    assert sum(it["train/prompts"] for it in its) == 80 and all(np.isfinite(it["train/loss"]) for it in its)
    ingested = Counter(r["minibatch_id"] for r in summary.minibatches)
    assert sorted(ingested) == list(range(40)) and set(ingested.values()) == {1}  # each minibatch once ...
    assert sum(r["prompts"] for r in summary.minibatches) == 80  # ... whole, and every prompt trained once
    assert not any(r["reload_error"] for r in summary.minibatches)
    assert max(r["policy_version"] for r in summary.minibatches) >= 10  # the actors loaded rank 0's snapshots
    assert sorted(p.name for p in (tmp_path / "state" / "trainer").iterdir())[-1] == "step-00000020"


@pytest.mark.slow
@pytest.mark.extended  # two ranks as Ray actors in a run: test_two_rank_launch_trains_every_prompt_once (CI); their
# sharded checkpoint restored on one and on two ranks: test_sharded_checkpoint_resumes_on_one_and_on_two_ranks (CI)
def test_training_unit_ranks_as_ray_actors(ray_cluster, two_ranks, tiny_qwen, tmp_path):
    # the runtime's view: one leader handle; it forwards step / restore to rank 1; teardown kills both ranks
    from asp.runtime.run import teardown
    from asp.runtime.trainer import build_training_unit
    from tests.runtime.helpers import fast_config

    _, batches, two, _ = two_ranks
    reward = "tests.trainers.test_grpo:share_of_w_words"  # imported by the rank actors
    factory = two_rank_spec(spec(tiny_qwen, tmp_path, reward=reward, micro_batch_tokens=40))
    leader, ranks = build_training_unit(fast_config(), factory)
    try:
        assert len(ranks) == 2 and ranks[0] == leader and ray_cluster.get(leader.ready.remote()) is None
        first = ray_cluster.get(leader.step.remote(batches[0]))
        second = ray_cluster.get(leader.step.remote(batches[1]))
        assert second.metrics["train/loss"] == pytest.approx(two["results"][1]["metrics"]["train/loss"], rel=1e-6)
        update = ray_cluster.get(leader.restore.remote(first.state))
        assert update.version == 1
        assert_same_weights(resolve_weights(update.payload), resolve_weights(first.weights.payload))
        again = ray_cluster.get(leader.step.remote(batches[1]))
        assert again.version == 2 and again.metrics["train/loss"] == pytest.approx(second.metrics["train/loss"])
    finally:
        teardown([], {}, leader)
    with pytest.raises(ray_cluster.exceptions.RayActorError):
        ray_cluster.get(ranks[1].ready.remote(), timeout=30)
