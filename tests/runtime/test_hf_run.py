"""A short real run: two generation actors each decoding with a tiny random Qwen2 through the HF engine."""

from __future__ import annotations

import functools

import pytest

from asp.runtime import EngineSpec, run_async
from asp.trainers import SimulatedTrainer

from .helpers import fast_config, make_plan, read_ledger


@pytest.mark.slow
def test_tiny_qwen_generation_with_simulated_trainer(ray_cluster, tiny_qwen, tmp_path):
    plan, prompts = make_plan(6, 2)  # 12 prompts of 2-6 words; batches of 4 prompts -> 3 steps
    engine = EngineSpec("hf", str(tiny_qwen), {"device": "cpu", "dtype": "float32", "num_threads": 1})
    cfg = fast_config(
        global_batch_prompts=4, sampling={"n_samples": 2, "max_new_tokens": 6, "temperature": 1.0}, queue={"q_max": 8}
    )
    ledger = tmp_path / "ledger.jsonl"
    summary = run_async(
        plan, prompts, engine, cfg, trainer_factory=functools.partial(SimulatedTrainer, 0.05, 0.01, str(ledger))
    )
    lines = read_ledger(ledger)
    assert sorted(pid for line in lines for pid in line["prompt_ids"]) == list(range(12))
    for line in lines:
        assert len(line["lengths"]) == 2 * len(line["prompt_ids"])  # n = 2 samples per prompt
        assert all(1 <= n <= 6 for n in line["lengths"])
        assert line["tokens"] == line["logprobs"] == sum(line["lengths"])
        assert line["logprob_max"] <= 0.0  # real behaviour log-probs
    m = summary.metrics
    assert m["runtime/summary/minibatches"] == 6 and m["runtime/summary/tokens_per_s"] > 0
    assert {r["actor"] for r in summary.minibatches} <= {0, 1}
    assert all(r["gen_s"] > 0 for r in summary.minibatches)
    assert 0.0 <= m["runtime/summary/padding_rate_mean"] < 1.0
