"""Continuing responses from prompt + partial tokens (partial rollouts, ``runtime.partial``): the hf engine, the vLLM
engine's requests and parsing (on a stand-in ``LLM`` that decodes with the tiny hf model: vLLM needs CUDA), and the
generation actor's budget and continuation calls.

* greedy: a response generated in two calls (budget, then continuation) is token for token the uninterrupted one, and
  its log-probs are the same positions' log-probs;
* sampled, several rows of different lengths (left padding): each new token's log-prob is the teacher-forced
  log-softmax at its position given prompt + tokens so far, limits are respected, the text is the whole response.

Run: ``.venv/bin/python -m pytest tests/rollout/test_continuation.py -q``
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest
import torch

from asp.control.messages import ContinuationRow, WorkItem
from asp.rollout import SamplingParams
from asp.rollout.base import ContinuingEngine
from asp.rollout.hf import HFEngine
from asp.rollout.vllm import VLLMEngine, VLLMOptions, continuation_requests
from asp.runtime.generation import GenerationActor

from .conftest import EOS_ID

PROMPT = "w1 w2 w3"


@pytest.fixture(scope="module")
def engine(tiny_model) -> HFEngine:
    return HFEngine(tiny_model, num_threads=1, device="cpu", dtype="auto")  # greedy from PROMPT: 12 tokens without EOS


@pytest.fixture(scope="module")
def random_engine(tiny_model) -> HFEngine:
    return HFEngine(tiny_model, num_threads=1, device="cpu", dtype="auto")


def teacher_forced(engine: HFEngine, prompt: str, tokens: list[int], t: float) -> torch.Tensor:
    """log-softmax(logits / t) at every response position of prompt + tokens (one unpadded forward pass)."""
    ids = engine.tokenizer(prompt, add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        logits = engine.model(torch.tensor([ids + tokens])).logits[0].float()
    return torch.log_softmax(logits[len(ids) - 1 : len(ids) - 1 + len(tokens)] / t, -1)


def test_hf_greedy_continuation_is_the_uninterrupted_response(engine):
    assert isinstance(engine, ContinuingEngine)
    greedy = SamplingParams(n=1, max_new_tokens=12, temperature=0.0, seed=0, top_p=1.0)
    (full,) = engine.generate([PROMPT], greedy)[0].samples
    (head,) = engine.generate([PROMPT], SamplingParams(n=1, max_new_tokens=5, temperature=0.0, top_p=1.0, seed=0))[
        0
    ].samples
    (tail,) = engine.continue_responses([PROMPT], [head.token_ids], greedy, limits=[12 - 5])
    assert head.token_ids + tail.token_ids == full.token_ids and tail.length == 7 and tail.finish_reason == "length"
    np.testing.assert_allclose(head.logprobs + tail.logprobs, full.logprobs, atol=1e-5)
    assert tail.text == full.text  # the whole response, decoded once


def test_hf_sampled_rows_of_different_lengths_have_aligned_logprobs_and_limits(random_engine):
    t = 0.7
    prompts = ["w1 w2 w3", "w4", "w5 w6 w7 w8 w9"]
    partials = [[10, 11], [], [12, 13, 14, 15, 16]]  # no EOS (id 1) among them
    limits = [6, 3, 8]
    params = SamplingParams(n=1, max_new_tokens=6, temperature=t, seed=4, top_p=1.0)
    out = random_engine.continue_responses(prompts, partials, params, limits)
    assert len(out) == 3
    for prompt, partial, limit, s in zip(prompts, partials, limits, out, strict=True):
        assert 1 <= s.length <= min(limit, 6) and len(s.logprobs) == s.length
        assert (s.finish_reason == "stop") == (s.token_ids[-1] == EOS_ID)
        logp = teacher_forced(random_engine, prompt, partial + s.token_ids, t)[len(partial) :]
        expected = logp.gather(1, torch.tensor(s.token_ids)[:, None]).squeeze(1)
        torch.testing.assert_close(torch.tensor(s.logprobs), expected, atol=1e-4, rtol=1e-4)
        assert s.text == random_engine.tokenizer.decode(partial + s.token_ids, skip_special_tokens=True)
    again = random_engine.continue_responses(prompts, partials, params, limits)
    assert [s.token_ids for s in again] == [s.token_ids for s in out]  # seeded
    assert random_engine.continue_responses([], [], params) == []
    with pytest.raises(ValueError, match="2 prompts, 1 partial"):
        random_engine.continue_responses(prompts[:2], partials[:1], params)


# ---- vLLM: requests and parsing, on a stand-in LLM that decodes greedily with the hf model -----------------------
@dataclass
class Completion:  # the fields of vllm.outputs.CompletionOutput that parse_request_outputs reads
    index: int
    token_ids: list[int]
    finish_reason: str
    text: str = ""
    logprobs: list = field(default_factory=list)


@dataclass
class RequestOutput:
    prompt_token_ids: list[int]
    outputs: list[Completion]


@dataclass
class Logprob:
    logprob: float


class HFBackedLLM:
    """Stand-in for ``vllm.LLM.generate`` (vLLM needs CUDA): decodes each ``TokensPrompt`` greedily with the hf
    engine's model and returns ``RequestOutput``-shaped results with per-position log-prob mappings."""

    def __init__(self, hf: HFEngine) -> None:
        self.hf, self.requests = hf, []

    def generate(self, prompts, sampling_params, use_tqdm=False):
        outs = []
        for p, sp in zip(prompts, sampling_params, strict=True):
            self.requests.append((p["prompt_token_ids"], dict(sp.__dict__)))
            ids = torch.tensor([p["prompt_token_ids"]])
            params = SamplingParams(n=1, max_new_tokens=sp.max_tokens, temperature=0.0, top_p=1.0, seed=0)
            gen, lps = self.hf._sample(ids, torch.ones_like(ids), params)
            toks = gen[0].tolist()
            if EOS_ID in toks:
                toks = toks[: toks.index(EOS_ID) + 1]
            lp = [{t: Logprob(float(v))} for t, v in zip(toks, lps[0].tolist(), strict=False)]
            reason = "stop" if toks and toks[-1] == EOS_ID else "length"
            outs.append(RequestOutput(p["prompt_token_ids"], [Completion(0, toks, reason, logprobs=lp)]))
        return outs


