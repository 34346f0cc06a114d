"""`asp.control.messages`, under its former name: part of the Control Unit core (`asp.control`), which the runtime and
the simulator both drive. Kept so that existing imports of `asp.runtime.messages` keep working; new code imports
`asp.control.messages`."""

from __future__ import annotations

from asp.control.messages import *  # noqa: F403
from asp.rollout.base import SamplingParams as SamplingParams  # re-export: the runtime's sampling settings
