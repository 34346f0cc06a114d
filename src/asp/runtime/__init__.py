"""The asynchronous multi-instance RL runtime on Ray (paper §4, appendix B): Control Unit, Generation Units,
Training Queue and Training Unit.

    from asp.runtime import EngineSpec, RuntimeConfig, WorkPlan, run_async
    cfg = RuntimeConfig(generation_units=1, actors_per_unit=2, global_batch_prompts=16, q_max=48,
                        n_samples=4, max_new_tokens=64, trainer_step_s=0.5, actor_num_cpus=0.5)
    summary = run_async(schedule, prompts_by_id, EngineSpec("hf", "runs/policy", {"num_threads": 1}), cfg,
                        logger=tracker, checkpoint_dir="runs/launch/ckpt")
    summary.metrics["runtime/summary/mean_iteration_time_s"]

See docs/runtime.md for the design, the metrics and the overhead benchmark; tests in tests/runtime.
"""

from asp.runtime.checkpoint import Checkpointer
from asp.runtime.config import RuntimeConfig
from asp.runtime.control import ControlUnit, RunSummary, RuntimeFailure
from asp.runtime.database import Database, TaskState
from asp.runtime.engines import EngineSpec, StandInEngine
from asp.runtime.messages import (
    Failure,
    GlobalBatch,
    GUReport,
    MinibatchOutput,
    SamplingParams,
    StepResult,
    WeightUpdate,
    WorkItem,
)
from asp.runtime.metrics import (
    busy_fraction,
    grpo_summary,
    iteration_metrics,
    summary_metrics,
    time_weighted_stats,
    trend,
)
from asp.runtime.plan import WorkPlan, as_plan, check_prompts
from asp.runtime.queue import Backpressure, TrainingQueue
from asp.runtime.run import make_checkpointer, ray_session, run_async
from asp.runtime.trainer import Trainer, TrainingUnit

__all__ = [
    "Backpressure",
    "Checkpointer",
    "ControlUnit",
    "Database",
    "EngineSpec",
    "Failure",
    "GUReport",
    "GlobalBatch",
    "MinibatchOutput",
    "RunSummary",
    "RuntimeConfig",
    "RuntimeFailure",
    "SamplingParams",
    "StandInEngine",
    "StepResult",
    "TaskState",
    "Trainer",
    "TrainingQueue",
    "TrainingUnit",
    "WeightUpdate",
    "WorkItem",
    "WorkPlan",
    "as_plan",
    "busy_fraction",
    "check_prompts",
    "grpo_summary",
    "iteration_metrics",
    "make_checkpointer",
    "ray_session",
    "run_async",
    "summary_metrics",
    "time_weighted_stats",
    "trend",
]
