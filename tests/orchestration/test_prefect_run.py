"""What a Prefect flow run shows its user (asp.orchestration.prefect_run): the Run Name typed in the UI is kept and
a name Prefect made up is replaced by ours; a user error is logged without a traceback, and Prefect's generic
line after the failed run is dropped. The flow run itself, through a real server and the UI, is tested in
tests/e2e/test_three_doors.py."""

from __future__ import annotations

import logging
import random
import re
import sys
import time
from pathlib import Path

import prefect
import pytest
from prefect.exceptions import CancelledRun
from prefect.utilities.names import generate_slug

from asp.errors import UserError
from asp.orchestration.prefect_run import ENGINE_EXIT, flow_run_name_for, generated_name, quiet_user_errors

UI_V2 = Path(prefect.__file__).parent / "server/ui-v2/assets"

LABEL = "840e457 demo schedule schedule.k=4"
# What Prefect 3.9's Custom run form suggests (its `runName` mock: greek letter [+ number] - star / place [- word])
UI_SUGGESTIONS = ["alpha-andromedae", "theta42-canis-majoris", "omega512-barad-dur-nebula", "psi-orion-x"]
TYPED = ["my-baseline-check", "k4", "baseline", "k=4 again", "Crimson-Otter", "run-2", "schedule-k4", "quick-test"]


def test_names_prefect_made_up_are_replaced_and_typed_ones_kept() -> None:
    made_up = [generate_slug(2) for _ in range(200)] + UI_SUGGESTIONS  # the server's names: a Quick run, the API
    assert all(generated_name(name) for name in made_up), [n for n in made_up if not generated_name(n)]
    assert not any(generated_name(name) for name in TYPED), [n for n in TYPED if generated_name(n)]
    when = time.mktime((2026, 5, 14, 10, 32, 7, 0, 0, -1))
    assert flow_run_name_for("my-baseline-check", LABEL, when) == "my-baseline-check"
    assert flow_run_name_for(made_up[0], LABEL, when) == f"{LABEL} @ 05-14 10:32:07"
    assert flow_run_name_for(None, LABEL, when) == f"{LABEL} @ 05-14 10:32:07"
    assert not generated_name(f"{LABEL} @ 05-14 10:32:07")  # a rerun of a named run keeps its name


def _new_ui_words() -> tuple[list[str], list[str]]:
    """The new UI's (`/v2`) Run Name suggestion, read from the installed Prefect's UI bundle: `<adjective>-<animal>`
    with faker's product adjectives and its animals of at most 6 characters (`J=()=>`${xe()}-${ye({maxCharCount:6})}``
    in the deployment run form's chunk)."""
    (chunk,) = [p for p in UI_V2.glob("deployment_._id.run-*.js") if "generate flow name" in p.read_text()]
    text = chunk.read_text()
    adjectives = re.search(
        r"\[((?:`[A-Z][a-z]+`,)+`[A-Z][a-z]+`)\];function \w+\(e\)\{return \w+\(\w+,e\)\}var \w+=\(\)=>", text
    )
    animals = re.search(r"`(Aardvark\.[^`]+)`\.split\(`\.`\)", text)
    assert adjectives and animals and "maxCharCount:6" in text, "the new UI's name suggestion changed: read it again"
    return re.findall(r"`([^`]+)`", adjectives.group(1)), [a for a in animals.group(1).split(".") if len(a) <= 6]


def test_the_new_uis_suggested_names_are_replaced() -> None:
    """Issue 39: the new UI's Custom run form suggests capitalised names ("Generic-Moth"), which asp took for typed
    ones; every adjective and every animal it can pick counts as made up, and typed names of that shape do not."""
    adjectives, animals = _new_ui_words()
    assert "Generic" in adjectives and "Moth" in animals and len(animals) > 100
    made_up = [f"{a}-{b}" for a in adjectives for b in animals]
    assert all(generated_name(name) for name in made_up), [n for n in made_up if not generated_name(n)][:10]
    assert flow_run_name_for(random.choice(made_up), LABEL, 0.0).startswith(f"{LABEL} @ ")
    assert not any(generated_name(n) for n in ("Generic-Moth-Run", "Baseline-K4", "My-Run", "Generic-Mothership"))


