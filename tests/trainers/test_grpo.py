"""The GRPO trainer in one process (no Ray): real tiny Qwen2 generations through the HF engine, weight flow
into the engine, checkpoints (a damaged one named, the previous one restoring), NaN and reward failures, the lag
monitor, and the trainer factory's checks."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from asp.config import GRPOParams
from asp.control.messages import WeightUpdate
from asp.errors import UserError
from asp.rl import register_reward
from asp.rollout.base import SamplingParams
from asp.rollout.hf import HFEngine
from asp.runtime import RuntimeConfig, TrainingQueue, WorkItem
from asp.runtime.generation import GenerationActor, pack_output, resolve_weights
from asp.trainers import SimulatedTrainer, make_trainer_factory
from asp.trainers.grpo import GRPOSpec, LagMonitor, NonFiniteLossError
from asp.trainers.weights import latest_checkpoint
from tests.runtime.helpers import output

N = 4
PROMPTS = {i: " ".join(f"w{(3 * i + j) % 40}" for j in range(i % 3 + 2)) for i in range(8)}


def share_of_w_words(response: str, answer: str) -> float:
    """Share of the response's words that are "w<k>" words (about 40 % for the random tiny model)."""
    words = response.split()
    return float(np.mean([w.startswith("w") for w in words])) if words else 0.0


def exploding(response: str, answer: str) -> float:
    if response.startswith("w1"):
        raise RuntimeError("verifier crashed")
    return 1.0


register_reward("test:share_w", share_of_w_words)
register_reward("test:exploding", exploding)


def spec(path, tmp_path=None, reward="test:share_w", **grpo) -> GRPOSpec:
    base = {"lr": 3e-3, "warmup_steps": 0, "loss_aggregation": "token", "micro_batch_tokens": 64}
    cfg = GRPOParams(**{**base, **grpo})
    return GRPOSpec(
        str(path),
        PROMPTS,
        dict.fromkeys(PROMPTS, "x"),
        cfg,
        reward,
        temperature=1.0,
        seed=0,
        checkpoint_interval=1,
        state_dir=str(tmp_path) if tmp_path else None,
    )


def batch_from(engine: HFEngine, step: int, version: int = 0, seed: int = 0, ids=(0, 1, 2, 3)):
    """Generate n = 4 responses for `ids` with the engine and cut them into one GlobalBatch."""
    item = WorkItem(step, step, 0, 0, list(ids), [PROMPTS[i] for i in ids], seed)
    results = engine.generate(item.prompts, SamplingParams(N, 6, 1.0, 1.0, seed))
    out = pack_output(item, results, N, gu=0, actor=0, version=version, start=0.0, end=0.5)
    queue = TrainingQueue(len(ids), N)
    queue.put(out, now=0.0)
    return queue.take(step, now=1.0)[0]


@pytest.fixture(scope="module")
def engine(tiny_qwen):
    return HFEngine(tiny_qwen, num_threads=1, device="cpu", dtype="auto")


def test_trainer_scores_like_the_engine_and_exports_loadable_weights(tiny_qwen, engine):
    trainer = spec(tiny_qwen)()
    batch = batch_from(engine, step=1)
    result = trainer.step(batch)
    m = result.metrics
    # same weights, same temperature: the trainer's log-probs equal the engine's behaviour log-probs (ratio 1)
    assert m["train/abs_log_ratio_mean"] < 1e-4 and m["train/ratio_mean"] == pytest.approx(1.0, abs=1e-4)
    assert m["train/prompt_token_mismatch"] == 0 and m["train/behaviour_logprobs_missing"] == 0
    assert result.version == trainer.version == 1 and np.isfinite(m["train/grad_norm"])
    assert m["train/response_tokens"] == batch.lengths.sum() and m["train/micro_batches"] >= 2  # 64-token budget
    # the object-store payload: the safetensors bytes, or their Ray ObjectRef when a Ray session is up (as after
    # the runtime tests); either way the engine loads them in place
    import ray

    expected = ray.ObjectRef if ray.is_initialized() else bytes
    assert isinstance(result.weights, WeightUpdate) and isinstance(result.weights.payload, expected)
    fresh = HFEngine(tiny_qwen, num_threads=1, device="cpu", dtype="auto")
    fresh.update_weights(resolve_weights(result.weights.payload))
    for name, tensor in trainer.model.state_dict().items():
        torch.testing.assert_close(fresh.model.state_dict()[name], tensor)
    # the engine now samples from the updated policy: its log-probs again match the trainer's (ratio 1)
    again = trainer.step(batch_from(fresh, step=2, version=1, seed=1))
    assert again.metrics["train/abs_log_ratio_mean"] < 1e-4 and again.metrics["train/lag_mean"] == 0.0


