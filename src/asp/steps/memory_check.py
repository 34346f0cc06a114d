"""Params -> the memory estimate of `asp.sim.memory`: resolve the policy's architecture, build the trainer and
vLLM settings, format the table, and refuse a layout that cannot fit.

Used by ``asp plan memory``, ``asp params check`` and the top of the launch stage (not a stage itself). The
architecture is ``runtime.memory.architecture`` (a built-in name), else the policy's ``config.json`` at
``policy.path`` (``policy.source: path``), else the demo policy's ``policy.demo`` shapes with the demo tokenizer's
vocabulary (``policy.source: build``). The check is enforced on CUDA devices only: a CPU trainer (the demo) gets
the estimate and a note. Tests: tests/steps/test_memory_check.py.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, replace
from pathlib import Path

from asp.config import Params
from asp.errors import UserError
from asp.sim.architecture import BUILTIN, Architecture, from_hf_config
from asp.sim.memory import (
    GIB,
    MAX_WORLD_SIZE,
    GenerationEstimate,
    GenerationSettings,
    MemoryEstimate,
    TrainerSettings,
    generation_memory,
    generation_problem,
    gib,
    trainer_memory,
    trainer_problem,
)

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "auto": 2}
# asp.demo.tokenizer.VOCAB_SIZE (6 special tokens + 256 bytes), without importing transformers (3 s) for a
# number; tests/steps/test_memory_check.py checks they agree.
DEMO_VOCAB_SIZE = 262


@dataclass(frozen=True)
class MemoryReport:
    """The estimate for one params file; `problems` are enforced, `notes` are printed only."""

    source: str
    arch: Architecture
    trainer: MemoryEstimate | None
    generation: GenerationEstimate | None
    trainer_settings: TrainerSettings | None
    generation_settings: GenerationSettings | None
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def fits(self) -> bool:
        return not self.problems


def _demo_architecture(params: Params) -> Architecture:
    d = params.policy.demo
    return Architecture(
        vocab_size=DEMO_VOCAB_SIZE,
        hidden_size=d.hidden_size,
        num_layers=d.num_layers,
        num_heads=d.num_heads,
        num_kv_heads=d.num_heads,
        head_dim=d.hidden_size // d.num_heads,
        intermediate_size=d.intermediate_size,
        tie_word_embeddings=True,
        attention_bias=True,
        max_position_embeddings=d.max_position_embeddings,
    )


def read_config_json(path: Path) -> Architecture:
    """The architecture in a checkpoint's config.json (`OSError` / `ValueError` when unreadable or incomplete)."""
    return from_hf_config(json.loads(path.read_text()))


def resolve_architecture(params: Params) -> tuple[Architecture | None, str]:
    """(architecture, where it came from); (None, why) when the policy's config.json is not on this machine."""
    name = params.runtime.memory.architecture
    if name is not None:
        if name not in BUILTIN:
            raise UserError(
                f"runtime.memory.architecture = {name!r} is not a built-in architecture; use one of "
                f"{', '.join(BUILTIN)} (asp plan memory --list), or null to read the policy's config.json."
            )
        return BUILTIN[name], f"built-in {name}"
    if params.policy.source == "build":
        return _demo_architecture(params), "demo policy (policy.demo)"
    config = Path(str(params.policy.path)) / "config.json"
    if not config.is_file():
        return None, f"{config} not found"
    try:
        return read_config_json(config), str(config)
    except (OSError, ValueError) as exc:
        return None, f"{config}: {exc}"


def trainer_settings(params: Params) -> TrainerSettings:
    """The Training Unit rank's settings; the longest row is max_model_len (vLLM) or max_new_tokens."""
    rt, g = params.runtime, params.runtime.grpo
    bf16 = g.mixed_precision == "bfloat16"
    longest = rt.engine.vllm.max_model_len if rt.engine.kind == "vllm" and rt.engine.vllm.max_model_len else 0
    return TrainerSettings(
        world_size=g.world_size,
        mixed_precision=bf16,
        compute_bytes=2 if bf16 or g.autocast_dtype else 4,
        activation_checkpointing=g.activation_checkpointing,
        cpu_offload=g.cpu_offload,
        micro_batch_tokens=g.micro_batch_tokens,
        longest_row_tokens=max(longest, rt.sampling.max_new_tokens),
        reference=g.kl_coef > 0,
        autocast=g.autocast_dtype is not None,
        device_gib=rt.memory.device_gib,
        reserve_gib=rt.memory.reserve_gib,
    )


def host_gib() -> float:
    """This machine's memory in GiB: the device of vLLM's CPU build (its KV cache lives in RAM)."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB


def device_gib(params: Params, device: str) -> float:
    """The memory of one generation device: this machine's RAM for a CPU engine, else runtime.memory.device_gib."""
    return host_gib() if device == "cpu" else params.runtime.memory.device_gib


