"""User-facing errors.

`UserError` is raised for bad input (files, params, data rows). The CLI turns it into a one-paragraph
message on stderr and exit code 2, with no traceback. Library code may raise `ValueError` for bad
arguments; the CLI treats those raised from argument validation the same way.
"""

from __future__ import annotations

import sys
from typing import NoReturn


class UserError(Exception):
    """Bad input that the user can fix. The message names the file/key/row/value and what to do."""

    exit_code = 2


def exit_user_error(message: str) -> NoReturn:
    """End a script on bad input as the CLI does: ``error: <message>`` on stderr and exit code 2, no traceback
    (benchmarks/ scripts: a missing kept run, a malformed option)."""
    print(f"error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(UserError.exit_code)
