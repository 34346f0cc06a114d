"""Run `asp ARGS` the way the `asp` script does, in this process or in a subprocess of its own.

In-process (the default) calls the console entry point, `asp.cli.main`, in `cwd` with stdout and stderr captured:
a subprocess costs 3-8 s of imports per call, and a module of CLI tests paid a minute for them. ``process=True``
runs the real script in a subprocess: keep one such case per kind of exit (the exit code the shell sees, and no
traceback on the real stream).
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from pathlib import Path


def run_asp(args: list[str], cwd: Path, process: bool = False) -> subprocess.CompletedProcess[str]:
    """`asp ARGS` in `cwd`: its exit code, stdout and stderr, as `subprocess.run(..., capture_output=True)` gives."""
    cmd = [sys.executable, "-m", "asp", *args]
    if process:
        env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"}
        return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    from asp.cli import main

    out, err, here = io.StringIO(), io.StringIO(), Path.cwd()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main(list(args))
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    finally:
        os.chdir(here)
    return subprocess.CompletedProcess(cmd, code, out.getvalue(), err.getvalue())
