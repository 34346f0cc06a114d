"""Argument checks shared by the simulator's pure modules (`asp.sim.lengths`, `asp.sim.planner`).

positive_int("n_samples", 8)   # 8; ValueError naming the argument for 0, -1, 2.5, True
"""

from __future__ import annotations

from typing import Any

import numpy as np


def positive_int(name: str, value: Any) -> int:
    """`value` as an int, or ValueError naming `name` when it is not an integer >= 1 (a bool is not one)."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return int(value)
