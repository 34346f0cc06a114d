"""The GRPO Training Unit (paper §4.2, appendices C-D): a `Trainer` that learns from the runtime's global batches.

Per step (`GRPOTrainer.step`, one `GlobalBatch` of B prompts x n responses):

1. rewards from the task's verifier (`asp.rl.rewards`; a sample whose reward raises gets 0 and is counted);
2. group-normalized advantages over the n responses of each prompt;
3. the clipped-ratio GRPO loss against the behaviour log-probs the engine returned (optional k3 KL to the
   initial policy), gradient-accumulated over micro-batches of at most `micro_batch_tokens` padded tokens;
   AdamW with a warm-up + constant / linear / cosine schedule; a non-finite loss or gradient norm skips
   the update (counted) and `max_nan_steps` in a row stop the run;
4. every `snapshot_interval` applied updates a weight snapshot (T_save, conversion hook T_convert) goes to
   the generation actors through the Ray object store or safetensors files (`asp.trainers.weights`);
5. every `checkpoint_interval` steps a trainer checkpoint (weights, optimizer, RNG, counters) whose path
   goes into `StepResult.state`, so a resumed run restores it (`restore`).

Metrics (``train/...``) include reward, loss, ratio / clipping, grad norm, learning rate, the measured
policy lag of the batch, the d_off estimate, T_save / T_convert / T_load / T_gen / T_train and the duty cycle
(`LagMonitor`). `make_trainer_factory` builds the picklable factory `run_async(..., trainer_factory=...)` needs.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from asp.config import GRPOParams
from asp.rl import compute_rewards, get_reward, group_advantages, grpo_loss, loss_denominator, token_logprobs
from asp.rl.advantages import zero_signal_groups
from asp.rl.batching import pack_rows, plan_micro_batches
from asp.rl.lag import d_off_estimate, duty_cycle, measured_lag
from asp.rl.lr import lr_factor
from asp.runtime.messages import GlobalBatch, StepResult, WeightUpdate
from asp.trainers.weights import SnapshotPublisher, convert, cpu_snapshot, load_checkpoint, save_checkpoint

log = logging.getLogger(__name__)


class NonFiniteLossError(RuntimeError):
    """Raised when `max_nan_steps` consecutive steps had a non-finite loss or gradient norm."""


@dataclass(slots=True)
class LagMonitor:
    """Running timings for the lag estimate and duty cycle (each minibatch counted once, even when split).

    Attributes:
        t_load: recent actor reload times (s), one per reload event reported with a minibatch.
        t_train, t_save, t_convert: recent trainer step / snapshot export / conversion times (s).
        gen_total, load_total: generation and reload seconds summed over all minibatches seen.
    """

    t_load: deque[float] = field(default_factory=lambda: deque(maxlen=50))
    t_train: deque[float] = field(default_factory=lambda: deque(maxlen=10))
    t_save: deque[float] = field(default_factory=lambda: deque(maxlen=10))
    t_convert: deque[float] = field(default_factory=lambda: deque(maxlen=10))
    seen: deque[tuple[int, float]] = field(default_factory=lambda: deque(maxlen=4096))
    gen_total: float = 0.0
    load_total: float = 0.0

    def observe(self, batch: GlobalBatch) -> None:
        """Record the reload and generation time of every minibatch in `batch` not seen before."""
        if batch.gen_s.size != batch.num_prompts:
            return
        for task, gen, reload in zip(
            batch.task_ids.tolist(), batch.gen_s.tolist(), batch.reload_s.tolist(), strict=True
        ):
            key = (task, gen)
            if key in self.seen:
                continue
            self.seen.append(key)
            self.gen_total += gen
            self.load_total += reload
            if reload > 0:
                self.t_load.append(reload)

    def metrics(self, trainer_version: int, batch: GlobalBatch) -> dict[str, float]:
        """Measured lag, the d_off estimate (mean / max over the batch's prompts), T_* and the duty cycle."""
        lag_mean, lag_max = measured_lag(trainer_version, batch.versions)
        recent = {"load": self.t_load, "train": self.t_train, "save": self.t_save, "convert": self.t_convert}
        t = {name: float(np.mean(v)) if v else 0.0 for name, v in recent.items()}
        t_gen = float(np.mean(batch.gen_s)) if batch.gen_s.size else float("nan")
        out = {"train/lag_mean": lag_mean, "train/lag_max": lag_max, "train/t_gen_s": t_gen}
        out.update({f"train/t_{k}_s": v for k, v in t.items()})
        if batch.gen_s.size == batch.num_prompts and batch.num_prompts:
            est = d_off_estimate(
                batch.depth_at_arrival,
                batch.gen_s,
                t_save=t["save"],
                t_convert=t["convert"],
                t_load=t["load"],
                t_train=t["train"],
            )
            out["train/d_off_estimate_mean"] = float(np.mean(est))
            out["train/d_off_estimate_max"] = float(np.max(est))
            out["train/q_arrival_batches_mean"] = float(np.mean(batch.depth_at_arrival))
        out["train/duty_cycle"] = duty_cycle(t_gen, t["load"]) if np.isfinite(t_gen) else float("nan")
        out["train/duty_cycle_measured"] = duty_cycle(self.gen_total, self.load_total)
        return out


@dataclass(frozen=True)
class GRPOSpec:
    """Picklable recipe of a `GRPOTrainer` (built inside the Training Unit actor).

    Attributes:
        policy_path: local checkpoint directory of the initial policy (also the KL reference).
        prompts: prompt id -> chat-templated prompt text (what the engines decoded from).
        answers: prompt id -> reference answer for the reward.
        config: the ``runtime.grpo`` params (`asp.config.GRPOParams`).
        reward: reward name (`asp.rl.get_reward`; not ``auto``).
        temperature: sampling temperature of the engines (the trainer scores tokens with it).
        seed: torch seed.
        checkpoint_interval: trainer checkpoint every this many steps (= the runtime's, so they match).
        total_steps: steps the run will take (LR decay span and final checkpoint); None if unknown.
        state_dir: where checkpoints (``trainer/``) and file snapshots (``snapshots/``) go; None: no checkpoints.
    """

    policy_path: str
    prompts: Mapping[Any, str]
    answers: Mapping[Any, str]
    config: GRPOParams
    reward: str
    temperature: float = 1.0
    seed: int = 0
    checkpoint_interval: int = 10
    total_steps: int | None = None
    state_dir: str | None = None

    def __call__(self) -> GRPOTrainer:
        return GRPOTrainer(self)


class GRPOTrainer:
    """GRPO `Trainer` (see the module docstring). Build it from a `GRPOSpec`."""

    def __init__(self, spec: GRPOSpec) -> None:
        from transformers import AutoModelForCausalLM

        from asp.rollout.model_dir import check_model_dir, load_tokenizer

        cfg = self.cfg = spec.config
        self.spec = spec
        if cfg.num_threads is not None:
            torch.set_num_threads(cfg.num_threads)
        torch.manual_seed(spec.seed)
        path = check_model_dir(spec.policy_path)
        self.device = torch.device(cfg.device)
        model = AutoModelForCausalLM.from_pretrained(
            str(path), local_files_only=True, use_safetensors=True, dtype=torch.float32
        )
        self.model = model.to(self.device).eval()  # eval: no dropout, so scores match the engines'
        self.ref = copy.deepcopy(self.model).requires_grad_(False) if cfg.kl_coef > 0 else None
        self.tokenizer = load_tokenizer(path)
        self.pad_id = int(self.tokenizer.pad_token_id)
        self.reward_fn = get_reward(spec.reward)
        self.opt = torch.optim.AdamW(
            self.model.parameters(), lr=cfg.lr, betas=cfg.betas, eps=cfg.adam_eps, weight_decay=cfg.weight_decay
        )
        state_dir = Path(spec.state_dir) if spec.state_dir else None
        self.ckpt_root = state_dir / "trainer" if state_dir else None
        snap_dir = cfg.snapshot_dir or (str(state_dir / "snapshots") if state_dir else None)
        self.publisher = SnapshotPublisher(cfg.transport, snap_dir, cfg.keep_snapshots)
        self.version = 0
        self.counters = {"nan_skipped": 0, "nan_in_a_row": 0, "reward_errors": 0, "prompt_token_mismatch": 0}
        self.checkpoint: str | None = None
        self.checkpoint_step = 0
        self.lag = LagMonitor()
        self._prompt_ids: dict[Any, list[int]] = {}

    # ---- Trainer protocol ------------------------------------------------------------------------------
    def step(self, batch: GlobalBatch) -> StepResult:
        start = time.perf_counter()
        self.lag.observe(batch)
        lag_metrics_version = self.version
        rewards, errors = self._rewards(batch)
        adv = group_advantages(rewards, batch.n, scale=self.cfg.advantage_scale)
        stats = self._update(batch, adv)
        t_train = time.perf_counter() - start
        self.lag.t_train.append(t_train)
        weights = None
        if stats["applied"] and self.version % self.cfg.snapshot_interval == 0:
            weights = self._export()
        self._maybe_checkpoint(batch.step)
        metrics = {
            "train/reward_mean": float(rewards.mean()) if rewards.size else float("nan"),
            "train/reward_std": float(rewards.std()) if rewards.size else float("nan"),
            "train/solved_fraction": float((rewards >= 1.0 - 1e-9).mean()) if rewards.size else float("nan"),
            "train/reward_errors": float(errors),
            "train/zero_signal_prompts": float(zero_signal_groups(rewards, batch.n)) if rewards.size else 0.0,
            "train/prompts": float(batch.num_prompts),
            "train/mean_response_length": float(batch.lengths.mean()) if batch.lengths.size else 0.0,
            "train/nan_skipped_steps": float(self.counters["nan_skipped"]),
            "train/reward_errors_total": float(self.counters["reward_errors"]),
            "train/snapshot": float(weights is not None),
            **{k: v for k, v in stats.items() if k != "applied"},
            **self.lag.metrics(lag_metrics_version, batch),
        }
        state = {
            "version": self.version,
            "step": batch.step,
            "checkpoint": self.checkpoint,
            "checkpoint_step": self.checkpoint_step,
        }
        return StepResult(batch.step, self.version, time.perf_counter() - start, metrics, state, weights)

    def restore(self, state: Mapping[str, Any]) -> WeightUpdate | None:
        """Load the trainer checkpoint named in `state`; return a snapshot of the restored weights."""
        from asp.errors import UserError

        path = state.get("checkpoint")
        if not path:
            if int(state.get("version", 0)) > 0:
                raise UserError(
                    f"the runtime checkpoint says policy version {state.get('version')} but names no GRPO trainer "
                    "checkpoint (written by another trainer?); delete the runtime state directory to start afresh."
                )
            return None
        try:
            meta = load_checkpoint(Path(path), self.model, self.opt)
        except Exception as exc:  # noqa: BLE001 - any failure to read it leaves the same choice to the user
            raise UserError(
                f"trainer checkpoint {path} named by the runtime checkpoint cannot be loaded "
                f"({type(exc).__name__}: {exc}). Delete that directory: the next run resumes from the previous "
                "trainer checkpoint and its runtime position; or delete the runtime state directory to start afresh."
            ) from None
        self.version = int(meta["version"])
        self.counters.update(meta.get("counters", {}))
        self.checkpoint, self.checkpoint_step = str(path), int(meta["step"])
        if self.checkpoint_step != int(state.get("step", self.checkpoint_step)):
            raise UserError(
                f"trainer checkpoint {path} is from step {self.checkpoint_step} but the runtime position that names "
                f"it is at step {state.get('step')}: resuming would mix a runtime position with weights of another "
                "step. Delete the runtime state directory to start afresh."
            )
        return self._export()

    # ---- pieces ----------------------------------------------------------------------------------------
    def _rewards(self, batch: GlobalBatch) -> tuple[np.ndarray, int]:
        pids = [batch.prompt_ids[s // batch.n] for s in range(len(batch.texts))]
        answers = [str(self.spec.answers[pid]) for pid in pids]
        prompts = [self.spec.prompts[pid] for pid in pids]
        rewards, errors = compute_rewards(self.reward_fn, batch.texts, answers, prompts)
        self.counters["reward_errors"] += errors
        return rewards, errors

    def _prompt_tokens(self, pid: Any, expected: int) -> list[int]:
        ids = self._prompt_ids.get(pid)
        if ids is None:
            ids = self.tokenizer(self.spec.prompts[pid], add_special_tokens=False)["input_ids"]
            self._prompt_ids[pid] = ids
            if expected > 0 and len(ids) != expected:
                self.counters["prompt_token_mismatch"] += 1
        return ids

    def _rows(self, batch: GlobalBatch) -> tuple[list[list[int]], list[np.ndarray], list[np.ndarray] | None]:
        n = batch.n
        prompts = [self._prompt_tokens(pid, int(batch.prompt_tokens[b])) for b, pid in enumerate(batch.prompt_ids)]
        rows = [prompts[s // n] for s in range(batch.lengths.size)]
        responses = [batch.sample_tokens(s) for s in range(batch.lengths.size)]
        has_lp = batch.logprobs.size == batch.token_ids.size and batch.token_ids.size > 0
        behaviour = None
        if has_lp:
            off = batch.sample_offsets
            behaviour = [batch.logprobs[off[s] : off[s + 1]] for s in range(batch.lengths.size)]
        return rows, responses, behaviour

    def _update(self, batch: GlobalBatch, adv: np.ndarray) -> dict[str, float]:
        """Accumulate gradients over micro-batches and apply one AdamW update unless something is non-finite."""
        cfg = self.cfg
        prompts, responses, behaviour = self._rows(batch)
        denom = loss_denominator(batch.lengths, cfg.loss_aggregation)
        total = cfg.total_steps or self.spec.total_steps
        factor = lr_factor(
            self.version, cfg.lr_schedule, warmup=cfg.warmup_steps, total=total, min_ratio=cfg.min_lr_ratio
        )
        for group in self.opt.param_groups:
            group["lr"] = cfg.lr * factor
        self.opt.zero_grad(set_to_none=True)
        sums = dict.fromkeys(("loss", "pg", "kl", "ratio", "clipped", "abs_logratio", "tokens"), 0.0)
        ratio_max, finite, micro = 0.0, True, 0
        lengths = np.array([len(p) + len(r) for p, r in zip(prompts, responses, strict=True)])
        for idx in plan_micro_batches(lengths, cfg.micro_batch_tokens):
            if not any(len(responses[i]) for i in idx):
                continue
            beh = None if behaviour is None else [behaviour[i] for i in idx]
            parts = self._micro_step([prompts[i] for i in idx], [responses[i] for i in idx], beh, adv[idx], denom)
            micro += 1
            if not torch.isfinite(parts.loss):
                finite = False
                break
            parts.loss.backward()
            values = (
                float(parts.loss.detach()),
                parts.pg_sum,
                parts.kl_sum,
                parts.ratio_sum,
                parts.clipped_sum,
                parts.abs_logratio_sum,
                parts.tokens,
            )
            for key, value in zip(sums, values, strict=True):
                sums[key] += value
            ratio_max = max(ratio_max, parts.ratio_max)
        max_norm = cfg.max_grad_norm if cfg.max_grad_norm > 0 else float("inf")
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)) if finite else np.nan
        applied = finite and bool(np.isfinite(grad_norm))
        self._apply_or_skip(applied)
        tokens = max(sums["tokens"], 1.0)
        return {
            "applied": applied,
            "train/loss": sums["loss"] if applied else float("nan"),
            "train/lr": cfg.lr * factor,
            "train/pg_loss_per_token": sums["pg"] / tokens,
            "train/kl_per_token": sums["kl"] / tokens,
            "train/ratio_mean": sums["ratio"] / tokens,
            "train/ratio_max": ratio_max,
            "train/clip_fraction": sums["clipped"] / tokens,
            "train/abs_log_ratio_mean": sums["abs_logratio"] / tokens,
            "train/grad_norm": grad_norm,
            "train/micro_batches": float(micro),
            "train/response_tokens": sums["tokens"],
            "train/behaviour_logprobs_missing": float(behaviour is None),
            "train/prompt_token_mismatch": float(self.counters["prompt_token_mismatch"]),
        }

    def _micro_step(self, prompts, responses, behaviour, adv: np.ndarray, denom: float):
        zeros = [np.zeros(len(r), np.float32) for r in responses]
        rows = pack_rows(prompts, responses, behaviour if behaviour is not None else zeros, adv, self.pad_id)
        dev = self.device
        ids, attn, targets, mask = (t.to(dev) for t in (rows.input_ids, rows.attention_mask, rows.targets, rows.mask))
        with self._autocast():
            logits = self.model(input_ids=ids, attention_mask=attn).logits[:, :-1]
        logp = token_logprobs(logits, targets, self.spec.temperature)
        beh = rows.behaviour.to(dev) if behaviour is not None else logp.detach()
        ref_logp = None
        if self.ref is not None:
            with torch.no_grad(), self._autocast():
                ref_logits = self.ref(input_ids=ids, attention_mask=attn).logits[:, :-1]
            ref_logp = token_logprobs(ref_logits, targets, self.spec.temperature)
        cfg = self.cfg
        return grpo_loss(
            logp,
            beh,
            rows.advantages.to(dev),
            mask,
            clip_low=cfg.clip_low,
            clip_high=cfg.clip_high,
            aggregation=cfg.loss_aggregation,
            denominator=denom,
            kl_coef=cfg.kl_coef,
            ref_logp=ref_logp,
        )

    def _autocast(self) -> Any:
        if self.cfg.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=getattr(torch, self.cfg.autocast_dtype))

    def _apply_or_skip(self, applied: bool) -> None:
        if applied:
            self.opt.step()
            self.version += 1
            self.counters["nan_in_a_row"] = 0
            return
        self.opt.zero_grad(set_to_none=True)
        self.counters["nan_skipped"] += 1
        self.counters["nan_in_a_row"] += 1
        log.warning("non-finite loss or gradient norm: update skipped (%d in a row)", self.counters["nan_in_a_row"])
        if self.counters["nan_in_a_row"] >= self.cfg.max_nan_steps:
            raise NonFiniteLossError(
                f"{self.counters['nan_in_a_row']} consecutive steps had a non-finite loss or gradient norm "
                f"(runtime.grpo.max_nan_steps = {self.cfg.max_nan_steps}); lower runtime.grpo.lr, check the "
                "rewards, or raise max_nan_steps. The run stops; it resumes from the last checkpoint."
            )

    def _export(self) -> WeightUpdate:
        """Snapshot (T_save: CPU copy + publish), conversion hook (T_convert); the actors' payload."""
        t0 = time.perf_counter()
        state = cpu_snapshot(self.model)
        t1 = time.perf_counter()
        state = convert(self.cfg.convert, state)
        t2 = time.perf_counter()
        payload = self.publisher.publish(self.version, state)
        t3 = time.perf_counter()
        self.lag.t_save.append((t1 - t0) + (t3 - t2))
        self.lag.t_convert.append(t2 - t1)
        return WeightUpdate(self.version, payload)

    def _maybe_checkpoint(self, step: int) -> None:
        if self.ckpt_root is None:
            return
        last = self.spec.total_steps is not None and step >= self.spec.total_steps
        if step % self.spec.checkpoint_interval and not last:
            return
        meta = {"version": self.version, "counters": dict(self.counters), "reward": self.spec.reward}
        path = save_checkpoint(self.ckpt_root, step, self.model, self.opt, meta, self.cfg.keep_checkpoints)
        self.checkpoint, self.checkpoint_step = str(path), step
