"""Generation engines behind one protocol (`Engine`), built by `make_engine`.

``make_engine("hf", path, device="cpu", dtype="float32")`` gives an `HFEngine` (transformers `generate`, CPU or
GPU); ``make_engine("vllm", path, dtype="bfloat16", seed=0, tensor_parallel_size=1, ...)`` gives a `VLLMEngine`
(needs vLLM and CUDA).
``engine.generate(prompts, SamplingParams(n=8, max_new_tokens=1024, temperature=1.0, top_p=1.0, seed=0))``
decodes one minibatch. Both read a local checkpoint directory only and return `PromptResult`s with per-sample
token ids, lengths, finish reasons and behaviour log-probs; see `asp.rollout.base` for the types and log-prob
semantics.

Modules: `base` (the protocol and message types), `factory` (`make_engine`), `hf`, `vllm` (+ `vllm_weights`,
`weight_transfer`: weight reloads in bounded buckets), `model_dir` (checkpoint checks, the tokenizer). This
package re-exports the types and `make_engine`; the engines themselves are imported when built.
"""

from asp.rollout.base import (
    Engine,
    FinishReason,
    LogprobsMode,
    MinibatchResult,
    MinibatchTiming,
    PromptResult,
    Sample,
    SamplingParams,
    minibatch_timing,
    timed_generate,
)
from asp.rollout.factory import ENGINE_KINDS, make_engine
from asp.rollout.model_dir import check_model_dir, load_tokenizer

__all__ = [
    "ENGINE_KINDS",
    "Engine",
    "FinishReason",
    "LogprobsMode",
    "MinibatchResult",
    "MinibatchTiming",
    "PromptResult",
    "Sample",
    "SamplingParams",
    "check_model_dir",
    "load_tokenizer",
    "make_engine",
    "minibatch_timing",
    "timed_generate",
]
