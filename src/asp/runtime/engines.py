"""Engine factories for generation actors, and `StandInEngine`, a model-free stand-in for tests and benchmarks.

`EngineSpec(kind, model_path, options)` is a small picklable recipe: each generation actor calls it once to
build its own engine (``"hf"`` / ``"vllm"`` through `asp.rollout.make_engine`, ``"standin"`` for
`StandInEngine`). `EngineSpec.check()` validates the model directory in the driver before any actor starts.

`StandInEngine` is NOT a model: it implements the `asp.rollout.Engine` protocol and returns `PromptResult`s
whose response lengths come from a prompt -> length table (e.g. profiled true lengths) or from a hash of
the prompt, optionally sleeping ``seconds_per_call + seconds_per_token * longest response`` to mimic padded
decoding. With no sleep it measures pure orchestration overhead (benchmarks/bench_runtime.py).
"""

from __future__ import annotations

import random
import time
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from asp.errors import UserError
from asp.rollout import check_model_dir, make_engine
from asp.rollout.base import FinishReason, PromptResult, Sample, SamplingParams

if TYPE_CHECKING:
    from asp.rollout.base import Engine

ENGINE_SPEC_KINDS = ("hf", "vllm", "standin")


@dataclass(frozen=True)
class EngineSpec:
    """Picklable recipe for the engine of one generation actor.

    Attributes:
        kind: ``"hf"``, ``"vllm"`` or ``"standin"``.
        model_path: local checkpoint directory (hf / vllm).
        options: keyword options of the engine (e.g. ``{"device": "cpu", "dtype": "float32", "num_threads": 1}``
            for hf, ``{"tensor_parallel_size": 2}`` for vllm, `StandInEngine` arguments for standin).
        device: where the engine runs (``runtime.engine.device``): ``"cpu"`` for vLLM's CPU build, whose actors
            need no GPU; None: not stated (a vllm engine is then taken to need its tensor_parallel_size GPUs).
    """

    kind: str
    model_path: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    device: str | None = None

    def check(self) -> None:
        """Validate in the calling process (cheap; no model is loaded).

        Raises:
            UserError: unknown kind, or a missing / incomplete model directory.
        """
        if self.kind not in ENGINE_SPEC_KINDS:
            raise UserError(f"unknown engine kind {self.kind!r}; choose one of {', '.join(ENGINE_SPEC_KINDS)}.")
        if self.kind != "standin":
            check_model_dir(Path(self._model_path()))

    def __call__(self) -> Engine:
        """Build the engine (called inside the generation actor)."""
        if self.kind == "standin":
            return StandInEngine(**self.options)

        return make_engine(self.kind, self._model_path(), **self.options)

    def _model_path(self) -> str:
        if not self.model_path:
            raise UserError(f"engine {self.kind!r} needs a model_path (a local checkpoint directory).")
        return self.model_path


class StandInEngine:
    """Model-free stand-in engine (see module docstring); implements `asp.rollout.Engine`.

    Args:
        lengths: prompt text -> response length in tokens; prompts not in it get a hash-based length.
        min_length, max_length: range of hash-based lengths (tokens, inclusive).
        jitter: relative spread of the n samples of a prompt around its length (0 = all equal).
        seconds_per_call: sleep per `generate` call (prefill / launch overhead).
        seconds_per_token: sleep per token of the longest response (decoding is padded to it).
        vocab_size: token ids are drawn from [3, vocab_size).
        logprobs: also return per-token log-probs (constant -1.0).
    """

    def __init__(
        self,
        lengths: Mapping[str, int] | None = None,
        *,
        min_length: int = 1,
        max_length: int = 32,
        jitter: float = 0.0,
        seconds_per_call: float = 0.0,
        seconds_per_token: float = 0.0,
        vocab_size: int = 1000,
        logprobs: bool = True,
    ) -> None:
        if not 1 <= min_length <= max_length:
            raise ValueError(f"need 1 <= min_length <= max_length, got {min_length}, {max_length}")
        if jitter < 0 or seconds_per_call < 0 or seconds_per_token < 0 or vocab_size < 4:
            raise ValueError("jitter, seconds_per_call, seconds_per_token must be >= 0 and vocab_size >= 4")
        self.lengths = dict(lengths or {})
        self.min_length, self.max_length, self.jitter = min_length, max_length, jitter
        self.seconds_per_call, self.seconds_per_token = seconds_per_call, seconds_per_token
        self.vocab_size, self.with_logprobs = vocab_size, logprobs
        self.weight_updates = 0

    def base_length(self, prompt: str) -> int:
        """Response length of `prompt` before jitter (table value, else a stable hash in the range)."""
        if prompt in self.lengths:
            return max(1, int(self.lengths[prompt]))
        span = self.max_length - self.min_length + 1
        return self.min_length + zlib.crc32(prompt.encode()) % span

    def generate(self, prompts: list[str], params: SamplingParams) -> list[PromptResult]:
        """Return ``params.n`` samples per prompt with the stand-in lengths (capped at ``params.max_new_tokens``)."""
        n, max_new_tokens, seed = params.n, params.max_new_tokens, params.seed
        results, longest = [], 0
        for p, prompt in enumerate(prompts):
            base = self.base_length(prompt)
            rng = random.Random(zlib.crc32(prompt.encode()) ^ seed) if self.jitter else None
            samples = []
            for _ in range(n):
                raw = base if rng is None else max(1, round(base * (1 + self.jitter * (2 * rng.random() - 1))))
                length = min(raw, max_new_tokens)
                first = 3 + (seed + p) % (self.vocab_size - 3)
                ids = [first] * length
                lp = [-1.0] * length if self.with_logprobs else []
                reason: FinishReason = "stop" if raw <= max_new_tokens else "length"
                samples.append(Sample(token_ids=ids, text="", length=length, finish_reason=reason, logprobs=lp))
                longest = max(longest, length)
            results.append(PromptResult(prompt_index=p, samples=samples, prompt_tokens=len(prompt.split())))
        delay = self.seconds_per_call + self.seconds_per_token * longest
        if delay > 0:
            time.sleep(delay)
        return results

    def update_weights(self, state_dict: Mapping[str, Any]) -> None:
        """Accept any weights (counted only)."""
        self.weight_updates += 1

    def close(self) -> None:
        return None
