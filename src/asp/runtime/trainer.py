"""The Training Unit seen from the runtime: the `Trainer` protocol and `TrainingUnit`, its Ray actor wrapper.

A trainer consumes one `GlobalBatch` per `step` and returns a `StepResult` (new policy version, metrics, a
small JSON-able state for the runtime checkpoint, and optionally a `WeightUpdate` for the generation
actors). The implementations live in `asp.trainers` (simulated; GRPO with its weight flow); the runtime only
calls the picklable zero-argument factory it is given, inside the `TrainingUnit` actor.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable

from asp.runtime.messages import GlobalBatch, StepResult, WeightUpdate


@runtime_checkable
class Trainer(Protocol):
    """What the Training Unit runs. `version` is the policy version (0 before any step)."""

    version: int

    def step(self, batch: GlobalBatch) -> StepResult:
        """Train on one global batch; return the new version, metrics, state and optional weight update."""
        ...

    def restore(self, state: Mapping[str, Any]) -> WeightUpdate | None:
        """Continue from the `StepResult.state` stored in a runtime checkpoint; return the snapshot the
        generation actors must load to match the restored weights (None: keep theirs)."""
        ...


class TrainingUnit:
    """Ray actor wrapper around a `Trainer` built from a picklable zero-argument factory."""

    def __init__(self, trainer_factory: Callable[[], Trainer]) -> None:
        self.error: str | None = None
        self.trainer: Any = None
        try:
            self.trainer = trainer_factory()
        except Exception as exc:
            self.error = f"{type(exc).__name__}: {exc}"

    def ready(self) -> str | None:
        """None when the trainer was built, else its error message."""
        return self.error

    def restore(self, state: Mapping[str, Any]) -> WeightUpdate | None:
        return self.trainer.restore(state)

    def step(self, batch: GlobalBatch) -> StepResult:
        return self.trainer.step(batch)
