"""What a Prefect flow run of the pipeline shows its user: its name, and a mistake in what the user typed.

* Name: the *Run Name* typed in the UI's Custom run form is kept (what the run is goes to a tag, `asp: <label>`);
  a name Prefect made up is replaced by ours, `run_label` stamped with the start time (`840e457 demo all @
  05-14 10:32:07`), so runs are told apart. Prefect makes up two kinds (read from Prefect 3.9's server and UI):
  the server's `adjective-animal` from coolname for a run created without a name (Quick run, the API, a
  schedule), and the Custom run form's suggestion, filled in until the user types over it: the old UI's
  `<greek letter>[N]-<star or place>[-<word>]`, the new UI's `<Adjective>-<Animal>` ("Generic-Moth").
* Links (`flow_run_url`, `deployment_url`: what `asp serve` prints, the MLflow runs' tags and notes) open the UI
  the server sends a user to: Prefect 3 serves an old web UI and a new one under `/v2`, and `/` opens the one its
  `/ui-settings` names as `default_ui` (`prefect_ui_base`; `asp ui prefect` opens the new one).
* A cancelled run's explanation (the Cancelled state the flow returns: what became of the workspace) stays its
  state message: Prefect's runner sets its own Cancelled state ("Flow run was cancelled successfully.") a few
  seconds after the flow ended, over the flow's. `keep_cancel_message` (the flows' `on_cancellation` hook, which
  the runner calls before it does so) waits for the runner's state and sets the flow's message again.
* A user error (`asp.errors.UserError`: bad stages, preset or overrides) ends the flow run Failed with the error's
  message as the state's message, logged once (Prefect's "Finished in state Failed('...')") and without a
  traceback: `quiet_user_errors` keeps Prefect's loggers from printing one for it. It also raises that last line of a
  failed or crashed run to ERROR (Prefect logs it at INFO), so a log filtered to errors shows how the run ended.

    flow_run_name_for("my-baseline-check", label)   # "my-baseline-check"
    flow_run_name_for("crimson-otter", label)       # "840e457 demo all @ 05-14 10:32:07"
    flow_run_name_for("Generic-Moth", label)        # the same: the new UI's suggestion
"""

from __future__ import annotations

import functools
import json
import logging
import re
import threading
import time
import urllib.error
import urllib.request
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
# The new UI's (`/v2`) suggestion: faker's product adjective, capitalised, "-" an animal of at most 6 characters
# ("Generic-Moth"; Prefect UI v2's deployment run form)
UI_V2_ADJECTIVES = (
    "Awesome|Rustic|Small|Gorgeous|Fantastic|Sleek|Intelligent|Unbranded|Refined|Licensed|Generic|Practical|"
    "Ergonomic|Handcrafted|Tasty|Handmade|Incredible"
)
UI_V2_SUGGESTION = re.compile(rf"(?:{UI_V2_ADJECTIVES})-[A-Z](?:[^\W\d_]|[' -]){{0,5}}")  # letters: "Vicuña"
LABEL_TAG = "asp: {label}"
RUNNER_CANCELLED = "Flow run was cancelled successfully."  # Prefect's runner's message (prefect.runner)
CANCEL_WAIT_S = 120.0  # the runner kills a flow run that has not ended 30 s after its SIGTERM


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


@functools.lru_cache(maxsize=8)
def prefect_ui_base(ui: str, timeout_s: float = 5.0) -> str:
    """The address of the web UI the Prefect server at `ui` opens at `/` (its `/ui-settings`: `default_ui` and that
    UI's base path): `ui` + `/v2` for the new UI, `ui` for the old one or a server that does not say."""
    ui = ui.rstrip("/")
    try:
        with urllib.request.urlopen(f"{ui}/ui-settings", timeout=timeout_s) as resp:
            settings = json.loads(resp.read())
        base = str(settings.get(f"{settings['default_ui']}_base_url") or "/")
    except (urllib.error.URLError, OSError, ValueError, KeyError, TypeError, AttributeError):
        return ui
    return ui + base.rstrip("/") if base.startswith("/") else ui


def prefect_ui() -> str:
    """The Prefect UI's address as the running flow sees it (PREFECT_UI_URL, from PREFECT_API_URL by default)."""
    from prefect.settings import PREFECT_API_URL, PREFECT_UI_URL

    return str(PREFECT_UI_URL.value() or str(PREFECT_API_URL.value() or "").removesuffix("/api"))


def flow_run_url(ui: str, flow_run_id: str) -> str:
    """A flow run's page in the UI `prefect_ui_base` finds (both UIs use the same paths below their base)."""
    return f"{prefect_ui_base(ui)}/runs/flow-run/{flow_run_id}"


def deployment_url(ui: str, deployment_id: str) -> str:
    """A deployment's page in the UI `prefect_ui_base` finds."""
    return f"{prefect_ui_base(ui)}/deployments/deployment/{deployment_id}"


