"""`RuntimeConfig`: the runtime's settings, which are the typed ``runtime:`` params plus the run's seed.

Every field, default and range is declared once, in `asp.config.RuntimeParams` (see its field descriptions);
this subclass adds only ``seed`` (``common.seed``: minibatch task t samples with a seed derived from it).
Validation happens at construction and raises pydantic's `ValidationError` naming the field.

    from asp.runtime import RuntimeConfig
    cfg = RuntimeConfig(iterations=5, actors_per_unit=2, trainer_step_s=0.1)    # demo defaults otherwise
    cfg = RuntimeConfig.from_params(params)                                     # params: asp.config.Params
"""

from __future__ import annotations

from pydantic import Field

from asp.config import Int, Params, RuntimeParams


class RuntimeConfig(RuntimeParams):
    """`RuntimeParams` + ``seed``; frozen, unknown keys rejected."""

    seed: Int = Field(0, ge=0, description="Base sampling seed (common.seed).")

    @classmethod
    def from_params(cls, params: Params) -> RuntimeConfig:
        """The config of a pipeline run: its ``runtime:`` section and ``common.seed``."""
        return cls(**dict(params.runtime), seed=params.common.seed)
