"""The launch stage's learning curve (`asp.trainers.learning`): keep the weights of every evaluation step while the
run trains, then measure the held-out reward of each after it, log the series to MLflow and return the
``learning/...`` metrics.

    keeper = WeightKeeper(state_dir, interval)      # on_iteration hook: hard-links the checkpoint of each eval step
    metrics, points = measure_curve(params, state_dir, policy_dir, exclude, iterations, last_step, tracker)

MLflow gets, per evaluated step, ``learning/heldout_reward`` (and ``_se``), ``learning/elapsed_s`` (the run's
iteration time up to that step) and ``learning/eval_s`` at step = the trainer step, and
``learning/heldout_reward_by_ms`` at step = the elapsed milliseconds (the curve against wall-clock). They are logged
once, after every point is measured (``curve.json`` remembers it across a kill). Evaluation seconds are reported
apart (``learning/eval_seconds``) and never enter iteration times. Only the built-in demo task has held-out
problems no run trains on; other datasets get ``learning/measured`` 0 and a note.
"""

from __future__ import annotations

import sys
from collections.abc import Collection, Iterable, Mapping
from pathlib import Path
from typing import Any

from asp.config import DEMO_DATASET, Params, RuntimeParams
from asp.errors import UserError
from asp.runtime.testhooks import kill_point
from asp.tracking import Tracker
from asp.trainers.factory import resolve_reward
from asp.trainers.heldout import heldout_problems, heldout_rewards
from asp.trainers.learning import (
    CurveStore,
    curve_interval,
    curve_summary,
    elapsed_by_step,
    eval_steps,
    keep_checkpointed,
    keep_weights,
    weights_path,
)

CURVE_PREFIX = "learning/curve/"  # per-point keys in metrics/launch.json, e.g. learning/curve/step_00020/reward


class WeightKeeper:
    """`on_iteration` hook: after a step that is an evaluation step, keep its trainer checkpoint's weights."""

    def __init__(self, state_dir: Path, interval: int) -> None:
        self.state_dir, self.interval = state_dir, interval

    def __call__(self, cu: Any, metrics: Mapping[str, float]) -> None:
        if self.interval > 0 and cu.step % self.interval == 0:
            keep_weights(self.state_dir, cu.step)


def interval_of(runtime: RuntimeParams) -> int:
    """The curve's evaluation interval in steps (0: off; only a grpo run has a curve)."""
    if runtime.trainer.kind != "grpo":
        return 0
    return curve_interval(runtime.grpo.eval_interval, runtime.checkpoint_interval)


def not_measured_reason(params: Params) -> str | None:
    """Why this run gets no curve (None: it gets one)."""
    runtime = params.runtime
    if runtime.grpo.eval_interval == 0:
        return "runtime.grpo.eval_interval is 0"
    if params.prepare.dataset != DEMO_DATASET:
        return f"{params.prepare.dataset} has no held-out split excluded from GRPO training"
    return None


def measure_curve(
    params: Params,
    state_dir: Path,
    policy_dir: Path,
    exclude: Collection[str],
    iterations: Iterable[Mapping[str, Any]],
    last_step: int,
    tracker: Tracker,
) -> tuple[dict[str, Any], list[dict[str, float]]]:
    """Evaluate the steps of the curve not yet measured, log the series once; returns (metrics, points)."""
    reason = not_measured_reason(params)
    if reason is not None:
        return {"learning/measured": 0, "learning/note": f"not measured: {reason}"}, []
    runtime, seed = params.runtime, params.common.seed
    grpo, interval = runtime.grpo, interval_of(runtime)
    try:
        records, _ = heldout_problems(grpo.eval_problems, seed=seed, exclude=set(exclude))
    except ValueError as exc:
        raise UserError(f"runtime.grpo.eval_problems: {exc}") from None
    reward = resolve_reward(grpo.reward, params.prepare.dataset)
    temperature = runtime.sampling.temperature if runtime.sampling.temperature > 0 else 1.0
    keep_checkpointed(state_dir, interval)
    elapsed = elapsed_by_step(iterations)
    store = CurveStore(state_dir)
    todo = [s for s in eval_steps(last_step, interval) if s not in store.points]
    missing = []
    if todo:
        print(
            f"[launch] learning curve: steps {todo} x {len(records)} held-out problems x {grpo.eval_samples} samples",
            file=sys.stderr,
        )
    for step in todo:
        weights = None if step == 0 else weights_path(state_dir, step)
        if weights is not None and not weights.is_file() and keep_weights(state_dir, step) is None:
            missing.append(step)
            continue
        result = heldout_rewards(
            policy_dir,
            weights,
            records,
            samples=grpo.eval_samples,
            max_new_tokens=runtime.sampling.max_new_tokens,
            seed=seed,
            temperature=temperature,
            device=grpo.device,
            num_threads=runtime.engine.num_threads,
            reward=reward,
        )
        per = result.per_problem
        se = float(per.std(ddof=1) / len(per) ** 0.5) if len(per) > 1 else float("nan")
        store.add(
            {
                "step": step,
                "elapsed_s": elapsed.get(step, float("nan")),
                "reward": result.mean,
                "reward_se": se,
                "eval_s": result.seconds,
            }
        )
        kill_point(f"launch:curve@{step}")
    points = store.ordered()
    if not store.logged:
        for p in points:
            tracker.log_metrics(
                {
                    "learning/heldout_reward": p["reward"],
                    "learning/heldout_reward_se": p["reward_se"],
                    "learning/elapsed_s": p["elapsed_s"],
                    "learning/eval_s": p["eval_s"],
                },
                step=int(p["step"]),
            )
            tracker.log_metrics({"learning/heldout_reward_by_ms": p["reward"]}, step=int(round(1000 * p["elapsed_s"])))
        store.mark_logged()
    return curve_metrics(points, interval, len(records), grpo.eval_samples, reward, missing), points


def curve_metrics(
    points: list[dict[str, float]], interval: int, problems: int, samples: int, reward: str, missing: list[int]
) -> dict[str, Any]:
    """metrics/launch.json's ``learning/...``: the settings, the summary (`curve_summary`) and every point."""
    note = f"held-out demo problems, none among the run's prompts; reward {reward}; evaluated after the run"
    if missing:
        note += f"; steps {missing} not evaluated (their trainer checkpoints were gone)"
    out: dict[str, Any] = {
        "learning/measured": 1,
        "learning/note": note,
        "learning/interval": interval,
        "learning/problems": problems,
        "learning/samples": samples,
        "learning/eval_seconds": float(sum(p["eval_s"] for p in points)),
        **{f"learning/{k}": v for k, v in curve_summary(points).items()},
    }
    for p in points:
        key = f"{CURVE_PREFIX}step_{int(p['step']):05d}/"
        out.update({key + name: p[name] for name in ("reward", "reward_se", "elapsed_s", "eval_s")})
    return out
