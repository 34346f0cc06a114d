"""The one retry mechanism of a pipeline stage, whichever door runs it (`asp repro`, the Prefect flows).

    policy = RetryPolicy(retries=params.orchestration.retries.get("profile", 0))
    report = call_with_retries(lambda: run.run_stage("profile"), policy, retryable=..., on_retry=print)

A failed attempt is tried again up to `retries` times, `delay_s` apart, when `retryable(exc)` says so (the
orchestrator: a stage that failed, never one stopped past its timeout, which would only time out again). The
Prefect tasks call this too (with Prefect's own task retries off), so both doors retry the same stages the same
number of times and say so in the same words. Pure apart from sleeping; tests pass their own `sleep`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")
RETRY_DELAY_S = 5.0


@dataclass(frozen=True)
class RetryPolicy:
    """Extra attempts after a failure (`orchestration.retries` of the stage) and the pause before each."""

    retries: int = 0
    delay_s: float = RETRY_DELAY_S

    def __post_init__(self) -> None:
        if self.retries < 0 or self.delay_s < 0:
            raise ValueError(f"retries {self.retries} and delay_s {self.delay_s} must be >= 0")


def call_with_retries(
    attempt: Callable[[], T],
    policy: RetryPolicy,
    *,
    retryable: Callable[[Exception], bool],
    on_retry: Callable[[str], None],
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """`attempt()`, called again after an `Exception` that `retryable` accepts, at most `policy.retries` more
    times; `on_retry` gets one line per retry (``<error>; retrying (1/2) in 5 s``). The last failure, a failure
    `retryable` refuses and any `BaseException` (Ctrl-C, SIGTERM, a cancellation) propagate at once."""
    for n in range(policy.retries + 1):
        try:
            return attempt()
        except Exception as exc:
            if n == policy.retries or not retryable(exc):
                raise
            on_retry(f"{exc}; retrying ({n + 1}/{policy.retries}) in {policy.delay_s:g} s")
            sleep(policy.delay_s)
    raise AssertionError("unreachable: the last attempt returns or raises")
