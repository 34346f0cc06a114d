"""`asp.control.plan`, under its former name: part of the Control Unit core (`asp.control`), which the runtime and
the simulator both drive. Kept so that existing imports of `asp.runtime.plan` keep working; new code imports
`asp.control.plan`."""

from __future__ import annotations

from asp.control.plan import *  # noqa: F403