def _record(logger: logging.Logger, exc: BaseException, message: str, *args: object) -> None:
    try:
        raise exc
    except BaseException:
        logger.error(message, *args, exc_info=True)


def test_user_errors_reach_the_flow_runs_log_without_a_traceback(caplog: pytest.LogCaptureFixture) -> None:
    quiet_user_errors()
    quiet_user_errors()  # once is enough: a second call adds no second filter
    logger = logging.getLogger("prefect.flow_runs")
    assert len([f for f in logger.filters if type(f).__name__ == "_UserErrorRecords"]) == 1
    bad = UserError("params.yaml + overrides {...}: invalid params: ... Fix the overrides and run again.")
    with caplog.at_level(logging.INFO, logger="prefect.flow_runs"):
        _record(logger, bad, "Encountered exception during execution: %r", bad)  # Prefect's words
        _record(logger, bad, ENGINE_EXIT)  # Prefect's line after the failed run: dropped, the state says it all
        _record(logger, RuntimeError("a bug"), ENGINE_EXIT)  # anything else keeps its traceback
    kept = [(r.getMessage(), r.exc_info is not None) for r in caplog.records]
    assert kept == [(f"Encountered exception during execution: {bad!r}", False), (ENGINE_EXIT, True)]
    assert "Traceback" not in caplog.text.split(ENGINE_EXIT)[0] and "RuntimeError: a bug" in caplog.text
    assert re.search(r"Fix the overrides and run again", caplog.text) and sys.exc_info() == (None, None, None)


def test_a_cancel_the_user_asked_for_is_not_logged_as_an_unexpected_exception(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The flow returns a Cancelled state (asp.orchestration.flow.ends_cancelled); Prefect's engine then raises
    `CancelledRun` from the run's result and logs its generic line with a traceback: dropped."""
    quiet_user_errors()
    logger = logging.getLogger("prefect.flow_runs")
    cancelled = CancelledRun("stage 'schedule' was cancelled: the workspace is as it was before stage ...")
    with caplog.at_level(logging.INFO, logger="prefect.flow_runs"):
        logger.info("Finished in state Cancelled('stage ...')")
        _record(logger, cancelled, ENGINE_EXIT)
    assert [r.getMessage() for r in caplog.records] == ["Finished in state Cancelled('stage ...')"]
    assert "Traceback" not in caplog.text


def test_a_cancelled_tasks_last_line_is_info_not_error(caplog: pytest.LogCaptureFixture) -> None:
    """Prefect's task engine logs a task's last line at ERROR for any state but Completed; a Cancelled task's (the
    stage the user cancelled) is lowered to INFO, a failed task's stays ERROR."""
    quiet_user_errors()
    quiet_user_errors()
    logger = logging.getLogger("prefect.task_runs")
    assert len([f for f in logger.filters if type(f).__name__ == "_CancelledAtInfo"]) == 1
    with caplog.at_level(logging.INFO, logger="prefect.task_runs"):
        logger.error("Finished in state Cancelled('stage schedule was cancelled: the workspace is as it was')")
        logger.error("Finished in state Failed('Task run encountered an exception')")
    levels = [(r.levelname, r.getMessage().split("(")[0]) for r in caplog.records]
    assert levels == [("INFO", "Finished in state Cancelled"), ("ERROR", "Finished in state Failed")]


def test_outside_a_runners_cancel_the_flow_returns_its_cancelled_state() -> None:
    """`ends_cancelled` ends the process as Prefect's cancel (exit 0) only when the runner asked for it through its
    control channel; here (no runner, no flow run) neither applies, so the flow returns its Cancelled state."""
    from prefect.states import Cancelled

    from asp.orchestration.prefect_run import end_flow_run_as, runner_cancelling

    assert runner_cancelling() is False
    assert end_flow_run_as(Cancelled(message="cancelled")) is False