def generation_settings(params: Params, arch: Architecture) -> GenerationSettings | None:
    """One vLLM instance's settings (None for the hf engine); max_model_len defaults to the model's context."""
    engine = params.runtime.engine
    if engine.kind != "vllm":
        return None
    seq = engine.vllm.max_model_len or arch.max_position_embeddings or params.runtime.sampling.max_new_tokens
    return GenerationSettings(
        dtype_bytes=DTYPE_BYTES[engine.dtype],
        tensor_parallel_size=engine.vllm.tensor_parallel_size,
        gpu_memory_utilization=engine.vllm.gpu_memory_utilization,
        max_seq_len=seq,
        device_gib=device_gib(params, engine.device),
        kv_cache_gib=engine.vllm.kv_cache_gib,
    )


def profile_kv_problem(params: Params) -> str | None:
    """The profile stage's vLLM engine asked for a KV cache larger than its device (RAM on a CPU), else None."""
    engine = params.profile.engine
    kv = engine.vllm.kv_cache_gib
    if engine.kind != "vllm" or kv is None:
        return None
    capacity = device_gib(params, engine.device)
    if kv < capacity:
        return None
    where = "this machine's memory" if engine.device == "cpu" else "runtime.memory.device_gib"
    return (
        f"profile engine: profile.engine.vllm.kv_cache_gib = {kv:g} GiB is not below {where} ({capacity:.1f} GiB), "
        "which also holds the weights. Lower profile.engine.vllm.kv_cache_gib."
    )


def memory_report(params: Params) -> MemoryReport | None:
    """The estimate, or None when the architecture cannot be resolved here (see `skip_note`)."""
    arch, source = resolve_architecture(params)
    if arch is None:
        return None
    rt = params.runtime
    ts = trainer_settings(params) if rt.trainer.kind == "grpo" else None
    gs = generation_settings(params, arch)
    problems, notes = [], []
    if ts is not None:
        problem = trainer_problem(arch, ts)
        if not rt.grpo.device.startswith("cuda"):
            notes.append(f"runtime.grpo.device is {rt.grpo.device!r}: the trainer estimate is shown, not enforced")
            notes += [problem] if problem else []
        elif problem:
            problems.append(problem)
    if gs is not None:
        problem = generation_problem(arch, gs)
        if problem:
            where = "runtime.engine.vllm" if gs.kv_cache_gib is not None else ""
            problems.append(problem.replace("(kv_cache_gib)", f"({where}.kv_cache_gib)") if where else problem)
    problem = profile_kv_problem(params)
    if problem:
        problems.append(problem)
    trainer = trainer_memory(arch, ts) if ts else None
    generation = generation_memory(arch, gs) if gs else None
    return MemoryReport(source, arch, trainer, generation, ts, gs, problems, notes)


def skip_note(params: Params) -> str:
    _, why = resolve_architecture(params)
    return (
        f"memory check skipped: the policy architecture is unknown here ({why}); set runtime.memory.architecture "
        f"to one of {', '.join(BUILTIN)} to check before the checkpoint is on disk."
    )


