"""The one retry mechanism of a stage (`asp.orchestration.retry`), which `asp repro` and the Prefect stage task
both call through `PipelineRun.run_stage_with_retries`: how many attempts, which failures are retried, what it
says, and that Ctrl-C is never retried. The end-to-end check through real DVC is tests/test_cli.py's
`test_repro_retries_a_failed_stage_and_stops_one_past_its_timeout`."""

from __future__ import annotations

import pytest

from asp.orchestration.pipeline import StageFailed
from asp.orchestration.retry import RETRY_DELAY_S, RetryPolicy, call_with_retries


def _flaky(failures: list[BaseException]):
    """An attempt that raises the given exceptions in turn, then returns the number of calls."""
    calls = []

    def attempt() -> int:
        calls.append(1)
        if len(calls) <= len(failures):
            raise failures[len(calls) - 1]
        return len(calls)

    return attempt


def _retry(attempt, retries: int, lines: list[str], slept: list[float]) -> int:
    return call_with_retries(
        attempt,
        RetryPolicy(retries=retries),
        retryable=lambda exc: isinstance(exc, StageFailed) and not exc.timed_out,
        on_retry=lines.append,
        sleep=slept.append,
    )


def test_a_failed_stage_is_retried_up_to_its_retries_saying_so() -> None:
    lines: list[str] = []
    slept: list[float] = []
    assert _retry(_flaky([StageFailed("profile", 3), StageFailed("profile", 3)]), 2, lines, slept) == 3
    assert slept == [RETRY_DELAY_S, RETRY_DELAY_S] and len(lines) == 2
    assert lines[0] == f"{StageFailed('profile', 3)}; retrying (1/2) in 5 s"
    assert lines[1].endswith("; retrying (2/2) in 5 s")

    lines.clear()
    with pytest.raises(StageFailed):  # one failure more than the retries: the last one propagates
        _retry(_flaky([StageFailed("profile", 3)] * 3), 2, lines, [])
    assert len(lines) == 2


@pytest.mark.parametrize(
    "failure",
    [StageFailed("launch", -15, timed_out=True), ValueError("a bug, not a flaky stage"), KeyboardInterrupt()],
    ids=["timeout", "other-error", "ctrl-c"],
)
def test_timeouts_other_errors_and_interrupts_are_not_retried(failure: BaseException) -> None:
    lines: list[str] = []
    with pytest.raises(type(failure)):
        _retry(_flaky([failure]), 3, lines, [])
    assert lines == []


def test_no_retries_is_one_attempt_and_the_policy_refuses_negative_values() -> None:
    lines: list[str] = []
    with pytest.raises(StageFailed):
        _retry(_flaky([StageFailed("prepare", 1)]), 0, lines, [])
    assert lines == [] and _retry(_flaky([]), 0, lines, []) == 1
    with pytest.raises(ValueError):
        RetryPolicy(retries=-1)
