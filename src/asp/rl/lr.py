"""Learning-rate schedules as a pure function of the number of applied updates (resumable without state).

``lr(u) = base * lr_factor(u, ...)`` for update u = 0, 1, ...: linear warm-up over `warmup` updates
(factor (u + 1) / warmup), then ``constant`` (1), ``linear`` (1 -> min_ratio at `total`) or ``cosine``
(1 -> min_ratio along half a cosine at `total`); after `total` the factor stays at its final value.
"""

from __future__ import annotations

import math


def lr_factor(
    update: int, schedule: str, *, warmup: int = 0, total: int | None = None, min_ratio: float = 0.0
) -> float:
    """Multiplier of the base learning rate for 0-based `update`.

    Raises:
        ValueError: unknown schedule, or a decaying schedule without `total`.

    Examples: warmup 4 -> updates 0..3 give 0.25, 0.5, 0.75, 1.0; linear, total 10, min 0: update 5 -> 0.5;
    cosine, total 10, min 0: update 5 -> 0.5, update 10 -> 0.0.
    """
    if update < warmup:
        return (update + 1) / warmup
    if schedule == "constant":
        return 1.0
    if schedule not in ("linear", "cosine"):
        raise ValueError(f"schedule must be constant, linear or cosine, got {schedule!r}")
    if total is None:
        raise ValueError(f"the {schedule} schedule needs the total number of updates")
    span = max(total - warmup, 1)
    progress = min(max(update - warmup, 0) / span, 1.0)
    decay = 1.0 - progress if schedule == "linear" else 0.5 * (1.0 + math.cos(math.pi * progress))
    return min_ratio + (1.0 - min_ratio) * decay