def test_grpo_steps_raise_the_reward_of_a_learnable_task(tiny_qwen):
    engine = HFEngine(tiny_qwen, num_threads=1, device="cpu", dtype="auto")
    trainer = spec(tiny_qwen, lr=2e-2, micro_batch_tokens=256)()
    rewards = []
    for step in range(1, 11):
        batch = batch_from(engine, step=step, version=trainer.version, seed=step, ids=tuple(range(8)))
        result = trainer.step(batch)
        rewards.append(result.metrics["train/reward_mean"])
        engine.update_weights(resolve_weights(result.weights.payload))
    # first vs last 3 of 10 steps (32 samples each step); measured: about 0.42 -> 0.8
    assert np.mean(rewards[-3:]) > np.mean(rewards[:3]) + 0.2, rewards


def test_files_transport_keeps_the_last_snapshots_and_a_corrupt_one_is_retried(tiny_qwen, engine, tmp_path):
    trainer = spec(tiny_qwen, tmp_path, transport="files", keep_snapshots=2)()
    results = [trainer.step(batch_from(engine, step=s, seed=s)) for s in (1, 2, 3)]
    snaps = sorted(p.name for p in (tmp_path / "snapshots").iterdir())
    assert snaps == ["snapshot-00000002.safetensors", "snapshot-00000003.safetensors"]
    assert results[-1].weights.payload.endswith("snapshot-00000003.safetensors")
    # a corrupt snapshot: the actor keeps its weights, reports the error, and loads the next good offer
    actor = GenerationActor(
        0,
        0,
        lambda: HFEngine(tiny_qwen, num_threads=1, device="cpu", dtype="auto"),
        SamplingParams(2, 3, 1.0, 1.0, seed=0),
    )
    before = {k: v.clone() for k, v in actor.engine.model.state_dict().items()}
    bad = tmp_path / "snapshots" / "snapshot-00000002.safetensors"
    bad.write_bytes(b"not a safetensors file")
    item = WorkItem(0, 0, 0, 0, [0], [PROMPTS[0]], seed=0)
    (out,) = actor.generate([item], WeightUpdate(2, str(bad)))
    assert out.policy_version == 0 and out.reload_error and out.reload_s == 0.0
    for name, tensor in actor.engine.model.state_dict().items():
        torch.testing.assert_close(tensor, before[name])
    (out,) = actor.generate([item], WeightUpdate(3, results[-1].weights.payload))
    assert out.policy_version == 3 and not out.reload_error and out.reload_s > 0
    missing = actor.generate([item], WeightUpdate(4, str(tmp_path / "gone.safetensors")))[0]
    assert missing.policy_version == 3 and "No such file" in missing.reload_error


