"""What a Prefect flow run of the pipeline shows its user: its name, and a mistake in what the user typed.

* Name: the *Run Name* typed in the UI's Custom run form is kept (what the run is goes to a tag, `asp: <label>`);
  a name Prefect made up is replaced by ours, `run_label` stamped with the start time (`840e457 demo all @
  05-14 10:32:07`), so runs are told apart. Prefect makes up two kinds (read from Prefect 3.9's server and UI):
  the server's `adjective-animal` from coolname for a run created without a name (Quick run, the API, a
  schedule), and the Custom run form's suggestion `<greek letter>[N]-<star or place>[-<word>]`, filled in until
  the user types over it.
* A user error (`asp.errors.UserError`: bad stages, preset or overrides) ends the flow run Failed with the error's
  message as the state's message, logged once (Prefect's "Finished in state Failed('...')") and without a
  traceback: `quiet_user_errors` keeps Prefect's loggers from printing one for it. It also raises that last line of a
  failed or crashed run to ERROR (Prefect logs it at INFO), so a log filtered to errors shows how the run ended.

    flow_run_name_for("my-baseline-check", label)   # "my-baseline-check"
    flow_run_name_for("crimson-otter", label)       # "840e457 demo all @ 05-14 10:32:07"
"""

from __future__ import annotations

import functools
import logging
import re
from pathlib import Path
from typing import Any

from prefect.exceptions import CancelledRun

from asp.errors import UserError
from asp.tracking import stamped

GREEK = "alpha|beta|gamma|delta|epsilon|zeta|eta|theta|iota|kappa|lambda|mu|nu|xi|omicron|pi|rho|sigma|tau|upsilon"
# The Custom run form's suggestion (Prefect UI: `runName` = greek letter [+ number] - star / place [- word])
UI_SUGGESTION = re.compile(rf"(?:{GREEK}|phi|chi|psi|omega)\d*(?:-[a-z]+){{1,3}}")
ENGINE_EXIT = "Engine execution exited with unexpected exception"  # Prefect's line after a flow run that failed
FINISHED = "Finished in state "  # Prefect's last line of a run: "Finished in state Failed('...')"
LABEL_TAG = "asp: {label}"


@functools.cache
def _coolname_words() -> tuple[frozenset[str], frozenset[str]] | None:
    """The adjectives and animals of the Prefect server's run names (coolname's two-word slugs); None when coolname
    cannot be read (then any `word-word` name counts as made up)."""
    try:
        import coolname
        from coolname.loader import load_config

        config: dict[str, Any] = dict(load_config(Path(coolname.__file__).parent / "data"))

        def words(name: str) -> frozenset[str]:
            entry = config[name]
            if entry["type"] == "nested":
                return frozenset().union(*(words(n) for n in entry["lists"]))
            return frozenset(entry.get("words", ()))

        (first, second) = config["an"]["lists"]  # the two-word slug: adjective, then animal
        return words(first), words(second)
    except Exception:  # another coolname layout: fall back to the shape
        return None


def generated_name(name: str) -> bool:
    """Whether Prefect made `name` up (the server's `adjective-animal`, the Custom run form's suggestion) rather
    than the user typing it."""
    if UI_SUGGESTION.fullmatch(name):
        return True
    first, sep, second = name.partition("-")
    if not sep or not (first.isalpha() and second.isalpha() and name.islower()):
        return False
    words = _coolname_words()
    return words is None or (first in words[0] and second in words[1])


def flow_run_name_for(given: str | None, label: str, when: float | None = None) -> str:
    """The flow run's name: `given` when the user typed it, else `label` stamped with `when` (default now)."""
    return given if given and not generated_name(given) else stamped(label, when)


def tag_with_label(flow_run_id: str, label: str) -> None:
    """Add `asp: <label>` to the flow run's tags (for a run that keeps the name the user typed); a server that
    does not answer only costs the tag."""
    from prefect.client.orchestration import get_client

    tag = LABEL_TAG.format(label=label)
    try:
        with get_client(sync_client=True) as client:
            tags = list(client.read_flow_run(flow_run_id).tags or [])
            if tag not in tags:
                client.update_flow_run(flow_run_id, tags=[*tags, tag])
    except Exception as exc:  # a tag is a convenience; the run goes on
        logging.getLogger("asp.orchestration").warning("could not tag flow run %s: %s", flow_run_id, exc)


class _UserErrorRecords(logging.Filter):
    """On Prefect's run loggers: a record carrying a `UserError` loses its traceback, and Prefect's generic line
    after the failed run ("Engine execution exited with unexpected exception") is dropped: the run's state
    message already says what was wrong. The same generic line, with its traceback, after a run the user
    cancelled (`CancelledRun`: the flow returned a Cancelled state saying what became of the workspace) is
    dropped too: a cancel the user asked for is not an unexpected exception."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, CancelledRun):
            return record.getMessage() != ENGINE_EXIT
        if not isinstance(exc, UserError):
            return True
        if record.getMessage() == ENGINE_EXIT:
            return False
        record.exc_info, record.exc_text = None, None
        return True


class _FailedAtError(logging.Filter):
    """On Prefect's flow-run logger: the engine's last line of a flow run that failed or crashed ("Finished in state
    Failed(...)") is logged at ERROR, not INFO (Prefect 3's synchronous flow engine logs it at INFO whatever the
    state, so a log filtered to errors hid it)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.ERROR and failed_final_line(record.getMessage()):
            record.levelno, record.levelname = logging.ERROR, logging.getLevelName(logging.ERROR)
        return True


def failed_final_line(message: str) -> bool:
    """Whether `message` is Prefect's last line of a run that ended Failed or Crashed."""
    return message.startswith((f"{FINISHED}Failed", f"{FINISHED}Crashed"))


def quiet_user_errors() -> None:
    """Install `_UserErrorRecords` on Prefect's flow-run and task-run loggers, and `_FailedAtError` on the flow-run
    logger (once)."""
    for name in ("prefect.flow_runs", "prefect.task_runs"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _UserErrorRecords) for f in logger.filters):
            logger.addFilter(_UserErrorRecords())
    flow_runs = logging.getLogger("prefect.flow_runs")
    if not any(isinstance(f, _FailedAtError) for f in flow_runs.filters):
        flow_runs.addFilter(_FailedAtError())
