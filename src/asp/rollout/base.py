"""Typed results and the `Engine` protocol shared by every generation engine (hf, vllm).

Partial rollouts (``runtime.partial``) use `ContinuingEngine.continue_responses`: the context of each row is the
prompt's tokens followed by the response's tokens so far, and the new tokens' log-probs are those of the same
positions of an uninterrupted response (tests/rollout/test_continuation.py).

One `Engine.generate(prompts, params)` call decodes one minibatch: a list of already chat-templated prompt
strings, each sampled ``params.n`` times with the `SamplingParams` (validated when built, so engines do not
re-check them). Results come back as one `PromptResult` per prompt (same order as the input), each
holding `n` `Sample`s with token ids, response length, finish reason and per-token behaviour log-probs.
`timed_generate` wraps a call and returns a `MinibatchResult` whose `MinibatchTiming` is what the
`profile` stage records per minibatch (a later cost model fits wall time on batch size and lengths).

Log-prob semantics (both engines, see `LogprobsMode`): names follow vLLM's `logprobs_mode`.
``processed_logprobs`` (the default here) is log-softmax of the logits after temperature scaling and
top-p filtering, i.e. the log-probability of the sampled token under the distribution it was actually
drawn from (the behaviour policy); with ``top_p=1`` it equals ``log_softmax(logits / T)``, which is what
TRL/verl trainers recompute. ``raw_logprobs`` (vLLM's own default) is log-softmax of the unscaled logits.
With ``temperature=0`` (greedy) both modes give ``log_softmax(logits)``.

Run the tests with ``python -m pytest tests/rollout -q``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal, Protocol, runtime_checkable

if TYPE_CHECKING:  # annotations only: importing asp.rollout (and the runtime, for SamplingParams) stays torch-free
    import torch

FinishReason = Literal["stop", "length"]
LogprobsMode = Literal["processed_logprobs", "raw_logprobs"]
LOGPROBS_MODES: tuple[str, ...] = ("processed_logprobs", "raw_logprobs")


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """Sampling settings of one `Engine.generate` call, checked when built.

    Both engines sample with temperature / top-p only (no top-k, no repetition penalty).

    Attributes:
        n: samples per prompt, >= 1.
        max_new_tokens: token cap per sample, >= 1.
        temperature: sampling temperature, >= 0; 0 decodes greedily.
        top_p: nucleus probability mass in (0, 1].
        seed: sampling seed; the same seed and minibatch reproduce the same samples.

    Raises:
        ValueError: naming the field and its value when it is out of range.
    """

    n: int
    max_new_tokens: int
    temperature: float
    top_p: float
    seed: int

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError(f"n (samples per prompt) must be >= 1, got {self.n}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 means greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

    def with_seed(self, seed: int) -> SamplingParams:
        """The same settings with another seed (e.g. one per minibatch)."""
        return replace(self, seed=seed)


@dataclass(slots=True)
class Sample:
    """One sampled response.

    Attributes:
        token_ids: response token ids, up to and including the EOS token when one was produced; no padding.
        text: decoded response (special tokens skipped).
        length: number of response tokens, ``len(token_ids)``.
        finish_reason: ``"stop"`` if an EOS token ended it, ``"length"`` if it hit ``max_new_tokens``.
        logprobs: per-token log-probability of each sampled token (same length as `token_ids`, all <= 0),
            in the engine's `LogprobsMode`; empty when the engine was asked for none.
    """

    token_ids: list[int]
    text: str
    length: int
    finish_reason: FinishReason
    logprobs: list[float]


@dataclass(slots=True)
class PromptResult:
    """The `n` samples of one prompt.

    Attributes:
        prompt_index: position of the prompt in the minibatch passed to `Engine.generate`.
        samples: the `n` samples, in sample order.
        prompt_tokens: number of prompt tokens (after tokenisation, no padding).
    """

    prompt_index: int
    samples: list[Sample]
    prompt_tokens: int = 0

    @property
    def lengths(self) -> list[int]:
        """Response lengths in tokens, one per sample."""
        return [s.length for s in self.samples]


@dataclass(slots=True)
class MinibatchTiming:
    """Timing of one `generate` call (one minibatch), the unit the cost model is fitted on.

    Attributes:
        wall_s: wall-clock seconds of the call.
        num_prompts: prompts in the minibatch (batch size counted in prompts).
        n: samples per prompt.
        max_new_tokens: the per-sample token cap used.
        total_tokens: generated tokens summed over all samples.
        max_length: longest response in the minibatch (tokens); decode time grows with it.
        prompt_tokens: prompt tokens summed over the prompts (prefill work).
    """

    wall_s: float
    num_prompts: int
    n: int
    max_new_tokens: int
    total_tokens: int
    max_length: int
    prompt_tokens: int

    @property
    def tokens_per_s(self) -> float:
        """Generated tokens per wall-clock second (0 when no time elapsed)."""
        return self.total_tokens / self.wall_s if self.wall_s > 0 else 0.0


@dataclass(slots=True)
class MinibatchResult:
    """Results of one minibatch together with its timing."""

    results: list[PromptResult]
    timing: MinibatchTiming


@runtime_checkable
class Engine(Protocol):
    """A generation engine: decodes minibatches of prompts, reloads weights in place, releases resources."""

    def generate(self, prompts: list[str], params: SamplingParams) -> list[PromptResult]:
        """Sample ``params.n`` responses per prompt (prompts are chat-templated text); one call is one minibatch."""
        ...

    def update_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Load new policy weights in place (names as in the Hugging Face checkpoint)."""
        ...

    def close(self) -> None:
        """Release the model and any device memory."""
        ...