def test_checkpoint_restore_continues_identically(tiny_qwen, engine, tmp_path):
    a = spec(tiny_qwen, tmp_path / "a")()
    batches = [batch_from(engine, step=s, seed=s) for s in (1, 2, 3)]
    a.step(batches[0])
    state = a.step(batches[1]).state
    assert (
        state["checkpoint_step"] == 2 and (tmp_path / "a" / "trainer" / "step-00000002" / "model.safetensors").exists()
    )
    b = spec(tiny_qwen, tmp_path / "b")()
    update = b.restore(state)
    assert b.version == a.version == 2 and update.version == 2 and update.payload is not None
    ra, rb = a.step(batches[2]), b.step(batches[2])  # same weights + AdamW moments -> the same update
    assert ra.metrics["train/loss"] == pytest.approx(rb.metrics["train/loss"], rel=1e-6)
    for (name, ta), tb in zip(a.model.state_dict().items(), b.model.state_dict().values(), strict=True):
        torch.testing.assert_close(ta, tb, msg=name)
    kept = sorted(p.name for p in (tmp_path / "a" / "trainer").iterdir())
    assert kept == ["step-00000002", "step-00000003"]  # keep_checkpoints = 2
    with pytest.raises(UserError, match="names no GRPO trainer checkpoint"):
        spec(tiny_qwen)().restore({"version": 3})


def test_damaged_checkpoint_is_named_and_the_previous_one_restores(tiny_qwen, engine, tmp_path):
    a = spec(tiny_qwen, tmp_path)()
    batches = [batch_from(engine, step=s, seed=s) for s in (1, 2)]
    first = [a.step(b) for b in batches]
    states = [r.state for r in first]
    root = tmp_path / "trainer"
    model = root / "step-00000002" / "model.safetensors"
    model.write_bytes(model.read_bytes()[:-4096])  # e.g. the disk filled up while it was copied
    assert latest_checkpoint(root) == root / "step-00000001"

    b = spec(tiny_qwen, tmp_path)()  # a resumed run on the same state directory
    before = {k: v.clone() for k, v in b.model.state_dict().items()}
    with pytest.raises(UserError, match=rf"{model} is [\d,]+ bytes, manifest.json records .*Delete that directory"):
        b.restore(states[1])
    for name, tensor in b.model.state_dict().items():
        torch.testing.assert_close(tensor, before[name])  # checked before loading: nothing half-loaded
    assert b.restore(states[0]).version == 1 and b.version == 1  # what the runtime falls back to
    (root / "step-00000009").mkdir()  # left over from an attempt the resume abandoned
    rb = b.step(batches[1])  # step 2 trained again from step 1's checkpoint: as the first time
    assert rb.metrics["train/loss"] == pytest.approx(first[1].metrics["train/loss"], rel=1e-6)
    assert sorted(p.name for p in root.iterdir()) == ["step-00000001", "step-00000002"]  # rewritten, 9 gone
    assert latest_checkpoint(root) == root / "step-00000002"
    with pytest.raises(UserError, match="is from step 2 but the runtime position that names it is at step 5"):
        spec(tiny_qwen)().restore({**rb.state, "step": 5})


def test_nan_loss_skips_the_step_and_stops_after_max_in_a_row(tiny_qwen, engine):
    trainer = spec(tiny_qwen, max_nan_steps=2)()
    good = batch_from(engine, step=1)
    weights = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    bad = batch_from(engine, step=1)
    bad.logprobs[:] = np.nan  # corrupt behaviour log-probs -> NaN ratio -> NaN loss
    skipped = trainer.step(bad)
    assert skipped.version == 0 and skipped.weights is None and skipped.metrics["train/nan_skipped_steps"] == 1
    for name, tensor in trainer.model.state_dict().items():
        torch.testing.assert_close(tensor, weights[name])  # nothing applied
    assert trainer.step(good).version == 1  # a good step resets the count
    trainer.step(bad)
    with pytest.raises(NonFiniteLossError, match="2 consecutive steps"):
        trainer.step(bad)


def test_a_reward_that_raises_gives_zero_and_is_counted(tiny_qwen, engine):
    trainer = spec(tiny_qwen, reward="test:exploding")()
    batch = batch_from(engine, step=1)
    result = trainer.step(batch)
    crashed = sum(t.startswith("w1") for t in batch.texts)
    assert result.metrics["train/reward_errors"] == crashed
    assert result.metrics["train/reward_mean"] == pytest.approx(1 - crashed / len(batch.texts))
    assert result.version == 1  # the run goes on


