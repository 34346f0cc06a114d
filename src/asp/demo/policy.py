"""Tiny demo policy: a Qwen2-architecture causal LM built locally, warm-started on the demo task on CPU.

`build_model` creates a randomly initialised `Qwen2ForCausalLM` sized for a laptop; `warm_start` runs a
short supervised fine-tune on reference responses (loss on response tokens + EOS only); `evaluate_policy`
samples responses with `model.generate` and reports how well the sampled lengths follow the task's
intended lengths (Spearman) and the mean verifiable reward. Nothing here reads or writes files; the
policy stage saves the result with ``save_pretrained`` (safetensors).

Its settings are the ``policy.demo`` params (`asp.config.DemoPolicyParams`, the one place their defaults live);
run it through the pipeline's policy stage: ``asp stage policy`` (or ``dvc repro policy``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from scipy.stats import spearmanr
from transformers import PreTrainedTokenizerBase, Qwen2Config, Qwen2ForCausalLM

from asp.demo.task import intended_length, reference_response, reward
from asp.env import torch_threads

ProgressFn = Callable[[int, int, float], None]
StopFn = Callable[[int], bool]  # step -> end the warm start here (called with the model in eval mode, no grad)


def build_model(
    tokenizer: PreTrainedTokenizerBase,
    *,
    hidden_size: int,
    num_layers: int,
    num_heads: int,
    intermediate_size: int,
    max_position_embeddings: int,
    seed: int,
) -> Qwen2ForCausalLM:
    """Build a randomly initialised tiny Qwen2 causal LM over `tokenizer`'s vocabulary (tied embeddings).

    Args:
        tokenizer: the demo tokenizer; its size and bos/eos/pad ids go into the config.
        hidden_size: model width (divisible by `num_heads`).
        num_layers: transformer blocks.
        num_heads: attention heads (also key/value heads).
        intermediate_size: MLP width.
        max_position_embeddings: longest prompt + response the model is meant for, in tokens.
        seed: initialisation seed.

    Returns:
        A float32 `Qwen2ForCausalLM` in eval mode whose generation config stops at EOS.
    """
    if hidden_size % num_heads:
        raise ValueError(f"hidden_size ({hidden_size}) must be divisible by num_heads ({num_heads})")
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model.eval()


def prompt_ids(tokenizer: PreTrainedTokenizerBase, problem: str) -> list[int]:
    """Token ids of the chat-formatted prompt (user turn + generation prompt) for one problem."""
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": problem}], tokenize=False, add_generation_prompt=True
    )
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def _examples(
    tokenizer: PreTrainedTokenizerBase, records: Sequence[dict], responses: Sequence[str] | None = None
) -> list[tuple[list[int], int]]:
    """(prompt + response + EOS ids, prompt length) per record; `responses` default to the references."""
    if responses is not None and len(responses) != len(records):
        raise ValueError(f"{len(responses)} responses for {len(records)} records")
    out = []
    for i, rec in enumerate(records):
        p = prompt_ids(tokenizer, rec["problem"])
        text = reference_response(rec) if responses is None else responses[i]
        r = tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        out.append((p + r, len(p)))
    return out


def _batches(lengths: np.ndarray, batch_size: int, steps: int, rng: np.random.Generator) -> list[np.ndarray]:
    """`steps` index batches: shuffled epochs, sorted by length inside chunks of 16 batches (less padding)."""
    batches: list[np.ndarray] = []
    chunk = batch_size * 16
    while len(batches) < steps:
        perm = rng.permutation(len(lengths))
        epoch = []
        for s in range(0, len(perm), chunk):
            part = perm[s : s + chunk]
            part = part[np.argsort(lengths[part], kind="stable")]
            epoch += [part[i : i + batch_size] for i in range(0, len(part), batch_size)]
        batches += [epoch[i] for i in rng.permutation(len(epoch))]
    return batches[:steps]


def _collate(examples: list[tuple[list[int], int]], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded input_ids / attention_mask / labels (-100 on prompt and padding), shapes [B, T]."""
    width = max(len(ids) for ids, _ in examples)
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    labels = torch.full_like(ids, -100)
    for i, (seq, n_prompt) in enumerate(examples):
        ids[i, : len(seq)] = torch.tensor(seq)
        mask[i, : len(seq)] = 1
        labels[i, n_prompt : len(seq)] = ids[i, n_prompt : len(seq)]
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def warm_start(
    model: Qwen2ForCausalLM,
    tokenizer: PreTrainedTokenizerBase,
    records: Sequence[dict],
    *,
    steps: int,
    batch_size: int,
    lr: float,
    seed: int,
    progress: ProgressFn | None = None,
    num_threads: int | None = None,
    responses: Sequence[str] | None = None,
    stop: StopFn | None = None,
    stop_every: int = 0,
    stop_from: int = 0,
) -> dict:
    """Supervised warm start on reference responses (AdamW, linear warmup then cosine decay, grad clip 1).

    Args:
        model: the policy, trained in place (left in eval mode).
        tokenizer: the demo tokenizer (chat template formats the prompts).
        records: task records (``problem`` + ``answer``); cycled when `steps * batch_size` exceeds them.
        steps: optimizer steps.
        batch_size: sequences per step.
        lr: peak learning rate.
        seed: data order seed.
        progress: optional ``progress(step, total, loss)`` called after every step (1-based step).
        num_threads: torch threads while training (see `torch_threads`; 1 recommended on a shared CPU).
        responses: target response per record (e.g. `asp.demo.task.warm_start_responses` with shortcuts);
            None: `reference_response` of each record.
        stop: optional ``stop(step)`` called after every `stop_every`-th step from `stop_from` on and after the
            last (the model in eval mode under ``torch.no_grad``, e.g. a validation reward); True ends the warm
            start at that step.
            The learning-rate schedule stays the one of `steps` (stopping early leaves a higher rate behind).
        stop_every: steps between calls of `stop` (needs `stop`; 0: never).
        stop_from: first step at which `stop` may be called.

    Returns:
        ``{"loss": [per-step mean response-token loss], "seconds": wall time, "tokens": tokens seen,
        "steps": optimizer steps taken}``.
    """
    if steps < 1 or batch_size < 1 or not records:
        raise ValueError(f"need steps >= 1, batch_size >= 1 and records, got {steps}, {batch_size}, {len(records)}")
    if stop_every < 0 or (stop is not None and stop_every < 1):
        raise ValueError(f"stop needs stop_every >= 1, got {stop_every}")
    t0 = time.perf_counter()
    examples = _examples(tokenizer, records, responses)
    rng = np.random.default_rng(seed)
    order = _batches(np.array([len(e[0]) for e in examples]), batch_size, steps, rng)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.01)
    warmup = max(1, steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min((s + 1) / warmup, 0.05 + 0.475 * (1 + math.cos(math.pi * min(s, steps) / steps)))
    )
    model.train()
    losses, tokens = [], 0
    with torch_threads(num_threads):
        for step, idx in enumerate(order, start=1):
            batch = _collate([examples[i] for i in idx], tokenizer.pad_token_id)
            loss = model(**batch).loss
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            losses.append(float(loss.detach()))
            tokens += int(batch["attention_mask"].sum())
            if progress is not None:
                progress(step, steps, losses[-1])
            if stop is not None and step >= stop_from and (step % stop_every == 0 or step == steps):
                model.eval()
                with torch.no_grad():
                    done = stop(step)
                model.train()
                if done:
                    break
    model.eval()
    return {"loss": losses, "seconds": time.perf_counter() - t0, "tokens": tokens, "steps": len(losses)}