def generated_name(name: str) -> bool:
    """Whether Prefect made `name` up (the server's `adjective-animal`, the Custom run form's suggestion) rather
    than the user typing it."""
    if UI_SUGGESTION.fullmatch(name) or UI_V2_SUGGESTION.fullmatch(name):
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
    """Install `_UserErrorRecords` on Prefect's flow-run and task-run loggers, `_FailedAtError` on the flow-run
    logger and `_CancelledAtInfo` on the task-run logger (once)."""
    for name in ("prefect.flow_runs", "prefect.task_runs"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _UserErrorRecords) for f in logger.filters):
            logger.addFilter(_UserErrorRecords())
    flow_runs = logging.getLogger("prefect.flow_runs")
    if not any(isinstance(f, _FailedAtError) for f in flow_runs.filters):
        flow_runs.addFilter(_FailedAtError())
    task_runs = logging.getLogger("prefect.task_runs")
    if not any(isinstance(f, _CancelledAtInfo) for f in task_runs.filters):
        task_runs.addFilter(_CancelledAtInfo())


class _CancelledAtInfo(logging.Filter):
    """On Prefect's task-run logger: the task engine's last line of a task that ended Cancelled ("Finished in state
    Cancelled(...)", logged at ERROR for any state but Completed) is logged at INFO: a cancel the user asked for
    is not an error, and a log filtered to errors must not show one for it."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR and record.getMessage().startswith(f"{FINISHED}Cancelled("):
            record.levelno, record.levelname = logging.INFO, logging.getLevelName(logging.INFO)
        return True


def runner_cancelling() -> bool:
    """Whether Prefect's runner is cancelling this flow run's process: it sets a "cancel" intent through its
    control channel before its SIGTERM (`prefect._internal.control_listener`, Prefect >= 3.7; False without it).
    The engine then ends the process cleanly (exit 0, one INFO line) on the termination signal."""
    try:
        from prefect._internal.control_listener import get_intent
    except ImportError:
        return False
    return bool(get_intent() == "cancel")


def end_flow_run_as(state: Any) -> bool:
    """Set the running flow run's state to the final `state` on the server (forced) and in the engine's own copy,
    so a termination signal raised out of the flow afterwards ends the run in that state: the engine treats a
    signal after a final state as the end of the run, not a crash, logs "Finished in state <state>" and, for the
    runner's cancel, exits 0. False (nothing set) outside a flow run or when the server does not answer."""
    from prefect.client.orchestration import SyncPrefectClient, get_client
    from prefect.context import FlowRunContext
    from prefect.utilities.engine import propose_state_sync

    ctx = FlowRunContext.get()
    if ctx is None or ctx.flow_run is None:
        return False
    try:
        if isinstance(ctx.client, SyncPrefectClient):
            new = propose_state_sync(ctx.client, state, flow_run_id=ctx.flow_run.id, force=True)
        else:
            with get_client(sync_client=True) as client:
                new = propose_state_sync(client, state, flow_run_id=ctx.flow_run.id, force=True)
    except Exception as exc:  # the flow then returns the state itself (the engine's way; exit 1)
        logging.getLogger("asp.orchestration").warning("could not set flow run state: %s", exc)
        return False
    run = ctx.flow_run  # the engine's FlowRun: its `state` is what the engine reads as the run's state
    run.state, run.state_name, run.state_type = new, new.name, new.type
    return True


def keep_cancel_message(flow: Any, flow_run: Any, state: Any) -> None:
    """`on_cancellation` hook (the runner calls it when a flow run is being cancelled, before it sets its own
    Cancelled state): in the background, `restore_cancel_message` for that run."""
    threading.Thread(
        target=restore_cancel_message, args=(str(flow_run.id),), name=f"asp-cancel-{flow_run.id}", daemon=True
    ).start()


def restore_cancel_message(flow_run_id: str, wait_s: float = CANCEL_WAIT_S, poll_s: float = 1.0) -> str | None:
    """Once flow run `flow_run_id` has been set Cancelled twice, the flow's own state and then the runner's over
    it (`RUNNER_CANCELLED`), set the flow's message again (the newest earlier Cancelled state's message that
    differs from the last one). Returns the message set, or None (no such state within `wait_s`, the
    run ended otherwise, or the server did not answer: the message then stays in the run's log)."""
    from prefect.client.orchestration import get_client
    from prefect.states import Cancelled

    log = logging.getLogger("asp.orchestration")
    deadline = time.monotonic() + wait_s
    try:
        with get_client(sync_client=True) as client:
            while time.monotonic() < deadline:
                state = client.read_flow_run(flow_run_id).state
                if state is not None and state.is_final() and not state.is_cancelled():
                    return None
                if state is not None and state.is_cancelled():
                    history = client.read_flow_run_states(flow_run_id)
                    cancelled = [s.message for s in history if s.is_cancelled()]
                    if len(cancelled) >= 2:  # the flow's, then the runner's over it
                        ours = [m for m in cancelled[:-1] if m and m != cancelled[-1]]
                        if not ours:
                            return None
                        client.set_flow_run_state(flow_run_id, Cancelled(message=ours[-1]), force=True)
                        return ours[-1]
                time.sleep(poll_s)
    except Exception as exc:  # the explanation is also in the run's log
        log.warning("could not keep the cancel message of flow run %s: %s", flow_run_id, exc)
    return None
