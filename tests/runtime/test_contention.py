"""The sharing probe (asp.runtime.contention): real engines and the real GRPO Training Unit on the shared local Ray,
and the pure arithmetic of its table and batch."""

from __future__ import annotations

import numpy as np
import pytest

from asp.config import GRPOParams
from asp.control.messages import MinibatchOutput
from asp.rollout.base import SamplingParams
from asp.runtime import EngineSpec
from asp.runtime.contention import (
    call_shape,
    calls_for_steps,
    probe_batch,
    probe_sharing,
    seconds_per_decode_step,
    slowdown_rows,
)
from asp.sim.sharing import ContentionTable
from asp.trainers import make_trainer_factory

from .helpers import fast_config


def output(task: int, prompts: int, n: int, length: int) -> MinibatchOutput:
    """A completed minibatch of `prompts` prompts x `n` samples of `length` tokens (token id = task)."""
    s = prompts * n
    return MinibatchOutput(
        task_id=task, minibatch_id=task, attempt=0, gu=0, actor=task, policy_version=0,
        prompt_ids=list(range(prompts)), n=n, lengths=np.full(s, length, np.int32), stopped=np.ones(s, bool),
        token_ids=np.full(s * length, task, np.int32), logprobs=np.zeros(s * length, np.float32),
        prompt_tokens=np.full(prompts, 3, np.int32), texts=[f"t{task}"] * s, gen_start=0.0, gen_end=1.0,
    )  # fmt: skip


def test_probe_batch_takes_prompts_in_order_and_cycles():
    outs = [output(0, 3, 2, 4), output(1, 0, 2, 4), output(2, 2, 2, 5)]
    batch = probe_batch(outs, 7)  # 3 of task 0, 2 of task 2, then 2 of task 0 again; task 1 holds none
    assert batch.num_prompts == 7 and batch.n == 2 and batch.step == 1
    assert batch.task_ids.tolist() == [0, 0, 0, 2, 2, 0, 0]
    assert batch.lengths.tolist() == [4] * 6 + [5] * 4 + [4] * 4
    assert batch.token_ids.size == 6 * 4 + 4 * 5 + 4 * 4 and batch.sample_offsets[-1] == batch.token_ids.size
    assert batch.sample_tokens(6).tolist() == [2] * 5 and len(batch.texts) == 14
    assert probe_batch(outs, 2).task_ids.tolist() == [0, 0]
    with pytest.raises(ValueError, match="need prompts >= 1"):
        probe_batch([output(1, 0, 2, 4)], 2)
    with pytest.raises(ValueError, match="need prompts >= 1"):
        probe_batch(outs, 0)


def test_slowdown_rows_are_medians_of_the_ratios_to_the_baselines():
    measured = {  # seconds; the baselines: a call alone 1.1 s, a step alone 0.5 s
        (1, False): ([1.0, 1.2, 1.1], []),
        (1, True): ([1.1, 1.3, 1.2], [0.5, 0.6, 0.7]),
        (2, False): ([1.3, 1.1, 1.2], []),
        (2, True): ([2.4, 2.2, 2.0], [0.9, 1.0, 1.1]),
    }
    ratios = {key: ([c / 1.1 for c in calls], [s / 0.5 for s in steps]) for key, (calls, steps) in measured.items()}
    gen, train = slowdown_rows(ratios)
    assert [v for row in gen for v in row] == pytest.approx([1.0, 1.2 / 1.1, 1.2 / 1.1, 2.2 / 1.1])
    assert train == pytest.approx([1.2, 2.0])
    with pytest.raises(ValueError, match="every engine count from 1"):
        slowdown_rows({(2, False): ([1.0], []), (2, True): ([1.0], [1.0])})
    with pytest.raises(ValueError, match="no training step ran while 1 engines"):
        slowdown_rows({(1, False): ([1.0], []), (1, True): ([1.0], [])})


def test_a_calls_time_per_decode_step_and_its_shape():
    out = output(0, 3, 2, 4)  # 1 s, 3 prompts x 2 samples of 4 tokens: 4 decode steps
    out.lengths[1] = 8
    assert seconds_per_decode_step(out) == 0.125  # the longest response sets the steps
    shape = call_shape(out)
    assert shape == {"seconds": 1.0, "prompts": 3.0, "responses": 6.0, "tokens": 28.0, "max_length": 8.0,
                     "prompt_tokens": 9.0}  # fmt: skip
    out.lengths[:] = 0
    assert seconds_per_decode_step(out) == 1.0  # no decode step: the call's time


def test_calls_beside_the_load_cover_its_steps():
    # 0.5 s calls, 1.4 s steps: 6 steps + 2 at the edges = 11.2 s -> 23 calls; short steps: `steps` calls at least
    assert calls_for_steps(0.5, 1.4, 6) == 23
    assert calls_for_steps(2.0, 0.1, 6) == 6
    with pytest.raises(ValueError, match="positive times"):
        calls_for_steps(0.0, 1.0, 3)


@pytest.mark.slow
def test_probe_measures_real_engines_beside_the_grpo_training_unit(ray_cluster, tiny_qwen):
    engine = EngineSpec("hf", str(tiny_qwen), {"device": "cpu", "dtype": "float32", "num_threads": 1})
    sampling = SamplingParams(n=4, max_new_tokens=24, temperature=1.0, top_p=1.0, seed=0)
    prompts = ["w1 w2 w3", "w4 w5", "w6 w7 w8 w9"]
    cfg = fast_config(global_batch_prompts=4, sampling={"n_samples": 4, "max_new_tokens": 24})
    trainer = make_trainer_factory(
        "grpo",
        cfg,
        policy_path=tiny_qwen,
        prompts=dict(enumerate(prompts)),
        answers=dict.fromkeys(range(3), "x"),
        grpo=GRPOParams(micro_batch_tokens=256).model_copy(update={"lr": 0.0}),
        reward="tests.trainers.test_grpo:share_of_w_words",
    )
    result = probe_sharing(cfg, engine, sampling, prompts, trainer, max_engines=2, repeats=3, seed=0)
    assert result["engines"] == 2 and result["repeats"] == 3
    assert result["generation_slowdown"][0][0] == 1.0  # one engine alone is the baseline
    assert len(result["generation_slowdown"]) == len(result["training_slowdown"]) == 2
    assert result["alone_call_s"] > 0 and result["alone_step_s"] > 0
    assert all(v > 0 for row in result["generation_slowdown"] for v in row)
    ratios = result["rounds_ratios"]  # every setting against its own round's baselines, in 3 rounds
    assert set(ratios) == {"1", "1+training", "2", "2+training"}
    assert ratios["1"]["calls"] == [1.0] * 3 and len(ratios["2"]["calls"]) == 3 * 2
    assert len(ratios["1+training"]["steps"]) >= 1
    assert len(result["alone_calls"]) == 3 and result["alone_calls"][0]["responses"] == 12  # 3 prompts x 4
    load = result["training_load"]  # the real step on the engines' own samples: 4 prompts x 4 of them
    assert load["prompts"] == 4 and load["sequences"] == 16 and 16 <= load["response_tokens"] <= 16 * 24
    table = ContentionTable.from_dict(result)  # what simulate.sharing: measured reads
    assert len(table.generation) == 2
