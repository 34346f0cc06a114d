"""One prepared GPU check: measured peak memory and speed of what users run, next to `asp plan memory`'s estimate.

On one NVIDIA GPU, with randomly initialised models built in code from the built-in architecture dims
(`asp.sim.memory.BUILTIN`; no weights, no hub, no vLLM), it runs the project's own code paths and prints a table:

* ``grpo-1.5b`` / ``grpo-8b``: `GRPOTrainer.step` (asp.trainers.grpo) on a Qwen2.5-1.5B-shaped and a Qwen3-8B-shaped
  policy with the ``configs/gpu-cluster.yaml`` settings at world_size 1 (bf16 FSDP2 mixed precision on one rank,
  activation checkpointing, bf16 autocast, micro_batch_tokens 10240): peak ``torch.cuda.max_memory_allocated``
  over the timed steps against the estimate that ``asp plan memory`` prints for the same settings
  (`asp.steps.memory_check.memory_report`; its total includes ``reserve_gib`` for the CUDA context and
  fragmentation, which max_memory_allocated does not see, so the ratio column divides by the estimate without it);
* ``predictor``: `train_predictor` (asp.predictor.train) on `LengthPredictor` (LoRA, peft) over a
  Qwen2.5-1.5B-shaped backbone with the preset's predictor settings: peak memory and prompts/s;
* ``generate``: `HFEngine.generate` (asp.rollout.hf) on the 1.5B shape at the preset's profiling batch size
  (profile.minibatch_prompts x profile.n_samples sequences): generated tokens/s.

Sizes, chosen so the whole run stays under 8 minutes on one GPU (a guess from the sizes, a few minutes on an
H100/H200: the script has not run on a GPU yet, see the README):

* GRPO: each micro-batch is exactly micro_batch_tokens padded tokens (n_samples rows of micro_batch_tokens /
  n_samples tokens: 1/10 prompt, the rest response), two micro-batches per step (gradient accumulation), one
  untimed warm-up step (it allocates the AdamW state), then 3 timed steps; weight export is off during the check
  (snapshot_interval past the last step: T_save is the runtime's own metric). A Qwen3-8B policy does not fit one
  GPU at world_size 1 (fp32 weights + gradients + AdamW = 16 bytes per parameter: 156 GiB by the estimate), so the
  8B shape keeps every width, the vocabulary and the untied embeddings but only as many of its 36 decoder layers
  as the estimate puts under ``--fit-fraction`` (0.8) of this device (by the estimate: 21 layers, 5.3B
  parameters, on a device of 139.8 GiB; 4 on one of 79.1 GiB; ``--layers-8b`` to choose);
* predictor: 256-token prompts, the preset's batch_size (16) and max_length, one warm-up epoch of one batch, then
  one timed epoch of 8 batches (prompts/s counts that epoch's training plus its 2-prompt validation pass);
* generate: 128-token prompts, 256 new tokens (the preset's 8,192 would not fit the time), one warm-up call.

Random checkpoints are initialised on the GPU in bf16 and saved to /dev/shm when it has room (else the temporary
directory or ``--tmp``); the trainer loads them as the launch stage loads a policy (fp32 master weights). Each
part frees its memory before the next (del, gc, torch.cuda.empty_cache, reset_peak_memory_stats); an
out-of-memory error or any other failure is recorded in its row and the next part runs (exit code 1 at the end).
Parts not started within ``--budget-s`` (300 s) are marked skipped, so the table is always written.

Run on a lent GPU, from the repository root (one command; the hard timeout leaves a minute of slack)::

    timeout 540 python scripts/gpu_check.py --out outputs/gpu_check

(with the device tool: command ``timeout 540 python scripts/gpu_check.py --out $OUT/gpu_check``, timeout_s 600).
It needs torch (CUDA), transformers, peft, numpy and scipy (the predictor's Kendall tau), plus the project's own
light imports pydantic and pyyaml; safetensors and tokenizers come with transformers. The project itself need not
be installed: ``src/`` is put on ``sys.path``. Bring the wheels of whichever is missing (pydantic needs
pydantic-core, annotated-types, typing-inspection and typing-extensions; peft needs accelerate, psutil and
safetensors) and install them first: ``pip install --no-index --find-links wheels/ peft pydantic scipy``.

CPU dry run (tiny shapes of the same architectures, same code paths, 20-40 s; tests/test_gpu_check.py runs it)::

    python scripts/gpu_check.py --dry-run --out outputs/gpu_check_dry

The table goes to stdout and to ``<out>.md`` and ``<out>.json`` (both written to temporary files, then renamed;
default ``outputs/gpu_check``, ignored by git). Without ``--dry-run`` and without CUDA the script exits 2 and
says so.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import json
import math
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "src") not in sys.path:  # run from a checkout without installing the project
    sys.path.insert(0, str(ROOT / "src"))

PARTS = ("grpo-1.5b", "predictor", "generate", "grpo-8b")
POLICY_SHAPES = {"grpo-1.5b": "qwen2.5-1.5b", "grpo-8b": "qwen3-8b"}
BACKBONE = "qwen2.5-1.5b"


@dataclasses.dataclass(frozen=True)
class Sizes:
    """What one run measures (GPU sizes by default; `DRY` for the CPU dry run)."""

    device: str = "cuda"
    tiny: bool = False
    micro_batch_tokens: int | None = None  # None: the preset's
    micro_batches: int = 2  # per GRPO step
    timed_steps: int = 3
    predictor_prompt_tokens: int = 256
    predictor_batches: int = 8
    gen_prompt_tokens: int = 128
    gen_new_tokens: int = 256
    gen_prompts: int | None = None  # None: profile.minibatch_prompts
    gen_n: int | None = None  # None: profile.n_samples


DRY = Sizes(
    device="cpu",
    tiny=True,
    micro_batch_tokens=128,
    timed_steps=2,
    predictor_prompt_tokens=24,
    predictor_batches=2,
    gen_prompt_tokens=12,
    gen_new_tokens=8,
    gen_prompts=4,
    gen_n=2,
)


@dataclasses.dataclass
class Row:
    """One measured part: memory in bytes (None: not measured), seconds per step / call, throughput."""

    part: str
    shape: str
    settings: str = ""
    peak_allocated: int | None = None
    peak_reserved: int | None = None
    estimate: int | None = None
    estimate_reserve: int | None = None
    seconds: float | None = None
    throughput: str = ""
    status: str = "ok"
    details: dict[str, Any] = dataclasses.field(default_factory=dict)


# ---- settings: params.yaml + configs/gpu-cluster.yaml, validated by the project's own config -----------------------


def preset_params(overrides: dict[str, Any]) -> Any:
    """params.yaml with configs/gpu-cluster.yaml overlaid (as `asp plan memory -c gpu-cluster`), then `overrides`
    (dotted keys), validated."""
    from asp.config import deep_merge, read_yaml, validate_params

    raw = deep_merge(read_yaml(ROOT / "params.yaml"), read_yaml(ROOT / "configs" / "gpu-cluster.yaml"))
    for dotted, value in overrides.items():
        *parents, key = dotted.split(".")
        node = raw
        for p in parents:
            node = node.setdefault(p, {})
        node[key] = value
    return validate_params(raw, "params.yaml + configs/gpu-cluster.yaml + gpu_check overrides")


def run_overrides(sizes: Sizes, device_gib: float) -> dict[str, Any]:
    """The check's changes to the preset: one trainer rank on this device; tiny token counts in a dry run."""
    out: dict[str, Any] = {"runtime.grpo.world_size": 1, "runtime.memory.device_gib": round(device_gib, 1)}
    for key in ("runtime.grpo.device", "predictor.device", "profile.engine.device", "runtime.engine.device"):
        out[key] = sizes.device
    if sizes.micro_batch_tokens is not None:  # the estimate's longest row must not exceed the dry run's micro-batch
        out["runtime.grpo.micro_batch_tokens"] = sizes.micro_batch_tokens
        out["runtime.engine.vllm.max_model_len"] = sizes.micro_batch_tokens
        out["runtime.sampling.max_new_tokens"] = sizes.micro_batch_tokens // 2
    return out


