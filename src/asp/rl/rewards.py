"""Verifiable reward functions and their registry.

A reward function maps ``(response text, reference answer) -> float``; one that also declares a ``prompt``
parameter gets the prompt text as a keyword (verifiers that need the problem). Built in:

* ``"demo"``: the built-in demo task's verifier (`asp.demo.task.reward`: last ``answer:`` equals the answer);
* ``"demo_steps"``: the demo task with partial credit per correct step (`asp.demo.task.step_reward`);
* ``"math"``: DeepScaleR-style math (`asp.rl.math_answer.math_reward`: last ``\\boxed{}`` or stated answer,
  compared after normalization, numerically when both are numbers).

`get_reward(name)` also accepts ``"package.module:function"`` for a user's own verifier (importable in the
Training Unit's process). `compute_rewards` never lets one sample stop a run: a reward that raises or
returns a non-finite value gives that sample 0 and is counted.

Run the tests with ``python -m pytest tests/rl -q``.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import math
from collections.abc import Callable, Sequence

import numpy as np

from asp.rl.math_answer import math_reward

RewardFn = Callable[..., float]  # (response, answer) -> reward; may also take a keyword ``prompt``
log = logging.getLogger(__name__)


def demo_reward(response: str, answer: str) -> float:
    """The demo task's reward (1.0 when the last ``answer:`` matches, else 0.0)."""
    from asp.demo.task import reward

    return reward(response, answer)


def demo_steps_reward(response: str, answer: str, prompt: str) -> float:
    """The demo task with partial credit: half final answer, half the fraction of steps written right."""
    from asp.demo.task import step_reward

    return step_reward(response, answer, prompt)


REWARDS: dict[str, RewardFn] = {"demo": demo_reward, "demo_steps": demo_steps_reward, "math": math_reward}


def wants_prompt(fn: Callable[..., float]) -> bool:
    """True when the reward function declares a ``prompt`` parameter."""
    try:
        return "prompt" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def get_reward(name: str) -> RewardFn:
    """A registered reward (``"demo"``, ``"math"``) or ``"module:function"``.

    Raises:
        ValueError: unknown name, or a ``module:function`` that cannot be imported / is not callable.
    """
    if name in REWARDS:
        return REWARDS[name]
    if ":" in name:
        module, _, attr = name.partition(":")
        try:
            fn = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as exc:
            raise ValueError(f"reward {name!r} cannot be imported: {exc}") from None
        if not callable(fn):
            raise ValueError(f"reward {name!r} is not callable")
        return fn
    raise ValueError(f"unknown reward {name!r}; choose one of {sorted(REWARDS)} or 'package.module:function'")


def register_reward(name: str, fn: RewardFn) -> None:
    """Add a reward to the registry of this process (tests, notebooks)."""
    REWARDS[name] = fn


def compute_rewards(
    fn: RewardFn, responses: Sequence[str], answers: Sequence[str], prompts: Sequence[str] | None = None
) -> tuple[np.ndarray, int]:
    """Score every response; a sample whose reward raises or is not finite gets 0.0 and is counted.

    Args:
        fn: reward function.
        responses: (S,) response texts.
        answers: (S,) reference answers (one per response).
        prompts: (S,) prompt texts, passed as ``prompt=`` to a reward that declares it (see `wants_prompt`).

    Returns:
        ((S,) float64 rewards, number of samples whose reward failed).
    """
    out = np.zeros(len(responses), dtype=np.float64)
    errors = 0
    given = prompts if prompts is not None and wants_prompt(fn) else None
    for i, (resp, ans) in enumerate(zip(responses, answers, strict=True)):
        try:
            value = float(fn(resp, ans, prompt=given[i]) if given is not None else fn(resp, ans))
            if not math.isfinite(value):
                raise ValueError(f"non-finite reward {value}")
            out[i] = value
        except Exception as exc:  # one bad sample must not stop the run
            errors += 1
            if errors == 1:
                log.warning("reward failed on sample %d (%s: %s); it gets 0", i, type(exc).__name__, exc)
    return out, errors
