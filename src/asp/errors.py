"""User-facing errors.

`UserError` is raised for bad input (files, params, data rows). The CLI turns it into a one-paragraph
message on stderr and exit code 2, with no traceback. Library code may raise `ValueError` for bad
arguments; the CLI treats those raised from argument validation the same way.
"""

from __future__ import annotations


class UserError(Exception):
    """Bad input that the user can fix. The message names the file/key/row/value and what to do."""

    exit_code = 2
