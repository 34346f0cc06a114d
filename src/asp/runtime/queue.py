"""`asp.control.queue`, under its former name: part of the Control Unit core (`asp.control`), which the runtime and
the simulator both drive. Kept so that existing imports of `asp.runtime.queue` keep working; new code imports
`asp.control.queue`."""

from __future__ import annotations

from asp.control.queue import *  # noqa: F403
