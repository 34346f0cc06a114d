"""`asp.control.sender`, under its former name: part of the Control Unit core (`asp.control`), which the runtime and
the simulator both drive. Kept so that existing imports of `asp.runtime.sender` keep working; new code imports
`asp.control.sender`."""

from __future__ import annotations

from asp.control.sender import *  # noqa: F403
