"""HFEngine on a tiny random Qwen2: shapes, finish reasons, seeding, log-prob semantics, weight reload."""

from __future__ import annotations

import math

import pytest
import torch

from asp.rollout import Engine, SamplingParams, timed_generate
from asp.rollout.hf import HFEngine, response_lengths

from .conftest import EOS_ID, build_tiny_checkpoint

PROMPTS = ["w1 w2 w3", "w4", "w5 w6 w7 w8 w9"]  # 3, 1 and 5 tokens (word-level tokenizer)


@pytest.fixture(scope="module")
def engine(tiny_model) -> HFEngine:
    return HFEngine(tiny_model, num_threads=1, device="cpu", dtype="auto")


@pytest.fixture(scope="module")
def raw_engine(tiny_model) -> HFEngine:
    return HFEngine(tiny_model, logprobs_mode="raw_logprobs", num_threads=1, device="cpu", dtype="auto")


def _recompute(engine: HFEngine, prompt: str, token_ids: list[int]) -> torch.Tensor:
    """Logits at the response positions from one unpadded forward pass over prompt + response: (L, vocab)."""
    ids = engine.tokenizer(prompt, add_special_tokens=False)["input_ids"]
    full = torch.tensor([ids + token_ids])
    with torch.no_grad():
        logits = engine.model(full).logits[0].float()
    return logits[len(ids) - 1 : len(ids) - 1 + len(token_ids)]


def _gather(logp: torch.Tensor, token_ids: list[int]) -> torch.Tensor:
    return logp.gather(1, torch.tensor(token_ids)[:, None]).squeeze(1)


def test_engine_satisfies_protocol(engine):
    assert isinstance(engine, Engine)


def test_num_threads_applies_only_during_generate(engine):
    before = torch.get_num_threads()
    engine.generate(PROMPTS[:1], SamplingParams(n=1, max_new_tokens=2, temperature=1.0, top_p=1.0, seed=0))
    assert torch.get_num_threads() == before


def test_shapes_lengths_and_finish_reasons_are_consistent(engine):
    res = engine.generate(PROMPTS, SamplingParams(n=4, max_new_tokens=8, temperature=1.0, top_p=1.0, seed=0))
    assert [r.prompt_index for r in res] == [0, 1, 2]
    assert [r.prompt_tokens for r in res] == [3, 1, 5]
    for r in res:
        assert len(r.samples) == 4
        for s in r.samples:
            assert s.length == len(s.token_ids) == len(s.logprobs)
            assert 1 <= s.length <= 8
            assert all(x <= 0.0 and math.isfinite(x) for x in s.logprobs)
            # EOS may only be the last token; "stop" iff it is there, otherwise the cap was reached.
            assert EOS_ID not in s.token_ids[:-1]
            if s.finish_reason == "stop":
                assert s.token_ids[-1] == EOS_ID
            else:
                assert s.finish_reason == "length" and s.length == 8 and s.token_ids[-1] != EOS_ID


def test_eos_dominant_model_stops_immediately(stop_model):
    res = HFEngine(stop_model, num_threads=1, device="cpu", dtype="auto").generate(
        PROMPTS, SamplingParams(n=3, max_new_tokens=5, temperature=1.0, top_p=1.0, seed=0)
    )
    for s in (s for r in res for s in r.samples):
        assert (s.token_ids, s.length, s.finish_reason, s.text) == ([EOS_ID], 1, "stop", "")
        assert s.logprobs[0] > -1e-3  # P(EOS) ~ 1


def test_eos_suppressed_model_hits_the_cap(never_stop_model):
    res = HFEngine(never_stop_model, num_threads=1, device="cpu", dtype="auto").generate(
        PROMPTS, SamplingParams(n=2, max_new_tokens=3, temperature=1.0, top_p=1.0, seed=0)
    )
    assert {(s.length, s.finish_reason) for r in res for s in r.samples} == {(3, "length")}


def test_same_seed_reproduces_and_other_seed_differs(engine):
    params = SamplingParams(n=3, max_new_tokens=10, temperature=1.0, top_p=0.9, seed=7)
    a = engine.generate(PROMPTS, params)
    b = engine.generate(PROMPTS, params)
    c = engine.generate(PROMPTS, params.with_seed(8))

    def ids(res):
        return [s.token_ids for r in res for s in r.samples]

    assert ids(a) == ids(b)
    assert [s.logprobs for r in a for s in r.samples] == [s.logprobs for r in b for s in r.samples]
    assert ids(a) != ids(c)  # 9 samples of 10 tokens over 48 words: equal only by a ~0 chance


def test_processed_logprobs_match_forward_pass_at_temperature(engine):
    t = 0.7
    res = engine.generate(PROMPTS, SamplingParams(n=2, max_new_tokens=8, temperature=t, seed=1, top_p=1.0))
    for prompt, r in zip(PROMPTS, res, strict=True):
        for s in r.samples:
            expected = _gather(torch.log_softmax(_recompute(engine, prompt, s.token_ids) / t, -1), s.token_ids)
            torch.testing.assert_close(torch.tensor(s.logprobs), expected, atol=1e-4, rtol=1e-4)


def test_raw_logprobs_ignore_temperature(raw_engine):
    res = raw_engine.generate(PROMPTS, SamplingParams(n=2, max_new_tokens=8, temperature=0.7, seed=1, top_p=1.0))
    for prompt, r in zip(PROMPTS, res, strict=True):
        for s in r.samples:
            expected = _gather(torch.log_softmax(_recompute(raw_engine, prompt, s.token_ids), -1), s.token_ids)
            torch.testing.assert_close(torch.tensor(s.logprobs), expected, atol=1e-4, rtol=1e-4)


