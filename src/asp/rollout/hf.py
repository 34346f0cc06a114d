"""Hugging Face `generate` engine: CPU runs, tests, and a GPU baseline next to vLLM.

`HFEngine(model_path, device="cpu", dtype="float32", logprobs_mode="processed_logprobs")` loads a local
checkpoint (never a hub download) and implements `asp.rollout.base.Engine` (device and dtype have no default:
callers pass the params' ``profile.engine`` / ``runtime.engine`` ones):

* prompts are tokenised without special tokens (they are already chat-templated), left-padded, and each
  prompt row is repeated ``params.n`` times; sampling uses temperature / top-p only (top-k off, no
  repetition penalty: the model's own generation_config sampling defaults are ignored so both engines
  sample the same distribution, matching explicit ``vllm.SamplingParams``); ``temperature=0`` is greedy;
* the RNG is seeded with ``params.seed`` inside `torch.random.fork_rng`, so the same seed and the same
  minibatch reproduce exactly and the caller's global RNG state is untouched (unlike vLLM's per-request seeds, a
  prompt's samples also depend on the rest of its minibatch, which shares one RNG stream);
* `continue_responses` continues responses from prompt + tokens so far (partial rollouts, ``runtime.partial``);
* per-token log-probs are recorded during decoding by a pass-through logits processor (one step of
  (rows, vocab) memory instead of storing every step's logits); see `asp.rollout.base` for the
  ``processed_logprobs`` / ``raw_logprobs`` semantics, which follow vLLM's ``logprobs_mode``.

Example::

    eng = HFEngine("runs/policy", device="cpu", dtype="float32")
    sampling = SamplingParams(n=4, max_new_tokens=64, temperature=1.0, top_p=1.0, seed=0)
    res = eng.generate(["<bos><|user|>1+1<|assistant|>"], sampling)
"""

from __future__ import annotations

import gc
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

import torch
from transformers import (
    AutoModelForCausalLM,
    GenerationConfig,
    LogitsProcessor,
    LogitsProcessorList,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    TemperatureLogitsWarper,
    TopPLogitsWarper,
)

from asp.env import torch_threads
from asp.rollout.base import PromptResult, Sample, SamplingParams, validate_logprobs_mode
from asp.rollout.model_dir import check_model_dir, load_tokenizer

GREEDY_EPS = 1e-5  # like vLLM: temperatures below this decode greedily
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """Map a dtype name to a torch dtype; ``"auto"`` is float32 on CPU and bfloat16 on accelerators."""
    if dtype == "auto":
        return torch.float32 if device.type == "cpu" else torch.bfloat16
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be 'auto' or one of {sorted(DTYPES)}, got {dtype!r}")
    return DTYPES[dtype]


class LogprobRecorder(LogitsProcessor):
    """Pass-through logits processor that records the log-prob of each sampled token.

    At decoding step t it sees the scores for token t; the token itself is only known at step t+1
    (as ``input_ids[:, -1]``), so it keeps one step of log-softmax and gathers from it one step late.
    Placed before the temperature/top-p warpers it records raw log-probs, after them processed ones.
    """

    def __init__(self) -> None:
        self._prev: torch.Tensor | None = None
        self._steps: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self._prev is not None:
            self._steps.append(self._prev.gather(1, input_ids[:, -1:]).squeeze(1))
        self._prev = torch.log_softmax(scores.float(), dim=-1)
        return scores

    def finish(self, generated: torch.Tensor) -> torch.Tensor:
        """Return log-probs of `generated` tokens, shape (rows, generated_len), float32.

        Args:
            generated: (rows, L) sampled token ids (the part of `generate`'s output after the prompt).
        """
        rows, length = generated.shape
        steps = list(self._steps)
        if len(steps) < length and self._prev is not None:
            steps.append(self._prev.gather(1, generated[:, len(steps) : len(steps) + 1]).squeeze(1))
        if len(steps) < length:
            raise RuntimeError(f"log-prob recorder saw {len(steps)} decoding steps for {length} generated tokens")
        if length == 0:
            return torch.zeros(rows, 0)
        return torch.stack(steps[:length], dim=1).float().cpu()