def sample_responses(
    model: Qwen2ForCausalLM,
    tokenizer: PreTrainedTokenizerBase,
    problems: Sequence[str],
    *,
    n_samples: int,
    temperature: float,
    max_new_tokens: int,
    seed: int,
    batch_size: int,
) -> list[list[tuple[str, int, bool]]]:
    """Sample `n_samples` responses per problem with `model.generate` (pure sampling: no top-k / top-p).

    Prompts are chat-formatted, grouped by prompt length and batched `batch_size` at a time (left-padded), so one
    `generate` call decodes ``batch_size * n_samples`` sequences. Small batches (16 prompts) are fastest on a CPU:
    a rare runaway sample keeps its whole batch decoding.

    Returns:
        Per problem (input order), `n_samples` tuples ``(text, n_tokens, truncated)``: the decoded response
        without special tokens, its length in tokens counting the EOS when present, and whether it hit
        `max_new_tokens` without an EOS.
    """
    torch.manual_seed(seed)
    ids = [prompt_ids(tokenizer, p) for p in problems]
    order = np.argsort([len(x) for x in ids], kind="stable")
    out: list[list[tuple[str, int, bool]]] = [[] for _ in problems]
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    for s in range(0, len(order), batch_size):
        chunk = order[s : s + batch_size]
        batch = {"input_ids": [ids[i] for i in chunk]}
        enc = tokenizer.pad(batch, padding=True, padding_side="left", return_tensors="pt")
        with torch.no_grad():
            gen = model.generate(
                **enc,
                do_sample=True,
                temperature=temperature,
                top_k=0,
                top_p=1.0,
                max_new_tokens=max_new_tokens,
                num_return_sequences=n_samples,
                eos_token_id=eos,
                pad_token_id=pad,
            )
        new = gen[:, enc["input_ids"].shape[1] :].tolist()
        for j, seq in enumerate(new):
            n = seq.index(eos) + 1 if eos in seq else len(seq)
            text = tokenizer.decode(seq[:n], skip_special_tokens=True)
            out[chunk[j // n_samples]].append((text, n, eos not in seq[:n]))
    return out


Score = Callable[[list[str], list[Any], list[Any]], np.ndarray]  # (texts, answers, problems) -> (S,) rewards


@dataclass
class Scored:
    """Responses sampled for task records and their rewards (`sample_and_score`).

    Attributes:
        samples: per record (input order), its `sample_responses` tuples ``(text, n_tokens, truncated)``.
        rewards: (records * n_samples,) reward of each response, record-major (the order of `samples` flattened).
        seconds: wall time of the sampling (not the scoring).
    """

    samples: list[list[tuple[str, int, bool]]]
    rewards: np.ndarray
    seconds: float


def demo_score(texts: list[str], answers: list[Any], problems: list[Any]) -> np.ndarray:
    """The demo task's verifier (`asp.demo.task.reward`, which never raises) on each response."""
    return np.asarray([reward(text, answer) for text, answer in zip(texts, answers, strict=True)], dtype=np.float64)


def sample_and_score(
    model: Qwen2ForCausalLM,
    tokenizer: PreTrainedTokenizerBase,
    records: Sequence[dict],
    *,
    n_samples: int,
    temperature: float,
    max_new_tokens: int,
    seed: int,
    batch_size: int,
    num_threads: int | None = None,
    score: Score = demo_score,
) -> Scored:
    """Sample `n_samples` responses per task record (``problem``, ``answer``) with `sample_responses`, with
    `num_threads` torch threads (`torch_threads`), then score each with `score` (texts, the records' answers and
    problems, one per response; default: the demo task's verifier). Used by `evaluate_policy` and by the held-out
    reward (`asp.trainers.heldout.heldout_rewards`)."""
    t0 = time.perf_counter()
    with torch_threads(num_threads):
        samples = sample_responses(
            model,
            tokenizer,
            [r["problem"] for r in records],
            n_samples=n_samples,
            temperature=temperature,
            max_new_tokens=max_new_tokens,
            seed=seed,
            batch_size=batch_size,
        )
    seconds = time.perf_counter() - t0
    texts = [text for ss in samples for text, _, _ in ss]
    answers = [r["answer"] for r, ss in zip(records, samples, strict=True) for _ in ss]
    problems = [r["problem"] for r, ss in zip(records, samples, strict=True) for _ in ss]
    return Scored(samples, score(texts, answers, problems), seconds)


def evaluate_policy(
    model: Qwen2ForCausalLM,
    tokenizer: PreTrainedTokenizerBase,
    records: Sequence[dict],
    *,
    n_samples: int,
    temperature: float,
    max_new_tokens: int,
    seed: int,
    batch_size: int,
    num_threads: int | None = None,
) -> dict:
    """Sample responses and measure length tracking and reward.

    Args:
        model: the policy (any causal LM that `generate`s).
        tokenizer: its tokenizer, with the demo chat template.
        records: task records (``problem``, ``answer``) of the demo task.
        n_samples: responses per prompt.
        temperature: sampling temperature (pure sampling otherwise).
        max_new_tokens: response cap; responses that hit it without EOS count as truncated.
        seed: sampling seed.
        batch_size: prompts per `generate` call (see `sample_responses`).
        num_threads: torch threads while sampling (see `torch_threads`).

    Returns:
        ``spearman`` (intended length vs sampled length in tokens, over all samples; NaN when either is
        constant), ``mean_reward``,
        ``mean_length`` / ``max_length`` (tokens, EOS included), ``truncation_rate``, ``tokens_per_s``
        (generated tokens per wall second), ``seconds`` and ``n`` (samples).
    """
    if not records or n_samples < 1:
        raise ValueError(f"need records and n_samples >= 1, got {len(records)} records, n_samples={n_samples}")
    scored = sample_and_score(
        model,
        tokenizer,
        records,
        n_samples=n_samples,
        temperature=temperature,
        max_new_tokens=max_new_tokens,
        seed=seed,
        batch_size=batch_size,
        num_threads=num_threads,
    )
    samples, rewards, seconds = scored.samples, scored.rewards, scored.seconds
    intended = [intended_length(r) for r, ss in zip(records, samples, strict=True) for _ in ss]
    lengths = np.array([n for ss in samples for _, n, _ in ss], dtype=float)
    truncated = [t for ss in samples for _, _, t in ss]
    defined = len(set(intended)) > 1 and np.ptp(lengths) > 0
    rho = spearmanr(intended, lengths).statistic if defined else float("nan")
    return {
        "spearman": float(rho),
        "mean_reward": float(np.mean(rewards)),
        "mean_length": float(lengths.mean()),
        "max_length": int(lengths.max()),
        "truncation_rate": float(np.mean(truncated)),
        "tokens_per_s": float(lengths.sum() / seconds),
        "seconds": seconds,
        "n": int(lengths.size),
    }
