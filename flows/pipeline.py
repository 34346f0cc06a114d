"""Prefect entry point of the pipeline (the flow lives in `asp.orchestration.flow`; this file stays thin).

Serve for the UI:  asp ui prefect   then, in another shell,   asp serve
Run once:          python -m flows.pipeline                        (all stages, in dvc.yaml order)
                   python -m flows.pipeline schedule launch        (just these)
                   python -m flows.pipeline schedule --set schedule.k=3   (a DVC experiment; params.yaml untouched)

Exit codes: 0 done; 2 bad input (unknown stage, preset or param; one message); 1 a stage failed; 130 Ctrl-C.
Without PREFECT_API_URL the flow runs on a throw-away Prefect server (nothing shows in the UI); set it (as
`asp ui prefect` prints) to see the run there.
"""

from __future__ import annotations

import argparse
import sys

from asp.env import set_offline_defaults
from flows import run_flow


def main(argv: list[str] | None = None) -> int:
    """`python -m flows.pipeline [STAGE ...] [--preset P] [--set K=V ...] [--force]`; returns the exit code."""
    from asp.errors import UserError
    from asp.orchestration.request import RunRequest, check_request, parse_set_args
    from asp.stage import stage_names

    try:
        epilog = f"stages (dvc.yaml order): {' '.join(stage_names())}"
    except UserError as exc:
        epilog = str(exc)
    parser = argparse.ArgumentParser(
        prog="python -m flows.pipeline", description=__doc__.split("\n\n")[0], epilog=epilog
    )
    parser.add_argument("stages", nargs="*", metavar="STAGE", help="stages to run (default: all)")
    parser.add_argument("--preset", help="preset in configs/ for this run only (a DVC experiment)")
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="K=V", help="param override")
    parser.add_argument("--force", action="store_true", help="rerun stages DVC finds up to date")
    args = parser.parse_args(argv)
    set_offline_defaults()

    def run() -> None:
        overrides = parse_set_args(args.sets)
        check_request(RunRequest(tuple(args.stages), args.preset, overrides, args.force))  # before Prefect starts
        from asp.orchestration.flow import NO_PRESET, asp_pipeline

        asp_pipeline(args.stages, args.preset or NO_PRESET, "\n".join(args.sets), args.force)  # parsed again there

    return run_flow(run, "the pipeline")


if __name__ == "__main__":
    sys.exit(main())
