"""Prefect entry point of the drift loop (the flow lives in `asp.orchestration.drift_loop`; this file stays thin).

Serve for the UI:  asp ui prefect   then, in another shell,   asp serve   (deployment asp-drift-loop/asp-drift-loop)
Run once:          python -m flows.drift_loop                    (at most drift.max_actions re-profiles)
                   python -m flows.drift_loop --max-actions 0    (one plain launch: no hand-off)

Exit codes: 0 done; 2 bad input (params, dvc.yaml, an unreadable drift_pending.json); 1 launch or the re-profile
failed; 130 Ctrl-C. Without PREFECT_API_URL the flow runs on a throw-away Prefect server (nothing shows in the UI).
"""

from __future__ import annotations

import argparse
import sys

from asp.env import set_offline_defaults
from flows import run_flow


def main(argv: list[str] | None = None) -> int:
    """`python -m flows.drift_loop [--max-actions N]`; returns the exit code."""
    parser = argparse.ArgumentParser(prog="python -m flows.drift_loop", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--max-actions", type=int, default=None, help="re-profiles at most (default: drift.max_actions)"
    )
    args = parser.parse_args(argv)
    set_offline_defaults()

    def run() -> None:
        from asp.orchestration.drift_loop import asp_drift_loop

        asp_drift_loop(args.max_actions)

    return run_flow(run, "the drift loop")


if __name__ == "__main__":
    sys.exit(main())