def test_top_p_renormalises_processed_logprobs(engine):
    # Renormalising over the nucleus can only raise a kept token's probability: logp_top_p >= logp_T.
    t, top_p = 1.0, 0.5
    res = engine.generate(PROMPTS, SamplingParams(n=2, max_new_tokens=8, temperature=t, top_p=top_p, seed=2))
    gaps = []
    for prompt, r in zip(PROMPTS, res, strict=True):
        for s in r.samples:
            full = _gather(torch.log_softmax(_recompute(engine, prompt, s.token_ids) / t, -1), s.token_ids)
            gaps.append(torch.tensor(s.logprobs) - full)
    gap = torch.cat(gaps)
    assert (gap > -1e-4).all()
    assert gap.max() > 0.1  # top_p=0.5 drops about half the mass: log(1/0.5) ~ 0.69 per token


def test_greedy_is_argmax_and_identical_across_samples(engine):
    res = engine.generate(PROMPTS[:1], SamplingParams(n=2, max_new_tokens=6, temperature=0.0, seed=3, top_p=1.0))
    a, b = res[0].samples
    assert a.token_ids == b.token_ids
    logits = _recompute(engine, PROMPTS[0], a.token_ids)
    assert logits.argmax(-1).tolist() == a.token_ids
    torch.testing.assert_close(
        torch.tensor(a.logprobs), _gather(torch.log_softmax(logits, -1), a.token_ids), atol=1e-4, rtol=1e-4
    )


def test_update_weights_in_place(tmp_path):
    eng = HFEngine(build_tiny_checkpoint(tmp_path / "m"), num_threads=1, device="cpu", dtype="auto")
    params = SamplingParams(n=2, max_new_tokens=4, temperature=1.0, top_p=1.0, seed=0)
    before = eng.generate(PROMPTS, params)
    assert any(s.finish_reason == "length" for r in before for s in r.samples)
    emb = eng.model.model.embed_tokens.weight.detach().clone()
    head = eng.model.lm_head.weight.detach().clone()
    emb[:, 0], head[:, 0] = 50.0, 0.0
    head[EOS_ID, 0] = 20.0  # the stop_model recipe, now loaded in place
    eng.update_weights({"model.embed_tokens.weight": emb, "lm_head.weight": head})
    after = eng.generate(PROMPTS, params)
    assert {s.finish_reason for r in after for s in r.samples} == {"stop"}
    with pytest.raises(ValueError, match="unknown tensor names"):
        eng.update_weights({"no.such.weight": head})
    with pytest.raises(ValueError, match="shape mismatch"):
        eng.update_weights({"lm_head.weight": head[:5]})


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"n": 0}, "n "),
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"temperature": -0.1}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
    ],
)
def test_sampling_params_are_checked_when_built(fields, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**{"n": 1, "max_new_tokens": 4, "temperature": 1.0, "top_p": 1.0, "seed": 0, **fields})


def test_sampling_params_with_seed_changes_only_the_seed():
    params = SamplingParams(n=3, max_new_tokens=7, temperature=0.5, top_p=0.9, seed=1)
    assert params.with_seed(9) == SamplingParams(n=3, max_new_tokens=7, temperature=0.5, top_p=0.9, seed=9)
    assert params.seed == 1  # frozen: with_seed returns a copy


def test_bad_arguments_and_empty_minibatch(engine, tiny_model):
    assert engine.generate([], SamplingParams(n=2, max_new_tokens=4, temperature=1.0, top_p=1.0, seed=0)) == []
    with pytest.raises(ValueError, match="logprobs_mode"):
        HFEngine(tiny_model, logprobs_mode="logits", device="cpu", dtype="auto")
    with pytest.raises(ValueError, match="num_threads"):
        HFEngine(tiny_model, num_threads=0, device="cpu", dtype="auto")


def test_prompt_longer_than_context_is_rejected(tmp_path):
    eng = HFEngine(
        build_tiny_checkpoint(tmp_path / "short", max_positions=16), num_threads=1, device="cpu", dtype="auto"
    )
    with pytest.raises(ValueError, match="prompt 1 has 12 tokens"):
        eng.generate(
            ["w1", " ".join(["w2"] * 12)], SamplingParams(n=1, max_new_tokens=8, temperature=1.0, top_p=1.0, seed=0)
        )


def test_timed_generate_records_minibatch_timing(engine):
    mb = timed_generate(engine, PROMPTS, SamplingParams(n=2, max_new_tokens=5, temperature=1.0, top_p=1.0, seed=0))
    lengths = [s.length for r in mb.results for s in r.samples]
    t = mb.timing
    assert (t.num_prompts, t.n, t.max_new_tokens, t.prompt_tokens) == (3, 2, 5, 9)
    assert t.total_tokens == sum(lengths) and t.max_length == max(lengths)
    assert t.wall_s > 0 and t.tokens_per_s == pytest.approx(t.total_tokens / t.wall_s)


def test_response_lengths_by_hand():
    # rows: EOS(1) at position 1 -> length 2; no EOS -> 4; EOS first -> 1; second EOS id (7) at 2 -> 3
    gen = torch.tensor([[5, 1, 0, 0], [5, 6, 6, 6], [1, 0, 0, 0], [4, 4, 7, 0]])
    lengths, stopped = response_lengths(gen, [1, 7])
    assert lengths.tolist() == [2, 4, 1, 3]
    assert stopped.tolist() == [True, False, True, True]