# ---- models: random init from the built-in architecture dims, saved as a local checkpoint --------------------------


def tiny(arch: Any) -> Any:
    """The same architecture family (bias, qk-norm, tying) at toy sizes for the CPU dry run."""
    return dataclasses.replace(
        arch, vocab_size=512, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
        intermediate_size=128, max_position_embeddings=4096,
    )  # fmt: skip


def hf_config(arch: Any) -> Any:
    """A transformers Qwen2/Qwen3 config with `arch`'s dims; checked to read back as `arch` (`from_hf_config`)."""
    from transformers import Qwen2Config, Qwen3Config

    from asp.demo.tokenizer import build_tokenizer
    from asp.sim.memory import from_hf_config

    tok = build_tokenizer()
    common = dict(
        vocab_size=arch.vocab_size, hidden_size=arch.hidden_size, intermediate_size=arch.intermediate_size,
        num_hidden_layers=arch.num_layers, num_attention_heads=arch.num_heads, num_key_value_heads=arch.num_kv_heads,
        max_position_embeddings=arch.max_position_embeddings, tie_word_embeddings=arch.tie_word_embeddings,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
    )  # fmt: skip
    if arch.qk_norm:
        config = Qwen3Config(head_dim=arch.head_dim, attention_bias=arch.attention_bias, **common)
    else:
        config = Qwen2Config(**common)
    back = from_hf_config(config.to_dict())
    if back != arch:
        raise RuntimeError(f"the built config reads back as {back}, not {arch}")
    return config


