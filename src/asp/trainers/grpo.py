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

Several ranks (``runtime.grpo.world_size``): the same trainer in every rank of a torch.distributed group started
by the `TrainingUnit` actors, the policy sharded with FSDP2 and the micro-batches split over the ranks
(`asp.trainers.distributed`); checkpoints are sharded (DCP, `asp.trainers.weights`). One rank: no process group,
a plain module.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from asp.config import GRPOParams
from asp.control.messages import GlobalBatch, StepResult, WeightUpdate
from asp.errors import UserError
from asp.rl import compute_rewards, get_reward, group_advantages, grpo_loss, loss_denominator, token_logprobs
from asp.rl.advantages import zero_signal_groups
from asp.rl.batching import pack_rows, plan_micro_batches
from asp.rl.lr import lr_factor
from asp.rollout.model_dir import check_model_dir, load_tokenizer
from asp.trainers import distributed as dist
from asp.trainers.lag import LagMonitor
from asp.trainers.ledger import append_ledger, ledger_record
from asp.trainers.weights import SnapshotPublisher, convert, cpu_snapshot, load_checkpoint, save_checkpoint

log = logging.getLogger(__name__)


class NonFiniteLossError(RuntimeError):
    """Raised when `max_nan_steps` consecutive steps had a non-finite loss or gradient norm."""


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
        ledger_path: test hook (``ASP_TRAINER_LEDGER``, `asp.runtime.testhooks`): rank 0 appends one JSON line per
            step (step, prompt ids, task ids, versions, lengths, token ids), the record of exactly what was trained.
    """

    policy_path: str
    prompts: Mapping[Any, str]
    answers: Mapping[Any, str]
    config: GRPOParams
    reward: str
    temperature: float  # no defaults here: the launch's runtime params own them (`asp.trainers.factory`)
    seed: int
    checkpoint_interval: int
    total_steps: int | None = None
    state_dir: str | None = None
    ledger_path: str | None = None

    def __call__(self) -> GRPOTrainer:
        return GRPOTrainer(self)

    @property
    def world_size(self) -> int:
        """Ranks of the Training Unit (``runtime.grpo.world_size``); `build_training_unit` starts one actor each."""
        return self.config.world_size

    @property
    def needs_process_group(self) -> bool:
        """Whether the ranks need a torch.distributed group (`asp.config.GRPOParams.needs_process_group`)."""
        return self.config.needs_process_group

    @property
    def backend(self) -> str:
        """The torch.distributed backend (``auto``: nccl on cuda, gloo on cpu)."""
        return dist.resolve_backend(self.config.backend, self.config.device)


class GRPOTrainer:
    """GRPO `Trainer` (see the module docstring). Build it from a `GRPOSpec`."""

    def __init__(self, spec: GRPOSpec) -> None:
        from transformers import AutoModelForCausalLM

        cfg = self.cfg = spec.config
        self.spec = spec
        if cfg.num_threads is not None:
            torch.set_num_threads(cfg.num_threads)
        torch.manual_seed(spec.seed)
        path = check_model_dir(spec.policy_path)
        self.device = torch.device(cfg.device)
        self.rank, self.world = dist.rank_and_world()
        self.sharded = dist.is_distributed()  # the TrainingUnit started a process group: FSDP2
        model = AutoModelForCausalLM.from_pretrained(
            str(path), local_files_only=True, use_safetensors=True, dtype=torch.float32
        ).eval()  # eval: no dropout, so scores match the engines'
        self.tied = dist.tied_duplicates(model)
        self.ref = copy.deepcopy(model).to(self.device).requires_grad_(False) if cfg.kl_coef > 0 else None
        if cfg.activation_checkpointing:
            dist.checkpoint_layers(model)
        if not (self.sharded and cfg.cpu_offload):  # CPU offload: FSDP2 keeps the shards in host memory
            model.to(self.device)
        if self.sharded:
            dist.shard_model(model, cfg, self.device)
        self.model = model
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
        self._weights: tuple[int, dict[str, torch.Tensor] | None] | None = None

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
        weights, exported = None, stats["applied"] and self.version % self.cfg.snapshot_interval == 0
        if exported:
            weights = self._export()
        self._maybe_checkpoint(batch.step)
        self._write_ledger(batch)
        self._weights = None
        metrics = {
            "train/reward_mean": float(rewards.mean()) if rewards.size else float("nan"),
            "train/reward_std": float(rewards.std()) if rewards.size else float("nan"),
            "train/solved_fraction": float((rewards >= 1.0 - 1e-9).mean()) if rewards.size else float("nan"),
            "train/reward_errors": float(errors),
            "train/zero_signal_prompts": float(zero_signal_groups(rewards, batch.n)) if rewards.size else 0.0,
            "train/prompt_reward_std": float(rewards.reshape(-1, batch.n).mean(axis=1).std())
            if rewards.size
            else float("nan"),
            "train/adv_abs_mean": float(np.abs(adv).mean()) if adv.size else float("nan"),
            "train/prompts": float(batch.num_prompts),
            "train/mean_response_length": float(batch.lengths.mean()) if batch.lengths.size else 0.0,
            "train/nan_skipped_steps": float(self.counters["nan_skipped"]),
            "train/reward_errors_total": float(self.counters["reward_errors"]),
            "train/snapshot": float(exported),
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
        update = self._export()
        self._weights = None
        return update

    # ---- pieces ----------------------------------------------------------------------------------------
    def _write_ledger(self, batch: GlobalBatch) -> None:
        if self.spec.ledger_path is None or self.rank != 0:
            return
        append_ledger(
            self.spec.ledger_path, {**ledger_record(batch, batch.step), "token_ids": batch.token_ids.tolist()}
        )

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
        """Accumulate gradients over micro-batches and apply one AdamW update unless something is non-finite.

        With several ranks each runs its share of the micro-batches (`_accumulate`); FSDP2 reduces the gradients
        and the statistics are summed over ranks, so every rank applies the update of the whole global batch and
        rank 0 reports its metrics.
        """
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
        sums, ratio_max = self._accumulate(prompts, responses, behaviour, adv, denom)
        finite, micro = sums["bad"] == 0, int(sums["micro"] + sums["bad"])
        max_norm = cfg.max_grad_norm if cfg.max_grad_norm > 0 else float("inf")
        grad_norm = np.nan
        if finite:
            grad_norm = dist.grad_norm_value(torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm))
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

    def _accumulate(
        self, prompts, responses, behaviour, adv: np.ndarray, denom: float
    ) -> tuple[dict[str, float], float]:
        """Forward / backward over this rank's micro-batches; the statistics summed (ratio: max) over all ranks.

        Returns:
            (sums of loss, pg, kl, ratio, clipped, abs_logratio, tokens, real micro-batches ``micro`` and
            non-finite ones ``bad``; the largest ratio).
        """
        sums = dict.fromkeys(("loss", "pg", "kl", "ratio", "clipped", "abs_logratio", "tokens", "micro", "bad"), 0.0)
        ratio_max = 0.0
        lengths = np.array([len(p) + len(r) for p, r in zip(prompts, responses, strict=True)])
        budget = self.cfg.micro_batch_tokens
        plans = [i for i in plan_micro_batches(lengths, budget) if any(len(responses[j]) for j in i)]
        for idx in dist.split_micro_batches(plans, self.rank, self.world):
            if idx is None:
                self._dummy_pass()
                continue
            beh = None if behaviour is None else [behaviour[i] for i in idx]
            parts = self._micro_step([prompts[i] for i in idx], [responses[i] for i in idx], beh, adv[idx], denom)
            (parts.loss * self.world).backward()  # FSDP averages over ranks; every rank runs all its passes
            if not torch.isfinite(parts.loss):
                sums["bad"] += 1.0
                continue
            values = (float(parts.loss.detach()), parts.pg_sum, parts.kl_sum, parts.ratio_sum, parts.clipped_sum)
            for key, value in zip(("loss", "pg", "kl", "ratio", "clipped"), values, strict=True):
                sums[key] += value
            sums["abs_logratio"] += parts.abs_logratio_sum
            sums["tokens"] += parts.tokens
            sums["micro"] += 1.0
            ratio_max = max(ratio_max, parts.ratio_max)
        sums = dict(zip(sums, dist.all_reduce(list(sums.values()), self.device), strict=True))
        ratio_max = dist.all_reduce([ratio_max], self.device, op="max")[0]
        return sums, ratio_max

    def _micro_step(self, prompts, responses, behaviour, adv: np.ndarray, denom: float):
        zeros = [np.zeros(len(r), np.float32) for r in responses]
        rows = pack_rows(prompts, responses, behaviour if behaviour is not None else zeros, adv, self.pad_id)
        dev = self.device
        ids, attn, targets, mask = (t.to(dev) for t in (rows.input_ids, rows.attention_mask, rows.targets, rows.mask))
        with self._autocast():
            logits = self.model(input_ids=ids, attention_mask=attn, use_cache=False).logits[:, :-1]
        logp = token_logprobs(logits, targets, self.spec.temperature)
        beh = rows.behaviour.to(dev) if behaviour is not None else logp.detach()
        ref_logp = None
        if self.ref is not None:
            with torch.no_grad(), self._autocast():
                ref_logits = self.ref(input_ids=ids, attention_mask=attn, use_cache=False).logits[:, :-1]
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

    def _dummy_pass(self) -> None:
        """A zero-loss forward / backward: a rank with fewer micro-batches joins FSDP's collectives all the same."""
        pad = [self.pad_id]
        parts = self._micro_step([pad], [pad], None, np.zeros(1, np.float32), 1.0)
        (parts.loss * 0.0).backward()

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
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

    def full_weights(self) -> dict[str, torch.Tensor] | None:
        """The whole model's weights on the CPU, tied weights once (fp32 master weights).

        With several ranks every rank must call it (the shards are gathered); rank 0 gets the tensors, the others
        None. The result is kept until the end of the step, so a checkpoint at the step of a snapshot reuses it.
        """
        if self._weights is not None and self._weights[0] == self.version:
            return self._weights[1]
        state = dist.full_state(self.model, self.tied) if self.sharded else cpu_snapshot(self.model)
        self._weights = (self.version, state)
        return state

    def _export(self) -> WeightUpdate | None:
        """Snapshot (T_save: gather / CPU copy + publish), conversion hook (T_convert); the actors' payload.

        Rank 0 publishes; the other ranks take part in gathering the weights and return None.
        """
        t0 = time.perf_counter()
        state = self.full_weights()
        if state is None:
            return None
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
        path = save_checkpoint(
            self.ckpt_root, step, self.model, self.opt, meta, self.cfg.keep_checkpoints, self.full_weights()
        )
        self.checkpoint, self.checkpoint_step = str(path), step
