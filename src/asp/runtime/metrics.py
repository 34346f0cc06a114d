"""`asp.control.metrics`, under its former name: part of the Control Unit core (`asp.control`), which the runtime and
the simulator both drive. Kept so that existing imports of `asp.runtime.metrics` keep working; new code imports
`asp.control.metrics`."""

from __future__ import annotations

from asp.control.metrics import *  # noqa: F403
