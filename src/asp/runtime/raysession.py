"""Local Ray clusters a killed owner left behind: recorded when started, stopped the next time one starts.

`ray.init()` without an address starts a local cluster whose GCS server and raylet die with the process that
started it, but not all of it does: after a SIGKILL (out of memory, `kill -9`, a lost job) Ray's agent processes
(``ray::DashboardAgent``, ``ray::RuntimeEnvAgent``) and sometimes workers keep running (a minute or more, holding
memory and ports). So `record_local_ray` (called by `asp.runtime.run.ray_session` right after it started Ray) writes
``<tmp>/asp-ray-<uid>/<pid>.json``: the owner process (pid and start time), the Ray session directory and every
process of the cluster then (pid, start time, name). `forget_local_ray` removes the record after `ray.shutdown`.
`reap_dead_sessions` (called before a local cluster is started, and by the launch stage when it starts) looks at
every record whose owner is gone: it stops (SIGTERM, then SIGKILL) the recorded processes still running with the same
start time and any other process that has files of that session directory open, prints what it stopped, and removes
the record. Records of a live owner are never touched. Tests: tests/runtime/test_raysession.py (a real SIGKILL).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import psutil

log = logging.getLogger(__name__)
STOP_TIMEOUT_S = 5.0


def registry() -> Path:
    """Where the records are kept: a per-user directory under the system's temporary directory."""
    return Path(tempfile.gettempdir()) / f"asp-ray-{os.getuid()}"


def _start_time(pid: int) -> float | None:
    try:
        proc = psutil.Process(pid)
        return None if proc.status() == psutil.STATUS_ZOMBIE else proc.create_time()
    except psutil.Error:
        return None


def _session_dir() -> str | None:
    try:
        from ray._private import worker

        return str(worker._global_node.get_session_dir_path())
    except Exception:  # noqa: BLE001 - a private Ray API: no session directory known
        return None


def record_local_ray() -> Path | None:
    """Record the local Ray cluster this process just started (see the module docstring); returns the record."""
    me = psutil.Process()
    processes = []
    for child in me.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            processes.append({"pid": child.pid, "start": child.create_time(), "name": child.name()})
    record = {"pid": me.pid, "start": me.create_time(), "session_dir": _session_dir(), "processes": processes}
    path = registry() / f"{me.pid}.json"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(record))
        tmp.replace(path)
    except OSError as exc:  # never fail a run over the bookkeeping
        log.warning("could not record the local Ray cluster in %s: %s", path, exc)
        return None
    return path


def forget_local_ray() -> None:
    """Remove this process's record (its Ray was shut down)."""
    (registry() / f"{os.getpid()}.json").unlink(missing_ok=True)


def _owner_alive(record: dict[str, Any]) -> bool:
    started = _start_time(int(record["pid"]))
    return started is not None and abs(started - float(record["start"])) < 1.0


def leftovers(record: dict[str, Any]) -> list[Any]:
    """The still-running processes of a recorded cluster: recorded ones (same start time) and any process holding
    files of its session directory open."""
    found: dict[int, Any] = {}
    for entry in record.get("processes", []):
        started = _start_time(int(entry["pid"]))
        if started is not None and abs(started - float(entry["start"])) < 1.0:
            with contextlib.suppress(psutil.Error):
                found[int(entry["pid"])] = psutil.Process(int(entry["pid"]))
    session = record.get("session_dir")
    if session:
        for proc in psutil.process_iter(["pid", "uids"]):
            if proc.pid in found or proc.pid == os.getpid():
                continue
            with contextlib.suppress(psutil.Error):
                if any(f.path.startswith(session + os.sep) for f in proc.open_files()):
                    found[proc.pid] = proc
    return list(found.values())


def _stop(procs: list[Any]) -> list[str]:
    """SIGTERM `procs`, SIGKILL what is left after `STOP_TIMEOUT_S`; returns 'name (pid N)' of each."""
    names = []
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            names.append(f"{proc.name()} (pid {proc.pid})")
            proc.terminate()
    _, alive = psutil.wait_procs(procs, timeout=STOP_TIMEOUT_S)
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(alive, timeout=STOP_TIMEOUT_S)
    return names


def reap_dead_sessions() -> list[str]:
    """Stop what local Ray clusters of dead owners left running (see the module docstring); prints one line per
    cluster and returns the 'name (pid N)' of every process stopped."""
    folder = registry()
    if not folder.is_dir():
        return []
    stopped: list[str] = []
    for path in sorted(folder.glob("*.json")):
        try:
            record = json.loads(path.read_text())
            if _owner_alive(record):
                continue
        except (OSError, ValueError, KeyError, TypeError):
            path.unlink(missing_ok=True)  # unreadable: nothing to go by
            continue
        names = _stop(leftovers(record))
        path.unlink(missing_ok=True)
        if names:
            print(
                f"[ray] stopped {len(names)} process(es) of the local Ray cluster of process {record['pid']}, which "
                f"was killed without shutting it down ({record.get('session_dir') or 'session unknown'}): "
                + ", ".join(names),
                file=sys.stderr,
                flush=True,
            )
        stopped += names
    return stopped
