"""Helpers of the memory-model tests: every problem of one configuration in one call."""

from __future__ import annotations

from asp.sim.memory import (
    MAX_WORLD_SIZE,
    Architecture,
    GenerationSettings,
    TrainerSettings,
    generation_problem,
    trainer_problem,
)


def check_fit(
    arch: Architecture,
    trainer: TrainerSettings | None = None,
    generation: GenerationSettings | None = None,
    max_world_size: int = MAX_WORLD_SIZE,
) -> list[str]:
    """Problems (empty when everything fits), each with the numbers and what to change (`asp.steps.memory_check`
    calls `trainer_problem` / `generation_problem` itself: a CPU trainer's problem is a note there)."""
    problems = [trainer_problem(arch, trainer, max_world_size) if trainer else None]
    problems.append(generation_problem(arch, generation) if generation else None)
    return [p for p in problems if p]
