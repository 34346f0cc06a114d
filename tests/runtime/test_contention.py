"""The sharing probe (asp.runtime.contention): real engines and a real training load on the shared local Ray, and
the pure arithmetic of its table."""

from __future__ import annotations

import pytest

from asp.rollout.base import SamplingParams
from asp.runtime import EngineSpec
from asp.runtime.contention import TrainingLoadSpec, calls_for_steps, probe_sharing, slowdown_rows
from asp.sim.sharing import ContentionTable

from .helpers import fast_config


def test_slowdown_rows_are_medians_over_the_baselines():
    measured = {
        (1, False): ([1.0, 1.2, 1.1], []),
        (1, True): ([1.1, 1.3, 1.2], [0.5, 0.6, 0.7]),
        (2, False): ([1.3, 1.1, 1.2], []),
        (2, True): ([2.4, 2.2, 2.0], [0.9, 1.0, 1.1]),
    }
    gen, train = slowdown_rows(1.1, 0.5, measured)
    assert [v for row in gen for v in row] == pytest.approx([1.0, 1.2 / 1.1, 1.2 / 1.1, 2.2 / 1.1])
    assert train == pytest.approx([1.2, 2.0])
    with pytest.raises(ValueError, match="every engine count from 1"):
        slowdown_rows(1.1, 0.5, {(2, False): ([1.0], []), (2, True): ([1.0], [1.0])})
    with pytest.raises(ValueError, match="no training step ran while 1 engines"):
        slowdown_rows(1.1, 0.5, {(1, False): ([1.0], []), (1, True): ([1.0], [])})


def test_calls_beside_the_load_cover_its_steps():
    # 0.5 s calls, 1.4 s steps: 6 steps + 2 at the edges = 11.2 s -> 23 calls; short steps: `steps` calls at least
    assert calls_for_steps(0.5, 1.4, 6) == 23
    assert calls_for_steps(2.0, 0.1, 6) == 6
    with pytest.raises(ValueError, match="positive times"):
        calls_for_steps(0.0, 1.0, 3)


@pytest.mark.slow
def test_probe_measures_real_engines_beside_a_training_load(ray_cluster, tiny_qwen):
    engine = EngineSpec("hf", str(tiny_qwen), {"device": "cpu", "dtype": "float32", "num_threads": 1})
    sampling = SamplingParams(n=4, max_new_tokens=24, temperature=1.0, top_p=1.0, seed=0)
    load = TrainingLoadSpec(str(tiny_qwen), sequences=16, seq_tokens=32, micro_batch_tokens=256, num_threads=1)
    prompts = ["w1 w2 w3", "w4 w5", "w6 w7 w8 w9"]
    result = probe_sharing(fast_config(), engine, sampling, prompts, load, max_engines=2, repeats=3, seed=0)
    assert result["engines"] == 2 and result["repeats"] == 3
    assert result["generation_slowdown"][0][0] == 1.0  # one engine alone is the baseline
    assert len(result["generation_slowdown"]) == len(result["training_slowdown"]) == 2
    assert result["alone_call_s"] > 0 and result["alone_step_s"] > 0
    assert all(v > 0 for row in result["generation_slowdown"] for v in row)
    assert set(result["median_call_s"]) == {"1", "1+training", "2", "2+training"}
    table = ContentionTable.from_dict(result)  # what simulate.sharing: measured reads
    assert len(table.generation) == 2