@runtime_checkable
class ContinuingEngine(Protocol):
    """An engine that can continue responses (partial rollouts, ``runtime.partial``): hf and vllm."""

    def continue_responses(
        self, prompts: list[str], partials: list[list[int]], params: SamplingParams, limits: list[int] | None = None
    ) -> list[Sample]:
        """Continue response i from ``prompts[i]`` + ``partials[i]`` (the prompt's tokens followed by the response's
        tokens so far as the context): one new segment per row (``params.n`` is ignored), at most
        ``min(params.max_new_tokens, limits[i])`` new tokens. Each `Sample` holds the *new* tokens, their behaviour
        log-probs and length, the finish reason of this segment, and the decoded *whole* response as text."""
        ...


def validate_logprobs_mode(mode: str) -> None:
    """Raise ValueError unless `mode` is one of `LOGPROBS_MODES`."""
    if mode not in LOGPROBS_MODES:
        raise ValueError(f"logprobs_mode must be one of {LOGPROBS_MODES}, got {mode!r}")


def minibatch_timing(results: Sequence[PromptResult], wall_s: float, params: SamplingParams) -> MinibatchTiming:
    """Summarise one minibatch's results into a `MinibatchTiming`.

    Args:
        results: the `PromptResult`s of one `generate` call.
        wall_s: wall-clock seconds the call took.
        params: the sampling settings of the call (its ``n`` and ``max_new_tokens`` are recorded).
    """
    lengths = [s.length for r in results for s in r.samples]
    return MinibatchTiming(
        wall_s=float(wall_s),
        num_prompts=len(results),
        n=params.n,
        max_new_tokens=params.max_new_tokens,
        total_tokens=int(sum(lengths)),
        max_length=int(max(lengths, default=0)),
        prompt_tokens=int(sum(r.prompt_tokens for r in results)),
    )


def timed_generate(engine: Engine, prompts: list[str], params: SamplingParams) -> MinibatchResult:
    """Run one ``engine.generate(prompts, params)`` call and time it with `time.perf_counter`."""
    start = time.perf_counter()
    results = engine.generate(prompts, params)
    wall = time.perf_counter() - start
    return MinibatchResult(results=results, timing=minibatch_timing(results, wall, params))
