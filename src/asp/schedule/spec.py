"""`ScheduleSpec`: the scheduler settings every schedule builder, ablation and sweep shares, and their defaults.

    spec = ScheduleSpec(b=32, kappa=2, k=6)            # paper appendix E.4 defaults; iterations, method too
    build_schedule(ids, predicted, **spec.kwargs(), seed=0)
    ablation(true, predicted, spec, seeds=(0, 1, 2))

The `asp schedule` CLI builds one from its --b/--kappa/--k/--iterations/--method flags (flags left out keep the
defaults here). Run the checks: `.venv/bin/python -m pytest tests/schedule/test_ablation.py -q`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from asp.schedule.validate import as_choice, as_int

METHODS = ("asp", "paper_sa", "kk", "lpt", "snake")  # balancing methods of `balance_groups`
BUILD_METHODS = (*METHODS, "sorted")  # `build_schedule` also accepts "sorted": the DP's order, unbalanced
DEFAULT_ITERATIONS = 2_000_000
PAPER_TAUS = (1.0, 0.75, 0.64, 0.5, 0.25, 0.0)  # Kendall tau targets of the paper's sweep (appendix F.6.2)


@dataclass(frozen=True, slots=True)
class ScheduleSpec:
    """How to cut and order minibatches; validated on construction (ValueError naming the field).

    Attributes:
        b: base minibatch size in prompts (>= 1); C0/C1 of the ablation use fixed size b.
        kappa: extra size allowed: DP minibatches hold b .. b + kappa prompts (>= 0).
        k: minibatches per batch group (>= 1).
        iterations: annealing proposals of the balancing (>= 0; "asp" and "paper_sa" only).
        method: balancing method, one of `BUILD_METHODS`.
    """

    b: int = 32
    kappa: int = 2
    k: int = 6
    iterations: int = DEFAULT_ITERATIONS
    method: str = "asp"

    def __post_init__(self) -> None:
        for name, minimum in (("b", 1), ("kappa", 0), ("k", 1), ("iterations", 0)):
            object.__setattr__(self, name, as_int(getattr(self, name), name, minimum=minimum))
        as_choice(self.method, "method", BUILD_METHODS)

    def kwargs(self) -> dict[str, Any]:
        """The fields as keyword arguments of `build_schedule` / `condition_schedule`."""
        return {"b": self.b, "kappa": self.kappa, "k": self.k, "iterations": self.iterations, "method": self.method}
