"""Training Units behind the runtime's `Trainer` protocol: the simulated trainer and GRPO with its weight flow.

    from asp.trainers import make_trainer_factory
    factory = make_trainer_factory("simulated", config)          # fixed step time (scheduling studies)
    factory = make_trainer_factory("grpo", config, policy_path=..., prompts=..., answers=..., grpo=...)

`asp.trainers.grpo` (torch) is imported only when a GRPO trainer is built. Tests: tests/trainers.
"""

from asp.trainers.factory import TRAINER_KINDS, make_trainer_factory, resolve_reward
from asp.trainers.simulated import SimulatedTrainer

__all__ = ["TRAINER_KINDS", "SimulatedTrainer", "make_trainer_factory", "resolve_reward"]
