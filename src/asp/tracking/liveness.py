"""Owner-process liveness: every run records the process that owns it (pid, host, start time), so a later run can
tell a run whose owner died without ending it (SIGKILL, out of memory) from one that is still running.

    tags = owner_tags()          # {"asp.pid": "123", "asp.host": "h", "asp.pid_start": "1700000000.12"}
    owner_alive(tags)            # False only when the owner is provably gone (same host, pid dead or reused)

These tags, and the run's key (`asp.run_key`: which earlier runs a new one may sweep), are bookkeeping of a RUNNING
run: `asp.tracking.end_run` deletes them (`BOOKKEEPING_TAGS`) when the run ends, so a finished run shows the user
only what describes it.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping

import psutil

PID_TAG, HOST_TAG, START_TAG = "asp.pid", "asp.host", "asp.pid_start"
RUN_KEY_TAG = "asp.run_key"  # a stage's name, `pipeline` for parent runs: a new run sweeps dead runs of its key
BOOKKEEPING_TAGS = (PID_TAG, HOST_TAG, START_TAG, RUN_KEY_TAG)


def owner_tags() -> dict[str, str]:
    """Tags naming this process (pid, host, start time), so a later run can tell a dead owner from a live one."""
    return {PID_TAG: str(os.getpid()), HOST_TAG: socket.gethostname(), START_TAG: process_start(os.getpid()) or ""}


def process_start(pid: int) -> str | None:
    """When process `pid` started (seconds since the epoch, as text); None if no such live process."""
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
        return f"{proc.create_time():.2f}"
    except psutil.NoSuchProcess:
        return None
    except psutil.Error:  # access denied: it exists
        return "?"


def owner_alive(tags: Mapping[str, str]) -> bool:
    """Whether the process a run's tags name may still be running. Unknown (another host, no owner tags) counts
    as alive: only a run whose owner is provably gone is ever marked KILLED."""
    if tags.get(HOST_TAG) != socket.gethostname() or not tags.get(PID_TAG, "").isdigit():
        return True
    started = process_start(int(tags[PID_TAG]))
    if started is None:
        return False
    try:
        return abs(float(started) - float(tags.get(START_TAG, ""))) < 1.0  # else: the pid was reused
    except ValueError:  # start time unknown: the pid alone says alive
        return True
