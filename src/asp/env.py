"""The process environment of the project's own entry points: offline defaults and termination signals.

`set_offline_defaults()`: DVC analytics off, Prefect analytics off, MLflow telemetry off, Hugging Face hub
offline. Values the user already set win (`os.environ.setdefault`); never applied to the user's shell.

`sigterm_as_interrupt()`: while the block runs, SIGTERM (a job scheduler, `kill`, `timeout`) raises `Terminated`,
a `KeyboardInterrupt`, in the main thread, so the cleanup Ctrl-C gets (MLflow runs end KILLED, temporary files
removed) happens too. It yields the signals it turned into `Terminated`, so a command can exit with 128 + the
signal (143) instead of Ctrl-C's 130.

`pid_alive(pid)`: whether a process of that id exists (one of another user's counts as alive).

`torch_threads(n)`: the block runs on `n` torch intra-op threads, and the count is put back afterwards (the hf and
vLLM engines around each call, the demo policy's warm start and evaluation).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from typing import Any

OFFLINE_DEFAULTS = {
    "DVC_NO_ANALYTICS": "1",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",  # Prefect's 20 s default times out on 2 busy cores
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "DO_NOT_TRACK": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "RAY_USAGE_STATS_ENABLED": "0",
}


def set_offline_defaults() -> None:
    """Apply `OFFLINE_DEFAULTS` without overriding anything already in the environment."""
    for key, value in OFFLINE_DEFAULTS.items():
        os.environ.setdefault(key, value)


class Terminated(KeyboardInterrupt):
    """SIGTERM turned into an interrupt: code that cleans up after Ctrl-C cleans up after it too."""

    def __init__(self, signum: int = signal.SIGTERM) -> None:
        super().__init__(f"signal {signum}")
        self.signum = signum


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[list[int]]:
    """Raise `Terminated` on the first SIGTERM while the block runs; later ones are ignored, so they cannot cut
    the cleanup short. Yields the list of signals received so far. Main thread only, and only where SIGTERM
    still has its default action (Prefect's and Ray's own handlers are left alone); otherwise a no-op."""
    received: list[int] = []
    main_thread = threading.current_thread() is threading.main_thread()
    if not main_thread or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield received
        return

    def handler(signum: int, frame: Any) -> None:
        received.append(signum)
        if len(received) == 1:
            raise Terminated(signum)

    signal.signal(signal.SIGTERM, handler)
    try:
        yield received
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def pid_alive(pid: int) -> bool:
    """Whether process `pid` exists: signal 0 reaches it, or it exists but belongs to another user."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextlib.contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """Run the block with `n` torch intra-op threads (None: leave as is), then restore the previous count.

    The hf and vLLM engines and the demo policy set their threads with it. One thread suits the demo's tiny model on
    a shared CPU (more threads spin-wait on each other; numbers in docs/benchmarks.md, "Design notes measured
    once"). Raises ValueError when `n` < 1.
    """
    import torch

    before = torch.get_num_threads()
    if n is not None:
        if n < 1:
            raise ValueError(f"num_threads must be >= 1 or None, got {n}")
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