def build_checkpoint(arch: Any, out: Path, device: str) -> Path:
    """Save a randomly initialised bf16 causal LM of `arch` and the demo tokenizer into `out` (a local checkpoint)."""
    import torch
    from transformers import AutoModelForCausalLM

    from asp.demo.tokenizer import build_tokenizer

    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(hf_config(arch), dtype=torch.bfloat16)
    model.save_pretrained(out)
    build_tokenizer().save_pretrained(out)
    del model
    free_memory()
    return out


def scratch_dir(need_bytes: int, base: str | None) -> Path:
    """A temporary directory for checkpoints: `base`, else /dev/shm when it has room (fast), else the system's."""
    if base is None and Path("/dev/shm").is_dir() and shutil.disk_usage("/dev/shm").free > 2 * need_bytes:
        base = "/dev/shm"
    return Path(tempfile.mkdtemp(prefix="asp-gpu-check-", dir=base))


def fit_layers(arch: Any, settings: Any, capacity: int, fraction: float) -> int:
    """The most decoder layers of `arch` whose trainer estimate stays under `fraction` of `capacity` bytes (>= 1)."""
    from asp.sim.memory import trainer_memory

    best = 1
    for layers in range(1, arch.num_layers + 1):
        if trainer_memory(dataclasses.replace(arch, num_layers=layers), settings).device_total <= fraction * capacity:
            best = layers
    return best


# ---- measuring ------------------------------------------------------------------------------------------------------


def free_memory() -> None:
    """Collect garbage and give cached CUDA blocks back (on the CPU refcounting frees the tensors already)."""
    import torch

    if torch.cuda.is_available():
        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


@contextlib.contextmanager
def peak(row: Row, device: str) -> Iterator[None]:
    """Record the CUDA peak (allocated, reserved) of the block into `row`; nothing on the CPU."""
    import torch

    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    yield
    if cuda:
        torch.cuda.synchronize()
        row.peak_allocated = torch.cuda.max_memory_allocated()
        row.peak_reserved = torch.cuda.max_memory_reserved()


def sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def text_of(tokens: int, seed: int) -> str:
    """A prompt of exactly `tokens` demo-tokenizer tokens (one token per ASCII character)."""
    import numpy as np

    letters = np.random.default_rng(seed).integers(97, 123, tokens)
    return "".join(map(chr, letters))


def grpo_batch(step: int, prompts: dict[int, str], n: int, response: int, vocab: int) -> Any:
    """One GlobalBatch through the runtime's own path (engine results -> pack_output -> TrainingQueue.take).

    Responses are random demo-tokenizer byte tokens of exactly `response` tokens; behaviour log-probs are those of
    a uniform policy over `vocab` (about what a random init gives); half the samples are correct for the math reward.
    """
    import numpy as np

    from asp.control.messages import WorkItem
    from asp.control.queue import TrainingQueue
    from asp.rollout.base import PromptResult, Sample
    from asp.runtime.generation import pack_output

    rng = np.random.default_rng(step)
    lp = [-math.log(vocab)] * response

    def sample(s: int) -> Sample:
        return Sample(rng.integers(6, 262, response).tolist(), r"\boxed{1}" if s % 2 else "no", response, "length", lp)

    results = [PromptResult(i, [sample(s) for s in range(n)], len(t)) for i, t in enumerate(prompts.values())]
    item = WorkItem(step, step, 0, 0, list(prompts), list(prompts.values()), step)
    queue = TrainingQueue(len(prompts), n)
    queue.put(pack_output(item, results, n, gu=0, actor=0, version=0, start=0.0, end=1.0), now=0.0)
    return queue.take(step, now=1.0)[0]


