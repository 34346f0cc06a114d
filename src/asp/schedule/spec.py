"""`ScheduleSpec`: the scheduler settings every schedule builder, ablation and sweep shares; `PAPER_SPEC`.

    spec = ScheduleSpec(b=16, kappa=2, k=4, iterations=200_000, method="asp")   # every field given
    build_schedule(ids, predicted, **spec.kwargs(), seed=0)
    ablation(true, predicted, PAPER_SPEC, seeds=(0, 1, 2))          # the paper's settings (appendix E.4)

The scheduler has no defaults of its own for these settings: a pipeline run takes them from the `schedule:`
params (`asp.config.ScheduleParams` holds their defaults, the CPU demo's); `PAPER_SPEC` names the paper's, which
the `asp schedule` CLI uses for flags left out. Run the checks:
`.venv/bin/python -m pytest tests/schedule/test_ablation.py -q`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from asp.schedule.validate import as_choice, as_int

METHODS = ("asp", "paper_sa", "kk", "lpt", "snake")  # balancing methods of `balance_groups`
BUILD_METHODS = (*METHODS, "sorted")  # `build_schedule` also accepts "sorted": the DP's order, unbalanced
PAPER_TAUS = (1.0, 0.75, 0.64, 0.5, 0.25, 0.0)  # Kendall tau targets of the paper's sweep (appendix F.6.2)


@dataclass(frozen=True, slots=True)
class ScheduleSpec:
    """How to cut and order minibatches; validated on construction (ValueError naming the field). No defaults:
    `PAPER_SPEC` is the paper's, the `schedule:` params the pipeline's.

    Attributes:
        b: base minibatch size in prompts (>= 1); C0/C1 of the ablation use fixed size b.
        kappa: extra size allowed: DP minibatches hold b .. b + kappa prompts (>= 0).
        k: minibatches per batch group (>= 1).
        iterations: annealing proposals of the balancing (>= 0; "asp" and "paper_sa" only).
        method: balancing method, one of `BUILD_METHODS`.
    """

    b: int
    kappa: int
    k: int
    iterations: int
    method: str

    def __post_init__(self) -> None:
        for name, minimum in (("b", 1), ("kappa", 0), ("k", 1), ("iterations", 0)):
            object.__setattr__(self, name, as_int(getattr(self, name), name, minimum=minimum))
        as_choice(self.method, "method", BUILD_METHODS)

    def kwargs(self) -> dict[str, Any]:
        """The fields as keyword arguments of `build_schedule` / `condition_schedule`."""
        return {"b": self.b, "kappa": self.kappa, "k": self.k, "iterations": self.iterations, "method": self.method}


# The paper's settings (appendix E.4): b 32, kappa 2, k 6, 2e6 annealing iterations, ASP's balancing.
PAPER_SPEC = ScheduleSpec(b=32, kappa=2, k=6, iterations=2_000_000, method="asp")
