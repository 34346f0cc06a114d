"""Child processes of the `asp` commands: long-running servers that stop cleanly with their wrapper.

`check_port_free(host, port, what)` fails with a `UserError` (exit 2) when something already listens there.
`run_server(cmd, env, ...)` starts a server in its own process group, optionally waits until a URL answers
(then calls `on_ready`), and runs until the server exits or the wrapper gets SIGINT / SIGTERM; on a signal it
stops the server's whole process tree (SIGTERM, then SIGKILL after a timeout) and returns. `exit_like` turns
the outcome into the wrapper's exit code (130 / 143 after a signal). Used by `asp ui mlflow|prefect`
(src/asp/cli/ui.py); tests: tests/test_ui_servers.py.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable

import typer

from asp.errors import UserError

STOP_TIMEOUT_S = 15.0


def check_port_free(host: str, port: int, what: str) -> None:
    """Raise `UserError` if `host:port` cannot be bound (another server listens there), `port` is outside 1-65535
    or `host` is unknown."""
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise UserError(f"cannot start {what}: port {port!r} is not a TCP port; give --port a number from 1 to 65535.")
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as exc:
        raise UserError(f"cannot start {what}: unknown host {host!r} ({exc.strerror}); use --host 127.0.0.1.") from exc
    with socket.socket(family, kind, proto) as sock:
        # Like the servers themselves: a port left in TIME_WAIT counts as free, one with a listener does not.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(address)
        except OSError as exc:
            raise UserError(
                f"cannot start {what}: port {port} on {host} is already in use ({exc.strerror}). "
                f"Stop the other server there, or choose another port with --port N."
            ) from exc


def answers(url: str, timeout_s: float = 2.0) -> bool:
    """Whether GET `url` returns a 2xx answer."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return 200 <= resp.status < 300
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return False


def run_server(
    cmd: list[str],
    env: dict[str, str],
    *,
    ready_url: str | None = None,
    on_ready: Callable[[], None] | None = None,
    stop_timeout_s: float = STOP_TIMEOUT_S,
) -> tuple[int, list[int]]:
    """Run a server until it exits or this process gets SIGINT / SIGTERM; return its exit code and the signals.

    The server gets its own process group, so a signal to this wrapper alone (`kill PID`, a scheduler) stops it
    as well as Ctrl-C at a terminal does: the whole tree gets SIGTERM, and whatever is left after
    `stop_timeout_s` gets SIGKILL. `on_ready` runs once `ready_url` answers (e.g. to print the UI's URL)."""
    received: list[int] = []

    def note(signum: int, frame: object) -> None:
        received.append(signum)

    previous = {sig: signal.signal(sig, note) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        proc = subprocess.Popen(cmd, env=env, start_new_session=True)
        try:
            ready = ready_url is None
            while not received and proc.poll() is None:
                if not ready and answers(ready_url or "", timeout_s=1.0):
                    ready = True
                    if on_ready is not None:
                        on_ready()
                time.sleep(0.2 if ready else 0.5)
        finally:
            if proc.poll() is None:
                stop_tree(proc, stop_timeout_s)
        return proc.wait(), received
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def stop_tree(proc: subprocess.Popen, timeout_s: float = STOP_TIMEOUT_S) -> None:
    """SIGTERM `proc`'s process group and every descendant; SIGKILL what is still alive after `timeout_s`."""
    import psutil  # a dependency of dvc

    try:
        descendants = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        descendants = []
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGTERM)
    for child in descendants:  # those that started their own session are not in the group
        with contextlib.suppress(psutil.Error):
            child.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout_s)
    _, alive = psutil.wait_procs(descendants, timeout=max(0.0, deadline - time.monotonic()))
    if proc.poll() is None or alive:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        for child in alive:
            with contextlib.suppress(psutil.Error):
                child.kill()
        psutil.wait_procs(alive, timeout=5)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(5)


def exit_like(rc: int, signals: list[int]) -> None:
    """Exit as a command stopped by Ctrl-C / SIGTERM (130 / 143; main() says so), else with the sub-process's
    code (128 + N when signal N killed it, as a shell reports it)."""
    raise typer.Exit(128 + signals[0] if signals else rc if rc >= 0 else 128 - rc)