def test_lag_monitor_by_hand():
    # two minibatches: task 0 (gen 2 s, reload 0.5 s, arrived at depth 0) and task 1 (gen 4 s, no reload,
    # depth 1 batch); versions 3 and 2, trainer at version 4 -> lags 1 and 2 per prompt
    q = TrainingQueue(global_batch_prompts=2, n_samples=2)
    o0, o1 = output(0, ["a"], [1, 2], version=3), output(1, ["b"], [3, 1], version=2)
    o0.gen_end, o0.reload_s, o1.gen_end = 2.0, 0.5, 4.0
    q.put(o0, 0.0)
    q.put(o1, 1.0)  # depth before: 1 prompt = 0.5 batch
    batch, _ = q.take(1, 2.0)
    mon = LagMonitor()
    mon.t_train.append(2.0)
    mon.t_save.append(0.25)
    mon.t_convert.append(0.25)
    mon.observe(batch)
    mon.observe(batch)  # the same minibatches again (a split minibatch): counted once
    m = mon.metrics(4, batch)
    assert (m["train/lag_mean"], m["train/lag_max"]) == (1.5, 2.0)
    # d_off = Q + (0.25 + 0.25 + 0.5 + T_gen) / 2: task 0 -> 0 + 3 / 2 = 1.5; task 1 -> 0.5 + 5 / 2 = 3.0
    assert m["train/d_off_estimate_mean"] == pytest.approx(2.25) and m["train/d_off_estimate_max"] == 3.0
    assert m["train/t_load_s"] == 0.5 and m["train/t_gen_s"] == 3.0
    assert m["train/duty_cycle"] == pytest.approx(3.0 / 3.5)  # mean T_gen / (T_gen + T_load)
    assert m["train/duty_cycle_measured"] == pytest.approx(6.0 / 6.5)  # 6 s generating, 0.5 s reloading


def test_trainer_factory_checks_inputs(tiny_qwen, tmp_path):
    cfg = RuntimeConfig(iterations=5, trainer={"step_s": 0.1, "refresh_delay_s": 0.2})
    sim = make_trainer_factory("simulated", cfg)()
    assert isinstance(sim, SimulatedTrainer) and sim.step_time_s == 0.1
    factory = make_trainer_factory(
        "grpo",
        cfg,
        policy_path=tiny_qwen,
        prompts=PROMPTS,
        answers=PROMPTS,
        grpo=GRPOParams(lr_schedule="cosine", reward="auto"),
        dataset="data/dsr.json",
        state_dir=tmp_path,
    )
    assert isinstance(factory, GRPOSpec) and factory.reward == "math" and factory.total_steps == 5
    assert pickle.loads(pickle.dumps(factory)).config.lr_schedule == "cosine"  # travels to the Ray actor
    with pytest.raises(UserError, match="unknown"):
        make_trainer_factory("ppo", cfg)
    with pytest.raises(UserError, match="2 prompts have no reference answer"):
        make_trainer_factory("grpo", cfg, policy_path=tiny_qwen, prompts=PROMPTS, answers={i: "1" for i in range(6)})
    with pytest.raises(UserError, match=r"runtime\.grpo\.reward"):
        make_trainer_factory("grpo", cfg, policy_path=tiny_qwen, prompts=PROMPTS, answers=PROMPTS, reward="nope")
    with pytest.raises(UserError, match="does not exist"):
        make_trainer_factory("grpo", cfg, policy_path=tmp_path / "none", prompts=PROMPTS, answers=PROMPTS)
    with pytest.raises(ValidationError, match="clip_low\n  Input should be less than 1"):
        GRPOParams(clip_low=1.5)
    with pytest.raises(ValidationError, match="learning_rate\n  Extra inputs are not permitted"):
        GRPOParams(learning_rate=1.0)
    with pytest.raises(UserError, match="needs runtime.grpo.total_steps"):
        make_trainer_factory(
            "grpo",
            RuntimeConfig(iterations=None),
            policy_path=tiny_qwen,
            prompts=PROMPTS,
            answers=PROMPTS,
            grpo=GRPOParams(lr_schedule="linear"),
        )