def _count(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e8 else f"{n / 1e6:.2f}M"


def _experts(a: Architecture) -> str:
    """For an MoE: the active parameters and the experts (every expert is stored and trained; tokens use k)."""
    if not a.is_moe:
        return ""
    shared = f" + a shared expert of {a.shared_expert_intermediate_size}" if a.shared_expert_intermediate_size else ""
    return (
        f" ({_count(a.active_params)} active per token: {a.experts_per_token} of {a.num_experts} experts of "
        f"{a.expert_intermediate_size}{shared} in {a.sparse_layers} of {a.num_layers} layers)"
    )


def _precision(s: TrainerSettings) -> str:
    if s.mixed_precision:
        return "bfloat16 mixed precision (fp32 master weights)"
    return "fp32 parameters, 16-bit autocast" if s.compute_bytes == 2 else "fp32"


def _cell(n: int | None) -> str:
    return "-" if n is None else gib(n)


def format_report(r: MemoryReport) -> str:
    """A Markdown table of GiB per component on the trainer device and the generation device, then the verdict."""
    a = r.arch
    lines = [
        f"policy: {r.source}: {_count(a.num_params)} parameters{_experts(a)}, vocab {a.vocab_size}, hidden "
        f"{a.hidden_size}, {a.num_layers} layers, {a.num_heads} heads / {a.num_kv_heads} kv heads",
    ]
    if r.trainer is not None and r.trainer_settings is not None:
        s = r.trainer_settings
        lines.append(
            f"trainer rank: world_size {s.world_size}, {_precision(s)}, activation checkpointing "
            f"{'on' if s.activation_checkpointing else 'off'}, cpu_offload {'on' if s.cpu_offload else 'off'}, "
            f"{s.tokens} tokens per micro-batch"
        )
        lines += ["| trainer component | device GiB | host GiB |", "|---|---|---|"]
        for key in dict.fromkeys([*r.trainer.device, *r.trainer.host]):
            lines.append(f"| {key} | {_cell(r.trainer.device.get(key))} | {_cell(r.trainer.host.get(key))} |")
        t = r.trainer
        verdict = "fits" if t.fits else "does NOT fit"
        lines.append(f"| total | {gib(t.device_total)} of {gib(t.capacity)} ({verdict}) | {gib(t.host_total)} |")
    if r.generation is not None and r.generation_settings is not None:
        g, gs = r.generation, r.generation_settings
        lines += [
            f"generation (vLLM, tensor_parallel_size {gs.tensor_parallel_size}, per GPU):",
            "| generation component | GiB |",
            "|---|---|",
            f"| budget ({_budget(gs)}) | {gib(g.budget)} |",
            f"| weights | {gib(g.weights)} |",
            f"| activations + CUDA graphs allowance | {gib(g.allowance)} |",
            f"| KV cache ({g.kv_bytes_per_token / 1024:.0f} KiB per token) | {gib(max(g.kv_cache, 0))} |",
            f"| {gs.max_seq_len}-token sequences that fit | {g.sequences} ({'fits' if g.fits else 'does NOT fit'}) |",
        ]
    lines += [f"note: {n}" for n in r.notes]
    lines.append("memory: fits" if r.fits else "memory: does NOT fit")
    return "\n".join(lines)


def _budget(gs: GenerationSettings) -> str:
    if gs.kv_cache_gib is not None:
        return f"weights + allowance + kv_cache_gib {gs.kv_cache_gib:g}, of {round(gs.device_gib, 1):g}"
    return f"gpu_memory_utilization {gs.gpu_memory_utilization} x {round(gs.device_gib, 1):g}"


def report_dict(r: MemoryReport) -> dict:
    """The report as JSON-ready numbers (bytes), for `asp plan memory --json`."""
    a = r.arch
    out: dict = {"source": r.source, "num_params": a.num_params, "active_params": a.active_params}
    out |= {"num_experts": a.num_experts, "experts_per_token": a.experts_per_token}
    out |= {"fits": r.fits, "problems": r.problems}
    if r.trainer is not None:
        out["trainer"] = {
            "device": r.trainer.device,
            "host": r.trainer.host,
            "device_total": r.trainer.device_total,
            "capacity": r.trainer.capacity,
        }
    if r.generation is not None:
        g = r.generation
        out["generation"] = {
            "budget": g.budget,
            "capacity": g.capacity,
            "weights": g.weights,
            "allowance": g.allowance,
            "kv_cache": g.kv_cache,
            "kv_bytes_per_token": g.kv_bytes_per_token,
            "max_seq_len": g.max_seq_len,
            "sequences": g.sequences,
        }
    out["notes"] = r.notes
    out["gib"] = GIB
    return out


def checked(params: Params) -> bool:
    """Whether the memory check has something to check: a GRPO trainer or a vLLM engine (runtime.memory.check on)."""
    uses_vllm = "vllm" in (params.runtime.engine.kind, params.profile.engine.kind)
    return params.runtime.memory.check and (params.runtime.trainer.kind == "grpo" or uses_vllm)


def enforce(params: Params) -> MemoryReport | None:
    """Raise `UserError` with the numbers and what to change when the run cannot fit (runtime.memory.check on)."""
    if not params.runtime.memory.check:
        return None
    report = memory_report(params)
    if report is not None and report.problems:
        devices = (params.runtime.grpo.device, params.runtime.engine.device, params.profile.engine.device)
        gpu = any(device.startswith("cuda") for device in devices)
        gib = f"runtime.memory.device_gib = {params.runtime.memory.device_gib:g}; " if gpu else ""
        raise UserError(
            f"the layout does not fit in memory ({gib}`asp plan memory` prints the table; runtime.memory.check: "
            "false skips this check):\n" + "\n".join(report.problems)
        )
    return report


def min_trainer_devices(params: Params) -> tuple[int, str] | None:
    """The smallest Training Unit world size whose rank fits on one device with the other ``runtime.grpo`` settings
    (None on a CPU trainer, without a resolvable architecture, or when none up to MAX_WORLD_SIZE fits), and why."""
    rt = params.runtime
    if rt.trainer.kind != "grpo" or not rt.grpo.device.startswith("cuda"):
        return None
    arch, source = resolve_architecture(params)
    if arch is None:
        return None
    base = trainer_settings(params)
    for n in range(1, MAX_WORLD_SIZE + 1):
        if trainer_memory(arch, replace(base, world_size=n)).fits:
            return n, f"asp plan memory ({source}): a rank fits from world_size {n}"
    return None
