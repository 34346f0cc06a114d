"""The asynchronous multi-instance RL runtime on Ray (paper §4, appendix B): Control Unit, Generation Units,
Training Queue and Training Unit.

    from asp.config import QueueParams, RayParams, SamplingParams, TrainerParams
    from asp.runtime import EngineSpec, RuntimeConfig, WorkPlan, run_async
    cfg = RuntimeConfig(global_batch_prompts=16, queue=QueueParams(q_max=48),
                        sampling=SamplingParams(n_samples=4, max_new_tokens=64),
                        ray=RayParams(generation_units=1, actors_per_unit=2, actor_num_cpus=0.5),
                        trainer=TrainerParams(kind="simulated", step_s=0.5))   # asp.config's section models
    engine_options = {"device": "cpu", "dtype": "float32", "num_threads": 1}
    summary = run_async(schedule, prompts_by_id, EngineSpec("hf", "runs/policy", engine_options), cfg,
                        logger=tracker, checkpoint_dir="runs/launch/ckpt")
    summary.metrics["runtime/summary/mean_iteration_time_s"]

The pure parts (Database, sender policy, Training Queue, backpressure, lag bound, messages, metrics) are the
Control Unit core's and live in `asp.control` (the simulator `asp.sim` drives that core too); their public names
are re-exported here (`from asp.runtime import WorkPlan, Database, ...`), loaded lazily, as are the runtime's own.
See docs/runtime.md for the design, the metrics and the overhead benchmark; tests in tests/runtime and tests/control.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "asp.runtime.checkpoint": ["Checkpointer"],
    "asp.runtime.config": ["RuntimeConfig"],
    "asp.runtime.control": ["ControlUnit", "RunSummary", "RuntimeFailure"],
    "asp.control.database": ["Database", "TaskState"],
    "asp.runtime.engines": ["EngineSpec", "StandInEngine"],
    "asp.control.messages": [
        "Failure",
        "GlobalBatch",
        "GUReport",
        "MinibatchOutput",
        "StepResult",
        "WeightUpdate",
        "WorkItem",
    ],
    "asp.control.metrics": [
        "busy_fraction",
        "grpo_summary",
        "iteration_metrics",
        "summary_metrics",
        "time_weighted_stats",
        "trend",
    ],
    "asp.control.plan": ["WorkPlan", "as_plan", "check_prompts"],
    "asp.control.queue": ["Backpressure", "TrainingQueue"],
    "asp.runtime.run": ["make_checkpointer", "ray_session", "run_async"],
    "asp.rollout.base": ["SamplingParams"],  # the rollout layer's sampling settings, sent to each generation actor
    "asp.control.sender": ["GULoad", "enforce_lag_bound", "plan_dispatch"],
    "asp.runtime.trainer": ["Trainer", "TrainingUnit"],
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    """Import the defining module on first use (PEP 562); submodules (`asp.runtime.control`) work as usual."""
    if name in _WHERE:
        value = getattr(importlib.import_module(_WHERE[name]), name)
        globals()[name] = value
        return value
    try:
        return importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as exc:
        if exc.name != f"{__name__}.{name}":
            raise
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None


def __dir__() -> list[str]:
    return __all__
