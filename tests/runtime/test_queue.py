"""Training Queue batch assembly (prompts keep all n samples, depth at arrival) and backpressure hysteresis."""

from __future__ import annotations

import pytest

from asp.runtime import Backpressure, TrainingQueue

from .helpers import output


def test_padding_rate_of_an_output():
    # lengths 2, 4, 6, 8: mean 5, max 8 -> 1 - 5/8 = 0.375
    assert output(0, ["a", "b"], [2, 4, 6, 8]).padding_rate == pytest.approx(0.375)


def test_batches_cut_at_prompt_boundaries_with_all_samples():
    q = TrainingQueue(global_batch_prompts=4, n_samples=2)
    # task 0: prompts p0 p1 p2 (samples 0..5), task 1: prompts p3 p4 (samples 0..3)
    assert q.put(output(0, ["p0", "p1", "p2"], [1, 2, 3, 4, 5, 6], version=1), now=1.0) == 0
    assert not q.ready()
    assert q.put(output(1, ["p3", "p4"], [7, 8, 9, 10], version=2), now=2.0) == 3  # depth before arrival
    assert q.ready() and q.depth == 5 and q.depth_samples == 10

    batch, consumed = q.take(step=1, now=3.0)
    assert batch.prompt_ids == ["p0", "p1", "p2", "p3"]
    assert consumed == [(0, 3), (1, 1)]
    assert batch.versions.tolist() == [1, 1, 1, 2] and batch.task_ids.tolist() == [0, 0, 0, 1]
    # 4 prompts x n=2: both samples of p3 are the first two samples of task 1 (lengths 7 and 8)
    assert batch.lengths.tolist() == [1, 2, 3, 4, 5, 6, 7, 8]
    assert batch.sample_offsets[-1] == batch.token_ids.size == 36 == batch.logprobs.size
    assert batch.sample_tokens(6).tolist() == [100] * 7  # task 1, its sample 0
    assert batch.sample_tokens(7).tolist() == [101] * 8
    assert batch.texts[6:] == ["t1.0", "t1.1"]
    assert q.depth == 1

    rest, consumed = q.take(step=2, now=4.0, limit=10)  # short last batch: whatever is left
    assert rest.prompt_ids == ["p4"] and consumed == [(1, 1)]
    assert rest.lengths.tolist() == [9, 10] and rest.sample_tokens(1).tolist() == [103] * 10
    assert q.depth == 0 and not q.entries
    assert q.arrivals == [(1.0, 0, 3), (2.0, 3, 2)]
    assert [d for _, d in q.trace] == [3, 5, 1, 0]


def test_queue_rejects_wrong_sample_count():
    q = TrainingQueue(global_batch_prompts=2, n_samples=4)
    with pytest.raises(ValueError, match="expects n=4"):
        q.put(output(0, ["a"], [1, 1]), now=0.0)


def test_backpressure_pauses_above_q_max_and_resumes_at_q_resume():
    bp = Backpressure(q_max=8, q_resume=4)
    assert [bp.update(d) for d in (3, 8)] == [False, False] and not bp.paused  # at q_max: not above it
    assert bp.update(9) is True and bp.paused
    assert [bp.update(d) for d in (12, 6, 5)] == [False, False, False] and bp.paused
    assert bp.update(4) is True and not bp.paused
    assert bp.update(9) and bp.pauses == 2
    with pytest.raises(ValueError):
        Backpressure(q_max=4, q_resume=5)