def response_lengths(generated: torch.Tensor, eos_ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Lengths (up to and including the first EOS) and whether an EOS was produced.

    Args:
        generated: (rows, L) token ids after the prompt; rows that stopped early are padded after EOS.
        eos_ids: token ids that end a response.

    Returns:
        (lengths, stopped): int64 (rows,) and bool (rows,). A row without EOS has length L.
    """
    is_eos = torch.isin(generated, torch.tensor(eos_ids, device=generated.device))
    stopped = is_eos.any(dim=1)
    first = is_eos.int().argmax(dim=1)
    lengths = torch.where(stopped, first + 1, torch.full_like(first, generated.shape[1]))
    return lengths.long(), stopped


def _eos_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """EOS ids from the checkpoint's generation_config (may be a list) plus the tokenizer's EOS token."""
    ids = model.generation_config.eos_token_id
    ids = [] if ids is None else ([ids] if isinstance(ids, int) else list(ids))
    if tokenizer.eos_token_id is not None:
        ids.append(tokenizer.eos_token_id)
    if not ids:
        raise ValueError("the checkpoint defines no EOS token (generation_config or tokenizer); set one")
    return sorted(set(int(i) for i in ids))


class HFEngine:
    """transformers `generate` engine on CPU or one GPU. See the module docstring."""

    def __init__(
        self,
        model_path: str | Path,
        *,
        device: str,
        dtype: str,
        logprobs_mode: str = "processed_logprobs",
        attn_implementation: str | None = None,
        num_threads: int | None = None,
    ) -> None:
        """Load the model and tokenizer from a local directory.

        Args:
            model_path: local checkpoint directory (config.json, tokenizer, *.safetensors).
            device: torch device string, e.g. ``"cpu"`` or ``"cuda:0"``.
            dtype: ``"auto"`` (float32 on CPU, bfloat16 on GPU), ``"float32"``, ``"bfloat16"`` or ``"float16"``.
            logprobs_mode: ``"processed_logprobs"`` or ``"raw_logprobs"`` (see `asp.rollout.base`).
            attn_implementation: optional transformers attention backend (e.g. ``"sdpa"``).
            num_threads: CPU threads torch may use during `generate` (restored afterwards); None keeps the
                process setting. Tiny models decode fastest with 1: their ops are too small to split, and
                on a shared machine extra OpenMP threads mostly spin (docs/benchmarks.md, "Design notes").
        """
        validate_logprobs_mode(logprobs_mode)
        if num_threads is not None and num_threads < 1:
            raise ValueError(f"num_threads must be None or >= 1, got {num_threads}")
        self.num_threads = num_threads
        path = check_model_dir(model_path)
        self.device = torch.device(device)
        self.logprobs_mode = logprobs_mode
        self.tokenizer = load_tokenizer(path)
        kwargs = {"attn_implementation": attn_implementation} if attn_implementation else {}
        model = AutoModelForCausalLM.from_pretrained(
            str(path), local_files_only=True, use_safetensors=True, dtype=resolve_dtype(dtype, self.device), **kwargs
        )
        self.model = model.to(self.device).eval()
        self.eos_ids = _eos_ids(self.model, self.tokenizer)
        self.pad_id = int(self.tokenizer.pad_token_id)
        # Drop the checkpoint's sampling defaults (top_k, repetition_penalty, ...): only what we pass applies.
        self.model.generation_config = GenerationConfig(eos_token_id=self.eos_ids, pad_token_id=self.pad_id)
        self.max_positions = getattr(self.model.config, "max_position_embeddings", None)

    def _processors(self, greedy: bool, params: SamplingParams) -> tuple[LogitsProcessorList, LogprobRecorder]:
        recorder = LogprobRecorder()
        procs = LogitsProcessorList()
        if self.logprobs_mode == "raw_logprobs":
            procs.append(recorder)
        if not greedy:
            if params.temperature != 1.0:
                procs.append(TemperatureLogitsWarper(params.temperature))
            if params.top_p < 1.0:
                procs.append(TopPLogitsWarper(params.top_p))
        if self.logprobs_mode == "processed_logprobs":
            procs.append(recorder)
        return procs, recorder

    def _check_lengths(self, attention_mask: torch.Tensor, max_new_tokens: int) -> None:
        if self.max_positions is None:
            return
        prompt_lens = attention_mask.sum(dim=1)
        worst = int(prompt_lens.argmax())
        if int(prompt_lens[worst]) + max_new_tokens > self.max_positions:
            raise ValueError(
                f"prompt {worst} has {int(prompt_lens[worst])} tokens; with max_new_tokens={max_new_tokens} it "
                f"exceeds the model's max_position_embeddings={self.max_positions}. Shorten or drop such prompts."
            )

    @torch.inference_mode()
    def generate(self, prompts: list[str], params: SamplingParams) -> list[PromptResult]:
        """Sample ``params.n`` responses for each prompt; see `asp.rollout.base.Engine.generate`."""
        if not prompts:
            return []
        n, max_new_tokens = params.n, params.max_new_tokens
        enc = self.tokenizer(list(prompts), padding=True, return_tensors="pt", add_special_tokens=False)
        self._check_lengths(enc["attention_mask"], max_new_tokens)
        input_ids = enc["input_ids"].repeat_interleave(n, dim=0).to(self.device)
        attention_mask = enc["attention_mask"].repeat_interleave(n, dim=0).to(self.device)
        generated, logprobs = self._sample(input_ids, attention_mask, params)
        return self._to_results(generated.cpu(), logprobs, enc["attention_mask"].sum(dim=1).tolist(), n)

    def _sample(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, params: SamplingParams
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One `generate` call over left-padded rows (one sample each): (generated ids, their log-probs)."""
        max_new_tokens = params.max_new_tokens
        greedy = params.temperature < GREEDY_EPS
        procs, recorder = self._processors(greedy, params)
        config = GenerationConfig(
            do_sample=not greedy,
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            max_new_tokens=max_new_tokens,
            eos_token_id=self.eos_ids,
            pad_token_id=self.pad_id,
            num_return_sequences=1,
            repetition_penalty=1.0,
        )
        cuda = [self.device] if self.device.type == "cuda" else []
        with torch_threads(self.num_threads), torch.random.fork_rng(devices=cuda):
            torch.manual_seed(params.seed)
            out = self.model.generate(
                input_ids=input_ids,
                attention_mask=attention_mask,
                generation_config=config,
                logits_processor=procs,
            )
        generated = out[:, input_ids.shape[1] :]
        return generated, recorder.finish(generated)

    @torch.inference_mode()
    def continue_responses(
        self, prompts: list[str], partials: list[list[int]], params: SamplingParams, limits: list[int] | None = None
    ) -> list[Sample]:
        """Continue each response from its prompt + tokens so far (partial rollouts); see
        `asp.rollout.base.ContinuingEngine`. Rows are left-padded into one `generate` call of
        ``max(limits)`` new tokens (a row's extra tokens past its limit are cut off, which samples the same
        distribution as stopping it there); the RNG is seeded with ``params.seed`` as in `generate`."""
        if len(partials) != len(prompts) or (limits is not None and len(limits) != len(prompts)):
            raise ValueError(f"{len(prompts)} prompts, {len(partials)} partial responses and limits {limits!r}")
        if not prompts:
            return []
        top = params.max_new_tokens
        caps = [top] * len(prompts) if limits is None else [max(1, min(top, int(x))) for x in limits]
        enc = self.tokenizer(list(prompts), add_special_tokens=False)["input_ids"]
        rows = [list(p) + [int(t) for t in q] for p, q in zip(enc, partials, strict=True)]
        width = max(len(r) for r in rows)
        input_ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        attention_mask = torch.zeros_like(input_ids)
        for i, r in enumerate(rows):
            input_ids[i, width - len(r) :] = torch.tensor(r, dtype=torch.long)
            attention_mask[i, width - len(r) :] = 1
        self._check_lengths(attention_mask, max(caps))
        generated, logprobs = self._sample(
            input_ids.to(self.device), attention_mask.to(self.device), replace(params, n=1, max_new_tokens=max(caps))
        )
        generated = generated.cpu()
        samples = []
        for i, cap in enumerate(caps):
            lengths, stopped = response_lengths(generated[i : i + 1, :cap], self.eos_ids)
            k = int(lengths[0])
            ids = generated[i, :k].tolist()
            samples.append(
                Sample(
                    token_ids=ids,
                    text=self.tokenizer.decode([int(t) for t in partials[i]] + ids, skip_special_tokens=True),
                    length=k,
                    finish_reason="stop" if bool(stopped[0]) else "length",
                    logprobs=logprobs[i, :k].tolist(),
                )
            )
        return samples

    def _to_results(
        self, generated: torch.Tensor, logprobs: torch.Tensor, prompt_tokens: list[int], n: int
    ) -> list[PromptResult]:
        lengths, stopped = response_lengths(generated, self.eos_ids)
        ids = [generated[i, : int(lengths[i])].tolist() for i in range(generated.shape[0])]
        texts = self.tokenizer.batch_decode(ids, skip_special_tokens=True)
        samples = [
            Sample(
                token_ids=ids[i],
                text=texts[i],
                length=int(lengths[i]),
                finish_reason="stop" if bool(stopped[i]) else "length",
                logprobs=logprobs[i, : int(lengths[i])].tolist(),
            )
            for i in range(generated.shape[0])
        ]
        return [
            PromptResult(prompt_index=p, samples=samples[p * n : (p + 1) * n], prompt_tokens=int(prompt_tokens[p]))
            for p in range(len(prompt_tokens))
        ]

    @torch.no_grad()
    def update_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Copy tensors into the model's parameters/buffers in place (a subset of names is allowed).

        Raises:
            ValueError: for a name the model does not have or a shape mismatch (nothing is copied then).
        """
        own = self.model.state_dict()
        unknown = sorted(set(state_dict) - set(own))
        if unknown:
            raise ValueError(f"update_weights: {len(unknown)} unknown tensor names, e.g. {unknown[:3]}")
        bad = [k for k, v in state_dict.items() if tuple(v.shape) != tuple(own[k].shape)]
        if bad:
            k = bad[0]
            raise ValueError(
                f"update_weights: shape mismatch for {k}: {tuple(state_dict[k].shape)} vs {tuple(own[k].shape)}"
            )
        for name, tensor in state_dict.items():
            own[name].copy_(tensor.to(device=own[name].device, dtype=own[name].dtype))

    def close(self) -> None:
        """Drop the model and free accelerator memory."""
        self.model = None
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
