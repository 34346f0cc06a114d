"""`GRPOConfig`: every knob of the GRPO Training Unit in one frozen, typed dataclass (``runtime.grpo:`` params).

`GRPOConfig.from_mapping(params)` rejects unknown keys and `validate()` raises `asp.errors.UserError`
naming ``runtime.grpo.<field>``, its value and what is allowed. Defaults suit the CPU demo. It lives outside
`asp.runtime` and `asp.rl` (and imports neither torch nor Ray) because `asp.config` types ``runtime.grpo`` with it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from asp.errors import UserError

AGGREGATIONS = ("token", "sequence")
ADVANTAGE_SCALES = ("std", "none")
LR_SCHEDULES = ("constant", "linear", "cosine")
TRANSPORTS = ("object_store", "files")
CONVERSIONS = ("identity", "bfloat16", "float16")


@dataclass(frozen=True, slots=True)
class GRPOConfig:
    """GRPO Training Unit settings (steps are trainer steps; times in seconds). Defaults: the CPU demo policy
    (measured in docs/grpo.md); for a multi-billion-parameter policy use e.g. lr 1e-6, token aggregation,
    clip_high 0.28, autocast_dtype bfloat16 on GPU.

    Attributes:
        reward: ``"auto"`` (the launch stage picks ``demo`` for the built-in task, else ``math``), ``"demo"``,
            ``"demo_steps"`` (partial credit per correct step), ``"math"`` or ``"package.module:function"``.
        lr, weight_decay, betas, adam_eps: AdamW settings.
        lr_schedule: ``constant`` | ``linear`` (to `min_lr_ratio` x lr) | ``cosine``, after `warmup_steps`
            of linear warm-up; the decay spans `total_steps` (None: the run's `iterations`).
        warmup_steps, min_lr_ratio, total_steps: see `lr_schedule`.
        micro_batch_tokens: padded tokens (rows x longest row) per forward/backward pass; gradients are
            accumulated over micro-batches, so the global batch size and memory are independent.
        max_grad_norm: gradient clipping (0 disables).
        clip_low, clip_high: importance ratio clipped to [1 - clip_low, 1 + clip_high] (clip-higher: raise
            clip_high).
        loss_aggregation: ``token`` (all response tokens of the batch weigh the same) | ``sequence``
            (per-sample token mean, then the mean over samples).
        advantage_scale: ``std`` (GRPO) | ``none`` (Dr. GRPO: centre only).
        kl_coef: weight of the k3 KL penalty to the initial policy (0 = no reference model is loaded).
        snapshot_interval: export weights for the generation actors every this many applied updates (Δ).
        transport: ``object_store`` (Ray object store, default) | ``files`` (safetensors on `snapshot_dir`).
        snapshot_dir: shared directory for ``files`` (None: ``<state dir>/snapshots``).
        keep_snapshots: snapshots kept (older object refs are released, older files deleted).
        convert: conversion hook applied to every snapshot before it is published: ``identity``,
            ``bfloat16`` / ``float16`` (cast floating tensors: half the bytes to move; engines cast back).
        keep_checkpoints: trainer checkpoints kept on disk (>= 2 so the one the runtime state names survives).
        max_nan_steps: stop after this many consecutive steps with a non-finite loss or gradient norm.
        device: trainer device (``cpu``, ``cuda``, ``cuda:0``).
        autocast_dtype: None (fp32) | ``bfloat16`` | ``float16`` autocast for the forward pass (GPU).
        num_threads: torch CPU threads in the Training Unit (None: torch's default).
    """

    reward: str = "auto"
    lr: float = 5e-4
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    adam_eps: float = 1e-8
    lr_schedule: str = "constant"
    warmup_steps: int = 10
    min_lr_ratio: float = 0.0
    total_steps: int | None = None
    micro_batch_tokens: int = 8192
    max_grad_norm: float = 1.0
    clip_low: float = 0.2
    clip_high: float = 0.2
    loss_aggregation: str = "sequence"
    advantage_scale: str = "std"
    kl_coef: float = 0.0
    snapshot_interval: int = 1
    transport: str = "object_store"
    snapshot_dir: str | None = None
    keep_snapshots: int = 2
    convert: str = "identity"
    keep_checkpoints: int = 2
    max_nan_steps: int = 3
    device: str = "cpu"
    autocast_dtype: str | None = None
    num_threads: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def validate(self) -> GRPOConfig:
        """Check ranges; return self.

        Raises:
            UserError: naming ``runtime.grpo.<field>``, its value and the allowed range.
        """
        choices = {
            "lr_schedule": LR_SCHEDULES, "transport": TRANSPORTS, "convert": CONVERSIONS,
            "loss_aggregation": AGGREGATIONS, "advantage_scale": ADVANTAGE_SCALES,
        }  # fmt: skip
        for name, allowed in choices.items():
            _check(self, name, getattr(self, name) in allowed, f"one of {', '.join(allowed)}")
        autocast_ok = self.autocast_dtype in (None, "bfloat16", "float16")
        _check(self, "autocast_dtype", autocast_ok, "null, bfloat16 or float16")
        _check(self, "lr", self.lr > 0, "> 0")
        for name in ("weight_decay", "max_grad_norm", "clip_low", "kl_coef", "warmup_steps"):
            _check(self, name, getattr(self, name) >= 0, ">= 0")
        _check(self, "clip_low", self.clip_low < 1, "in [0, 1)")
        _check(self, "clip_high", self.clip_high >= 0, ">= 0")
        _check(self, "min_lr_ratio", 0 <= self.min_lr_ratio <= 1, "in [0, 1]")
        _check(self, "betas", len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas), "two values in [0, 1)")
        _check(self, "adam_eps", self.adam_eps > 0, "> 0")
        for name in ("micro_batch_tokens", "snapshot_interval", "keep_snapshots", "max_nan_steps"):
            _check(self, name, getattr(self, name) >= 1, ">= 1")
        _check(self, "keep_checkpoints", self.keep_checkpoints >= 2, ">= 2")
        _check(self, "total_steps", self.total_steps is None or self.total_steps >= 1, "null or >= 1")
        _check(self, "num_threads", self.num_threads is None or self.num_threads >= 1, "null or >= 1")
        return self

    @classmethod
    def from_mapping(cls, params: dict[str, Any] | None) -> GRPOConfig:
        """Build from a params mapping (None = defaults), rejecting unknown keys with a `UserError`."""
        params = dict(params or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(params) - known)
        if unknown:
            raise UserError(f"unknown runtime.grpo param(s) {unknown}; known: {sorted(known)}")
        if "betas" in params:
            params["betas"] = tuple(params["betas"])
        return cls(**params).validate()


def _check(cfg: GRPOConfig, name: str, ok: bool, allowed: str) -> None:
    if not ok:
        raise UserError(f"runtime.grpo.{name} = {getattr(cfg, name)!r} is out of range; it must be {allowed}.")
