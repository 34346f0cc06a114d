"""Test hooks, read here and nowhere else: kill the process at a named phase boundary; record what the simulated
trainer trained. Never set them outside tests.

    ASP_KILL_AT=launch:outputs asp stage launch      # dies right after outputs/launch was written
    ASP_TRAINER_LEDGER=/tmp/ledger.jsonl asp stage launch   # runtime.trainer.kind simulated: one line per step trained
    ASP_HOLD_CONTINUATION=1 ASP_KILL_AT=checkpoint@2 asp stage launch   # partial rollouts: held work at the kill
    ASP_KILL_AT=pass@2 asp stage launch              # runtime.history: just after the pass-2 plan was checkpointed
    ASP_HOLD_AT=checkpoint@2 ASP_HOLD_MARK=/tmp/held asp stage launch   # waits there until a signal stops it

`kill_point(name)` does nothing unless the environment variable ``ASP_KILL_AT`` equals `name`; then it sends SIGKILL
to its own process (no cleanup, no `finally`, no atexit: what `kill -9`, the out-of-memory killer or a lost node
do). With ``ASP_HOLD_AT`` equal to `name` instead, it writes its PID to the file ``ASP_HOLD_MARK`` and waits there
until a signal stops it (Ctrl-C, SIGTERM, a Prefect Cancel: what a user's stop does, at a known point). The names
are listed in `POINTS` (``<step>`` / ``<index>`` stand for a number). `trainer_ledger()` is the
path in ``ASP_TRAINER_LEDGER`` (or None): the launch stage's simulated trainer then appends a line per step with
the prompts it trained (`asp.trainers.SimulatedTrainer`), so a test can check that no prompt was trained twice
across a kill and a rerun. `hold_continuation()` (``ASP_HOLD_CONTINUATION=1``, partial rollouts) is a gate: the Ray
Control Unit keeps the run's first continuation item back (it stays out, its rows held) until its first checkpoint
was saved, so that checkpoint certainly holds unfinished responses (tests/pipeline/test_partial_kill.py kills there).
tests/pipeline/test_kill_points.py kills `launch` and `profile` at each point and checks
what the rerun does (docs/reliability.md).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

KILL_ENV = "ASP_KILL_AT"
LEDGER_ENV = "ASP_TRAINER_LEDGER"
HOLD_ENV = "ASP_HOLD_CONTINUATION"
HOLD_AT_ENV = "ASP_HOLD_AT"
HOLD_MARK_ENV = "ASP_HOLD_MARK"
POINTS = {
    "checkpoint@<step>": "runtime: the position of <step> and its run-log segment saved, its metrics not yet logged",
    "pass@<pass>": "runtime: the first checkpoint holding the history-aware plan of pass <pass> (a pass boundary)",
    "launch:start": "launch: the run and its MLflow run are recorded, nothing trained yet",
    "launch:trained": "launch: the training loop returned (summary logged), nothing of the end of the run done",
    "launch:evaluated": "launch: the held-out reward was measured (grpo), no output written",
    "launch:outputs": "launch: outputs/launch written, metrics file, plot and final metrics not yet",
    "profile:start": "profile: work directory and MLflow run recorded, nothing generated",
    "profile:chunk@<index>": "profile: chunk <index> written",
    "profile:chunks": "profile: every chunk written, no output yet",
    "profile:outputs": "profile: outputs/profile written, timings, metrics and plot not yet",
}


def kill_point(name: str) -> None:
    """SIGKILL this process when ``ASP_KILL_AT`` is `name`; hold it there until a signal when ``ASP_HOLD_AT`` is
    (see the module docstring); otherwise nothing."""
    if os.environ.get(HOLD_AT_ENV) == name:
        print(f"[hold point] {name}: waiting for a signal", file=sys.stderr, flush=True)
        mark = os.environ.get(HOLD_MARK_ENV)
        if mark:
            Path(mark).write_text(str(os.getpid()))
        while True:
            time.sleep(0.1)
    if os.environ.get(KILL_ENV) != name:
        return
    print(f"[kill point] {name}: SIGKILL", file=sys.stderr, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


def trainer_ledger() -> str | None:
    """The simulated trainer's ledger path from ``ASP_TRAINER_LEDGER`` (None when unset)."""
    return os.environ.get(LEDGER_ENV) or None


def hold_continuation() -> bool:
    """Whether ``ASP_HOLD_CONTINUATION`` asks the Control Unit to keep its first continuation item back until its first
    checkpoint is saved (see the module docstring)."""
    return os.environ.get(HOLD_ENV, "") not in ("", "0")
