"""`asp.control.database`, under its former name: part of the Control Unit core (`asp.control`), which the runtime and
the simulator both drive. Kept so that existing imports of `asp.runtime.database` keep working; new code imports
`asp.control.database`."""

from __future__ import annotations

from asp.control.database import *  # noqa: F403
