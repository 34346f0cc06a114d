"""Thin Prefect entry points (`python -m flows.pipeline`, `python -m flows.drift_loop`); the flows live in
`asp.orchestration`. `run_flow` gives both the same exit codes and one-line messages."""

from __future__ import annotations

import sys
from collections.abc import Callable


def run_flow(run: Callable[[], object], what: str) -> int:
    """Call `run` (checks and the flow call) and return the entry point's exit code: 0 done; 2 a `UserError`
    (its one message); 130 Ctrl-C; 1 any other failure (Prefect has logged the output and traceback), said as
    ``error: <what> failed: ...``."""
    from asp.errors import UserError

    try:
        run()
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # Prefect has logged the output and traceback
        print(f"error: {what} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0
