"""`RuntimeConfig`: the runtime's settings, which are the typed ``runtime:`` params plus the run's seed.

Every field, default and range is declared once, in `asp.config.RuntimeParams` (see its field descriptions);
this subclass adds ``seed`` (``common.seed``: minibatch task t samples with a seed derived from it) and ``schedule``
(the ``schedule:`` params, which history-aware passes schedule with; `from_params` fills both).
Validation happens at construction and raises pydantic's `ValidationError` naming the field.

    from asp.runtime import RuntimeConfig
    cfg = RuntimeConfig(iterations=5, trainer=TrainerParams(kind="simulated", step_s=0.1))  # demo defaults otherwise
    cfg = RuntimeConfig.from_params(params)                                     # params: asp.config.Params
    cfg.control_settings()          # the plain `asp.control.ControlSettings` the Control Unit core and asp.sim read
"""

from __future__ import annotations

from pydantic import Field

from asp.config import SEED, Int, Params, RuntimeParams, ScheduleParams
from asp.control.history import HistorySettings
from asp.control.settings import ControlSettings, PartialSettings
from asp.schedule.history import HistoryEstimator
from asp.schedule.spec import ScheduleSpec


class RuntimeConfig(RuntimeParams):
    """`RuntimeParams` + ``seed``; frozen, unknown keys rejected."""

    seed: Int = Field(SEED, ge=0, description="Base sampling seed (common.seed).")
    schedule: ScheduleParams | None = Field(
        None,
        description="The schedule: params, which history-aware passes (runtime.history) schedule with; None (a config "
        "built without params): history-aware passes are off.",
    )

    @classmethod
    def from_params(cls, params: Params) -> RuntimeConfig:
        """The config of a pipeline run: its ``runtime:`` section and ``common.seed``."""
        return cls(**dict(params.runtime), seed=params.common.seed, schedule=params.schedule)

    def control_settings(self) -> ControlSettings:
        """What the Control Unit's decisions read (`asp.control`), as a plain dataclass."""
        queue, control = self.queue, self.control
        return ControlSettings(
            mode=self.mode,
            generation_units=self.ray.generation_units,
            actors_per_unit=self.ray.actors_per_unit,
            gu_queue_target=queue.gu_queue_target,
            global_batch_prompts=self.global_batch_prompts,
            n_samples=self.sampling.n_samples,
            q_max=queue.q_max,
            q_resume=queue.q_resume,
            max_policy_lag=queue.max_policy_lag,
            stale_samples=queue.stale_samples,
            iterations=self.iterations,
            max_attempts=control.max_attempts,
            checkpoint_interval=self.checkpoint_interval,
            stall_timeout_s=control.stall_timeout_s,
            poll_timeout_s=control.poll_timeout_s,
            seed=self.seed,
            partial=PartialSettings(
                enabled=self.partial.enabled,
                token_budget=self.partial.token_budget,
                continuation_order=self.partial.continuation_order,
                max_rows=self.partial.max_rows,
                wait_for_full=self.partial.wait_for_full,
                oldest_first=self.partial.oldest_first,
            ),
            max_new_tokens=self.sampling.max_new_tokens,
            history=self.history_settings() if self.condition == "C4" else None,
        )

    def history_settings(self) -> HistorySettings | None:
        """History-aware passes (``runtime.history`` with the ``schedule:`` settings); None when off or when the
        config carries no schedule settings. `control_settings` uses them for the balanced condition (C4) only: the
        other conditions are the ablation's baselines and keep their plan every pass."""
        if not self.history.enabled or self.schedule is None:
            return None
        sched = self.schedule
        return HistorySettings(
            estimator=HistoryEstimator(self.history.prior_samples, self.history.drift_per_version),
            spec=ScheduleSpec(
                b=sched.b, kappa=sched.kappa, k=sched.k, iterations=sched.iterations, method=sched.method
            ),
            shuffle=sched.shuffle_groups,
            seed=self.seed,
            catch_up=self.history.catch_up,
        )
