"""`launch` stage: the asynchronous multi-instance RL run that consumes the schedule (paper §4, appendix B).

Generation actors (hf on CPU, vLLM on GPUs) in Generation Units decode the scheduled minibatches in dispatch
order; completed minibatches flow through the bounded Training Queue to the Training Unit (simulated:
fixed step time and weight-reload delay, the paper's Table 4(b) setting). `runtime.condition` picks the
schedule: C4 is the `schedule` stage's output; C0-C3 are rebuilt from the same predictions for comparison.
The run checkpoints its position under outputs/launch_state/ (kept by DVC between runs) and resumes there.

Writes outputs/launch/ (summary.json, iterations.parquet, minibatches.parquet), metrics/launch.json and
plots/launch_timeline.png; logs every iteration to MLflow.

Run: `asp stage launch` (what `dvc repro launch` calls).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from asp.config import Params, RuntimeParams
from asp.errors import UserError
from asp.io import atomic_path, read_json, write_json, write_parquet
from asp.pipeline.policy import policy_model_path
from asp.plots import save_figure
from asp.tracking import Tracker

ENGINE_FIELDS = ("kind", "device", "dtype", "num_threads", "vllm")


@dataclass(frozen=True)
class Paths:
    policy: Path = Path("outputs/policy")
    prompts: Path = Path("outputs/prompts/train.parquet")
    schedule: Path = Path("outputs/schedule/schedule.parquet")
    predictions: Path = Path("outputs/predictions.parquet")
    calibration: Path = Path("outputs/calibration.json")
    out_dir: Path = Path("outputs/launch")
    state_dir: Path = Path("outputs/launch_state")
    metrics: Path = Path("metrics/launch.json")
    plot: Path = Path("plots/launch_timeline.png")


def runtime_config(r: RuntimeParams, seed: int) -> Any:
    """The runtime's `RuntimeConfig` from the typed `runtime:` params."""
    from asp.runtime import RuntimeConfig

    fields = r.model_dump(exclude={"condition", "trainer", "engine"})
    return RuntimeConfig(**fields, seed=seed).validate()


def engine_spec(r: RuntimeParams, model_path: Path) -> Any:
    """Picklable engine recipe for every generation actor."""
    from asp.runtime import EngineSpec

    e = r.engine
    if e.kind == "vllm":
        opts = {
            "tensor_parallel_size": e.vllm.tensor_parallel_size,
            "dtype": e.dtype,
            "gpu_memory_utilization": e.vllm.gpu_memory_utilization,
            "max_model_len": e.vllm.max_model_len,
        }
    else:
        opts = {"device": e.device, "dtype": e.dtype, "num_threads": e.num_threads}
    return EngineSpec(e.kind, str(model_path), opts)


def load_plan(params: Params, paths: Paths) -> Any:
    """The work plan of `runtime.condition`: the schedule stage's output for C4, rebuilt for C0-C3."""
    from asp.runtime import WorkPlan

    cond = params.runtime.condition
    if cond == "C4":
        if not paths.schedule.is_file():
            raise UserError(f"{paths.schedule}: missing. Run the schedule stage first (`dvc repro schedule`).")
        return WorkPlan.from_frame(pd.read_parquet(paths.schedule))
    from asp.predictor.calibration import CalibrationMap
    from asp.schedule import condition_schedule

    if not paths.predictions.is_file():
        raise UserError(f"{paths.predictions}: missing. Run the predict stage first (`dvc repro predict`).")
    preds = pd.read_parquet(paths.predictions)
    cal = CalibrationMap.from_dict(read_json(paths.calibration)) if paths.calibration.is_file() else None
    s = params.schedule
    sched = condition_schedule(
        preds["prompt_id"].to_numpy(),
        preds["predicted_length"].to_numpy(np.float64),
        cond,
        b=s.b,
        kappa=s.kappa,
        k=s.k,
        seed=params.common.seed,
        calibration=cal,
        loads=s.loads if cal is not None else "raw",
    )
    return WorkPlan.from_schedule(sched)


def timeline_figure(iterations: list[dict[str, float]]) -> Any:
    """Figure: iteration time and Training Queue depth per trainer step."""
    import matplotlib.pyplot as plt

    steps = [it.get("step", i) for i, it in enumerate(iterations)]
    fig, (a, b) = plt.subplots(2, 1, figsize=(7, 5), sharex=True)
    a.plot(steps, [it.get("runtime/iteration_time_s", np.nan) for it in iterations], "o-")
    a.set(ylabel="iteration time (s)", title="Asynchronous run")
    b.plot(steps, [it.get("runtime/queue_depth_prompts", np.nan) for it in iterations], "o-", color="#cc6677")
    b.set(xlabel="trainer step", ylabel="queue depth (prompts)")
    fig.tight_layout()
    return fig


def run(params: Params, paths: Paths, tracker: Tracker) -> dict[str, Any]:
    """Run the asynchronous RL loop over the schedule; write the run summary, metrics and plot."""
    from asp.runtime import run_async

    r, seed = params.runtime, params.common.seed
    if not paths.prompts.is_file():
        raise UserError(f"{paths.prompts}: missing. Run the prepare stage first (`dvc repro prepare`).")
    prompts = pd.read_parquet(paths.prompts, columns=["prompt_id", "prompt"])
    plan = load_plan(params, paths)
    config = runtime_config(r, seed)
    tracker.log_params({"runtime": r.model_dump(), "common.seed": seed})
    summary = run_async(
        plan,
        dict(zip(prompts["prompt_id"], prompts["prompt"], strict=True)),
        engine_spec(r, policy_model_path(paths.policy)),
        config,
        logger=tracker,
        checkpoint_dir=paths.state_dir / r.condition,
    )
    metrics = {k: float(v) for k, v in summary.metrics.items()}
    metrics.update(
        {
            "runtime/summary/resumed_from_step": summary.resumed_from_step,
            "runtime/summary/finished": int(summary.finished),
        }
    )
    with atomic_path(paths.out_dir) as out:
        out.mkdir(parents=True)
        write_json(
            {
                "condition": r.condition,
                "trainer": r.trainer,
                "resume_reason": summary.resume_reason,
                "trainer_step": summary.trainer_step,
                "policy_version": summary.policy_version,
                "metrics": metrics,
            },
            out / "summary.json",
        )
        write_parquet(pd.DataFrame(summary.iterations), out / "iterations.parquet")
        write_parquet(pd.DataFrame(summary.minibatches), out / "minibatches.parquet")
    write_json(metrics, paths.metrics)
    save_figure(timeline_figure(summary.iterations), paths.plot, tracker)
    return metrics