@contextlib.contextmanager
def process_group(spec: Any) -> Iterator[None]:
    """A one-rank torch.distributed group when the trainer needs one (FSDP2 mixed precision), as the runtime's
    `TrainingUnit` starts it (`asp.runtime.trainer.init_process_group`)."""
    import torch

    from asp.runtime.trainer import free_port, init_process_group

    if not spec.needs_process_group:
        yield
        return
    init_process_group("127.0.0.1", free_port(), 0, 1, spec.backend, 300.0)
    try:
        yield
    finally:
        torch.distributed.destroy_process_group()


def grpo_part(row: Row, model_dir: Path, params: Any, sizes: Sizes) -> None:
    """Warm-up step, then timed `GRPOTrainer.step`s; the estimate of `asp plan memory` for the same settings."""
    from asp.steps.memory_check import memory_report
    from asp.trainers.grpo import GRPOSpec

    report = memory_report(params)
    row.estimate, row.estimate_reserve = report.trainer.device_total, report.trainer.device["reserve"]
    ts = report.trainer_settings
    row.details.update(
        architecture=dataclasses.asdict(report.arch),
        trainer_settings=dataclasses.asdict(ts),
        estimate_components=dict(report.trainer.device),
    )
    g = params.runtime.grpo
    cfg = g.model_copy(update={"snapshot_interval": 10**9, "transport": "object_store", "snapshot_dir": None})
    n = params.runtime.sampling.n_samples
    row_tokens = g.micro_batch_tokens // n
    prompt_tokens = max(2, row_tokens // 10)
    prompts = {p: text_of(prompt_tokens, p) for p in range(sizes.micro_batches)}
    rt = params.runtime
    spec = GRPOSpec(
        str(model_dir), prompts, dict.fromkeys(prompts, "1"), cfg, "math",
        temperature=rt.sampling.temperature, seed=0, checkpoint_interval=rt.checkpoint_interval,
    )  # fmt: skip
    row.settings = (
        f"world_size 1, {g.mixed_precision} mixed precision, autocast {g.autocast_dtype}, activation checkpointing "
        f"{'on' if g.activation_checkpointing else 'off'}, micro_batch_tokens {g.micro_batch_tokens} "
        f"({n} rows x {row_tokens}), {sizes.micro_batches} micro-batches/step"
    )
    vocab = report.arch.vocab_size
    with process_group(spec):
        start = time.perf_counter()
        trainer = spec()
        row.details["load_s"] = time.perf_counter() - start
        trainer.step(grpo_batch(1, prompts, n, row_tokens - prompt_tokens, vocab))  # warm-up: AdamW state
        times, metrics = [], {}
        with peak(row, sizes.device):
            for step in range(2, 2 + sizes.timed_steps):
                batch = grpo_batch(step, prompts, n, row_tokens - prompt_tokens, vocab)
                t0 = time.perf_counter()
                metrics = trainer.step(batch).metrics
                sync(sizes.device)
                times.append(time.perf_counter() - t0)
        del trainer
        free_memory()
    check_grpo_metrics(metrics, sizes.micro_batches)
    row.seconds = sum(times) / len(times)
    tokens = sizes.micro_batches * n * row_tokens
    row.throughput = f"{tokens / row.seconds:,.0f} padded tokens/s"
    row.details.update(step_s=times, padded_tokens_per_step=tokens, last_metrics=metrics)


def check_grpo_metrics(m: dict[str, float], micro_batches: int) -> None:
    """The timed steps must be real updates of the planned size (else the numbers would mean nothing)."""
    problems = []
    if m.get("train/micro_batches") != micro_batches:
        problems.append(f"{m.get('train/micro_batches')} micro-batches, expected {micro_batches}")
    if not math.isfinite(m.get("train/loss", math.nan)) or not math.isfinite(m.get("train/grad_norm", math.nan)):
        problems.append(f"loss {m.get('train/loss')}, grad norm {m.get('train/grad_norm')}")
    if m.get("train/prompt_token_mismatch"):
        problems.append("prompt tokens differ from the batch's prompt_tokens")
    if problems:
        raise RuntimeError("GRPO step did not run as planned: " + "; ".join(problems))


def predictor_part(row: Row, model_dir: Path, params: Any, sizes: Sizes) -> None:
    """`train_predictor` for one epoch: a one-batch warm-up, then `predictor_batches` timed batches."""
    import numpy as np

    from asp.predictor.model import LengthPredictor, encode_texts, load_backbone
    from asp.predictor.train import train_predictor

    p = params.predictor
    bb = load_backbone(model_dir, kind=p.kind, max_length=p.max_length, dtype=p.dtype)
    model = LengthPredictor(  # as the train_predictor stage's build_predictor builds it
        bb, lora_r=p.lora.r, lora_alpha=p.lora.alpha, lora_dropout=p.lora.dropout,
        target_modules=p.lora.target_modules, head=p.head, pooling=p.pooling, truncation_side=p.truncation_side,
        seed=0,
    ).to(p.device)  # fmt: skip
    n_train = p.batch_size * sizes.predictor_batches
    texts = [text_of(sizes.predictor_prompt_tokens, 1000 + i) for i in range(n_train + 2)]
    lengths = np.random.default_rng(0).uniform(100, 8000, n_train + 2)
    tokens = [len(ids) for ids in encode_texts(bb.tokenizer, texts, p.max_length).input_ids]
    row.settings = (
        f"{p.dtype}, LoRA r {p.lora.r} on {','.join(model.spec.target_modules or ())}, batch_size {p.batch_size}, "
        f"{int(np.mean(tokens))}-token prompts (max_length {p.max_length}), loss {p.loss}"
    )
    kw = {"epochs": 1, "batch_size": p.batch_size, "lr": p.lr, "weight_decay": p.weight_decay, "loss": p.loss}
    kw.update(rank_weight=p.rank_weight, patience=1, batching=p.batching, lexical_weights=(0.0,), seed=0)
    k = p.batch_size
    train_predictor(model, bb.tokenizer, texts[:k], lengths[:k], texts[-2:], lengths[-2:], **kw)  # warm-up
    with peak(row, sizes.device):
        result = train_predictor(
            model, bb.tokenizer, texts[:n_train], lengths[:n_train], texts[-2:], lengths[-2:], **kw
        )
    epoch = result.history[0]
    row.seconds = epoch.seconds / sizes.predictor_batches
    row.throughput = f"{n_train / epoch.seconds:,.1f} prompts/s"
    trainable = sum(t.numel() for t in model.trainable_parameters())
    row.details.update(
        epoch_s=epoch.seconds, train_prompts=n_train, trainable_params=trainable, train_loss=epoch.train_loss
    )
    del model, bb
    free_memory()


def generate_part(row: Row, model_dir: Path, params: Any, sizes: Sizes) -> None:
    """`HFEngine.generate` of one profiling minibatch after a small warm-up call."""
    from asp.rollout.base import SamplingParams
    from asp.rollout.hf import HFEngine

    pr = params.profile
    prompts_n, n = sizes.gen_prompts or pr.minibatch_prompts, sizes.gen_n or pr.n_samples
    engine = HFEngine(model_dir, device=pr.engine.device, dtype=pr.engine.dtype)
    prompts = [text_of(sizes.gen_prompt_tokens, 2000 + i) for i in range(prompts_n)]
    row.settings = (
        f"{pr.engine.dtype}, {prompts_n} prompts x n {n} = {prompts_n * n} sequences, {sizes.gen_prompt_tokens}-token "
        f"prompts, max_new_tokens {sizes.gen_new_tokens}, temperature {pr.temperature}, top_p {pr.top_p}"
    )
    engine.generate(prompts[:1], SamplingParams(1, 4, seed=0, temperature=1.0, top_p=1.0))  # warm-up
    with peak(row, sizes.device):
        t0 = time.perf_counter()
        results = engine.generate(prompts, SamplingParams(n, sizes.gen_new_tokens, pr.temperature, pr.top_p, seed=0))
        sync(sizes.device)
        row.seconds = time.perf_counter() - t0
    tokens = sum(s.length for r in results for s in r.samples)
    row.throughput = f"{tokens / row.seconds:,.0f} generated tokens/s"
    row.details.update(generated_tokens=tokens, sequences=prompts_n * n)
    engine.close()
    del engine
    free_memory()


# ---- the run ---------------------------------------------------------------------------------------------------


def part_arch(part: str, sizes: Sizes, params: Any, args: argparse.Namespace, capacity: int) -> tuple[Any, str]:
    """The architecture a part builds and its label (tiny in a dry run; the 8B with as many layers as fit)."""
    from asp.sim.memory import BUILTIN
    from asp.steps.memory_check import trainer_settings

    name = POLICY_SHAPES.get(part, BACKBONE)
    full = BUILTIN[name]
    if sizes.tiny:
        arch = tiny(full)
        return (
            arch,
            f"{name} family, tiny (hidden {arch.hidden_size}, {arch.num_layers} layers, vocab {arch.vocab_size})",
        )
    if part != "grpo-8b":
        return full, f"{name} ({full.num_params / 1e9:.2f}B, random init)"
    layers = args.layers_8b or fit_layers(full, trainer_settings(params), capacity, args.fit_fraction)
    arch = dataclasses.replace(full, num_layers=min(layers, full.num_layers))
    return arch, f"{name} widths, {arch.num_layers} of {full.num_layers} layers ({arch.num_params / 1e9:.2f}B)"


def run_parts(args: argparse.Namespace, sizes: Sizes, device_gib: float, log: Callable[[str], None]) -> list[Row]:
    """Build each part's checkpoint (once per architecture), measure it, record failures; always clean up."""
    import torch

    base = run_overrides(sizes, device_gib)
    params = preset_params(base)
    capacity = int(device_gib * 2**30)
    started, rows, dirs = time.perf_counter(), [], {}
    work = scratch_dir(16 * 2**30 if not sizes.tiny else 0, args.tmp)
    try:
        for part in args.parts:
            arch, label = part_arch(part, sizes, params, args, capacity)
            row = Row(part, label)
            rows.append(row)
            if time.perf_counter() - started > args.budget_s:
                row.status = f"skipped: past the {args.budget_s:.0f} s budget"
                continue
            t0 = time.perf_counter()
            log(f"[{t0 - started:6.1f} s] {part}: {label}")
            try:
                if arch not in dirs:
                    dirs[arch] = build_checkpoint(arch, work / f"m{len(dirs)}", sizes.device)
                over = {"policy.source": "path", "policy.path": str(dirs[arch]), "runtime.memory.architecture": None}
                part_params = preset_params({**base, **over})
                runner = (
                    grpo_part if part.startswith("grpo") else {"predictor": predictor_part}.get(part, generate_part)
                )
                runner(row, dirs[arch], part_params, sizes)
            except torch.cuda.OutOfMemoryError as exc:
                row.status = "OOM"
                row.details["error"] = str(exc)[:1000]
            except Exception as exc:  # noqa: BLE001 - one failed part must not lose the others' numbers
                import traceback

                traceback.print_exc()
                row.status = f"error: {type(exc).__name__}: {exc}"[:300]
            finally:
                free_memory()
                row.details["wall_s"] = time.perf_counter() - t0
            log(f"[{time.perf_counter() - started:6.1f} s] {part}: {row.status} ({row.details['wall_s']:.1f} s)")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return rows


def fmt_bytes(n: int | None, cpu: bool) -> str:
    if n is None:
        return "n/a (CPU run)" if cpu else "-"
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 / 10 else f"{n / 2**20:.1f} MiB"


def format_table(rows: list[Row], header: dict[str, Any], cpu: bool) -> str:
    """Markdown: one line per part, then each part's settings."""
    lines = [f"gpu_check: {', '.join(f'{k} {v}' for k, v in header.items())}", ""]
    lines += [
        "| part | shape | peak allocated | peak reserved | estimate (asp plan memory) | estimate without reserve | "
        "allocated / estimate without reserve | s per step or call | throughput | status |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        without = None if r.estimate is None else r.estimate - (r.estimate_reserve or 0)
        ratio = f"{r.peak_allocated / without:.2f}" if r.peak_allocated and without else "-"
        secs = "-" if r.seconds is None else f"{r.seconds:.3f}"
        cells = [r.part, r.shape, fmt_bytes(r.peak_allocated, cpu), fmt_bytes(r.peak_reserved, cpu)]
        cells += [fmt_bytes(r.estimate, False), fmt_bytes(without, False), ratio, secs, r.throughput or "-", r.status]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    lines += [f"- {r.part}: {r.settings}" for r in rows if r.settings]
    return "\n".join(lines)


def finite(obj: Any) -> Any:
    """`obj` with non-finite floats as None (strict JSON)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [finite(v) for v in obj]
    return obj


def write_outputs(out: Path, table: str, record: dict[str, Any]) -> tuple[Path, Path]:
    """`<out>.md` and `<out>.json`: both written to temporary files first, then renamed into place.

    (Not `asp.io.atomic_paths`: asp.io imports pandas, which a bare GPU machine may lack.)
    """
    md, js = out.with_name(out.name + ".md"), out.with_name(out.name + ".json")
    texts = {md: table + "\n", js: json.dumps(finite(record), indent=2, sort_keys=True, default=str) + "\n"}
    out.parent.mkdir(parents=True, exist_ok=True)
    tmps: list[tuple[str, Path]] = []
    try:
        for path, text in texts.items():
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
            tmps.append((tmp, path))
            with os.fdopen(fd, "w") as f:
                f.write(text)
        for tmp, path in tmps:
            os.replace(tmp, path)
    finally:
        for tmp, _ in tmps:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
    return md, js


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU (same code paths)")
    p.add_argument("--out", type=Path, default=None, help="output stem: writes OUT.md and OUT.json")
    p.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated subset of {','.join(PARTS)}")
    p.add_argument("--layers-8b", type=int, default=None, help="decoder layers of the 8B shape (default: fit)")
    p.add_argument("--fit-fraction", type=float, default=0.8, help="8B layers: estimate under this share of the GPU")
    p.add_argument("--budget-s", type=float, default=300.0, help="do not start a part after this many seconds")
    p.add_argument("--tmp", default=None, help="directory for the random checkpoints (default /dev/shm or TMPDIR)")
    args = p.parse_args(argv)
    args.parts = [s.strip() for s in args.parts.split(",") if s.strip()]
    unknown = [s for s in args.parts if s not in PARTS]
    if unknown or not args.parts:
        p.error(f"--parts: unknown {unknown}; choose from {', '.join(PARTS)}")
    if args.out is None:
        args.out = ROOT / "outputs" / ("gpu_check_dry" if args.dry_run else "gpu_check")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from asp.env import set_offline_defaults

    set_offline_defaults()
    import torch

    if not args.dry_run and not torch.cuda.is_available():
        print(
            "error: no CUDA device is available (torch.cuda.is_available() is False), so the GPU check cannot run. "
            "Run it on a machine with an NVIDIA GPU and a CUDA build of torch, or use --dry-run for the CPU dry run "
            "with tiny shapes.",
            file=sys.stderr,
        )
        return 2
    import peft
    import transformers

    sizes = DRY if args.dry_run else Sizes()
    if args.dry_run:
        torch.set_num_threads(1)  # toy-sized ops: one thread is fastest, and the test machine is shared
    cuda = sizes.device.startswith("cuda")
    device_gib = torch.cuda.get_device_properties(0).total_memory / 2**30 if cuda else 80.0
    header = {
        "mode": "CPU dry run (tiny shapes)" if args.dry_run else "GPU",
        "device": torch.cuda.get_device_name(0) if cuda else "cpu",
        "device_gib": round(device_gib, 1),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "peft": peft.__version__,
    }
    started = time.perf_counter()
    rows = run_parts(args, sizes, device_gib, lambda msg: print(msg, file=sys.stderr, flush=True))
    header["wall_s"] = round(time.perf_counter() - started, 1)
    table = format_table(rows, header, cpu=not cuda)
    print(table)
    record = {**header, "parts": [dataclasses.asdict(r) for r in rows], "table": table}
    md, js = write_outputs(args.out, table, record)
    print(f"wrote {md} and {js}", file=sys.stderr)
    return 0 if all(r.status == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
