"""The simulator runs without Ray or torch: importing it (and the Control Unit core it drives) loads neither, so
`asp simulate` and `asp plan layout` start fast and the simulator cannot depend on a live cluster."""

from __future__ import annotations

import subprocess
import sys


def test_simulator_imports_neither_ray_nor_torch() -> None:
    code = (
        "import sys, asp.sim.engine, asp.sim.planner, asp.sim.timemodel, asp.sim.lengths, asp.control.core; "
        "print(sorted(m for m in ('ray', 'torch', 'mlflow', 'matplotlib') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "[]"
