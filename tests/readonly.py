"""Run a command that file permissions bind, also when the tests run as root.

As root, `chmod a-w` stops nothing: CAP_DAC_OVERRIDE lets root write any file. `unprivileged(cmd)` returns the
command prefixed with `setpriv --bounding-set -dac_override,-dac_read_search,-fowner`: the process (still uid 0,
so it reads the root-owned virtual environment) loses the capabilities that bypass permission bits, and a read-only
file or folder is read-only for it as for any user. As another user, the command is returned unchanged. When
neither works (root without setpriv, or a kernel that refuses the drop) the test is skipped, saying why.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys

import pytest

DROP = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search,-fowner"]


@functools.cache
def _prefix() -> tuple[list[str] | None, str]:
    """(prefix, why not): the command prefix that makes permission bits bind, or None and the reason."""
    if os.geteuid() != 0:
        return [], ""
    if shutil.which("setpriv") is None:
        return None, "running as root without setpriv: chmod cannot make a file read-only for this process"
    probe = (
        "import os, tempfile\nf = tempfile.mkstemp()[1]\nos.chmod(f, 0o444)\n"
        "try: open(f, 'w')\nexcept PermissionError: print('bound')\nos.remove(f)"
    )
    done = subprocess.run([*DROP, sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    if done.stdout.strip() != "bound":
        return None, f"setpriv could not drop CAP_DAC_OVERRIDE here ({done.stderr.strip()[:200] or done.stdout})"
    return DROP, ""


def unprivileged(cmd: list[str]) -> list[str]:
    """`cmd` run so that read-only files and folders are read-only for it; skips the test when impossible."""
    prefix, why = _prefix()
    if prefix is None:
        pytest.skip(why)
    return [*prefix, *cmd]