class SamplingKw:
    def __init__(self, **kwargs) -> None:
        self.__dict__.update(kwargs)


def test_vllm_requests_put_the_partial_tokens_after_the_prompt_ids():
    params = SamplingParams(n=4, max_new_tokens=8, temperature=0.7, seed=100, top_p=1.0)
    contexts, reqs = continuation_requests([[5, 6], [7]], [[8, 9, 10], []], params, limits=[3, 20])
    assert contexts == [[5, 6, 8, 9, 10], [7]]
    assert [(r["n"], r["max_tokens"], r["seed"], r["temperature"]) for r in reqs] == [
        (1, 3, 100, 0.7),
        (1, 8, 101, 0.7),
    ]
    assert all(r["logprobs"] == 0 and r["detokenize"] is False for r in reqs)


def test_vllm_engine_continuation_equals_the_uninterrupted_response(engine):
    from .conftest import build_tokenizer

    llm = HFBackedLLM(engine)
    vllm_engine = VLLMEngine.from_llm(
        llm, VLLMOptions(dtype="auto", seed=0), tokenizer=build_tokenizer(), sampling_cls=SamplingKw
    )
    greedy = SamplingParams(n=1, max_new_tokens=12, temperature=0.0, top_p=1.0, seed=0)
    (full,) = vllm_engine.generate([PROMPT], greedy)[0].samples
    (tail,) = vllm_engine.continue_responses([PROMPT], [full.token_ids[:5]], greedy, limits=[7])
    assert full.token_ids[:5] + tail.token_ids == full.token_ids and tail.length == 7
    assert llm.requests[-1][0] == build_tokenizer()(PROMPT, add_special_tokens=False)["input_ids"] + full.token_ids[:5]
    np.testing.assert_allclose(tail.logprobs, full.logprobs[5:], atol=1e-5)
    assert tail.text == full.text


# ---- the generation actor ---------------------------------------------------------------------------------------
def test_actor_budget_and_continuation_rebuild_the_uninterrupted_response(tiny_model):
    from asp.rollout.hf import HFEngine as Hf

    cap = 10
    actor = GenerationActor(
        0,
        3,
        lambda: Hf(tiny_model, num_threads=1, device="cpu", dtype="auto"),
        SamplingParams(2, cap, temperature=0.0, top_p=1.0, seed=0),
    )
    item = WorkItem(7, 2, 1, 0, ["a"], [PROMPT], seed=0, budget=4)
    (out,) = actor.generate([item], None)
    assert out.lengths.tolist() == [4, 4] and not out.finished.any() and not out.complete
    (whole,) = actor.generate([WorkItem(8, 2, 1, 0, ["a"], [PROMPT], seed=0)], None)  # no budget: as before
    assert whole.complete and whole.lengths.tolist() == [cap, cap]
    rows = [ContinuationRow(7, s, "a", PROMPT, out.token_ids[4 * s : 4 * s + 4], 4) for s in range(2)]
    (seg,) = actor.generate([WorkItem(0, -1, -1, 0, [], [], seed=1, budget=4, rows=rows)], None)
    assert seg.cont_id == 0 and seg.lengths.tolist() == [4, 4] and not seg.finished.any()
    rows = [
        ContinuationRow(7, s, "a", PROMPT, np.concatenate([r.token_ids, seg.token_ids[4 * s : 4 * s + 4]]), 8)
        for s, r in enumerate(rows)
    ]
    (last,) = actor.generate([WorkItem(1, -1, -1, 0, [], [], seed=2, budget=4, rows=rows)], None)
    assert last.lengths.tolist() == [2, 2] and last.finished.all() and not last.stopped.any()  # the cap, not EOS
    assert rows[0].token_ids.tolist() + last.token_ids[:2].tolist() == whole.token_ids[:cap].tolist()
    assert last.texts[0] == whole.texts[0]
