"""The small ASP schedule the pipeline and runtime tests build from known lengths: minibatches of 2 prompts,
batch groups of 2, no length-pair smoothing (kappa 0), seed 0. One place, so those tests agree on it.

    from tests.schedules import tiny_schedule
    sched = tiny_schedule(ids, lengths)
"""

from __future__ import annotations

from collections.abc import Sequence

from asp.schedule import Schedule, build_schedule


def tiny_schedule(prompt_ids: Sequence, lengths: Sequence[float]) -> Schedule:
    """`build_schedule` of the ASP method with b = 2, k = 2, kappa = 0, seed 0 and the search's full budget."""
    return build_schedule(prompt_ids, lengths, b=2, kappa=0, k=2, iterations=2_000_000, seed=0, method="asp")
