"""`asp serve`: register the Prefect deployments asp-pipeline and asp-drift-loop and run their flow runs.

    asp ui prefect              # Prefect server + UI on http://127.0.0.1:4200
    asp serve                   # (other shell) = python -m asp.orchestration.serve [NAME], in its own process group

Its own module (not `flow.py`), so the two flows (`asp.orchestration.flow`, `asp.orchestration.drift_loop`) are
imported by this one module and never by each other. `prefect_api_url` and `check_server` import no prefect: the
`asp serve` command checks the server before Prefect reads its settings.
The deployment addresses it prints open the UI the server sends a user to (`asp.orchestration.prefect_run`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import urllib.error
import urllib.request
from collections.abc import Callable

from asp.errors import UserError

DEFAULT_API = "http://127.0.0.1:4200/api"


def prefect_api_url() -> str:
    """PREFECT_API_URL, else the `asp ui prefect` server at 127.0.0.1:4200 (never a throw-away server)."""
    return os.environ.get("PREFECT_API_URL") or DEFAULT_API


def check_server(api_url: str, timeout_s: float = 5.0) -> None:
    """`UserError` with what to do when no Prefect server answers at `api_url`."""
    try:
        with urllib.request.urlopen(f"{api_url.rstrip('/')}/health", timeout=timeout_s) as resp:
            if resp.status == 200:
                return
    except (urllib.error.URLError, OSError):
        pass
    raise UserError(
        f"no Prefect server answers at {api_url}. Start one in another shell with `asp ui prefect` "
        "(or point PREFECT_API_URL at yours), then run `asp serve` again."
    )


DESCRIPTION = (
    "The asp pipeline through DVC. Choose stages (none: all), a preset, and overrides: one SECTION.KEY=VALUE per "
    "item (Add item), e.g. schedule.k=3; with a preset or overrides the run is a DVC experiment and params.yaml "
    "stays as it is. force=true reruns stages DVC finds up to date. Cancel from the run's menu puts the workspace "
    "back. How to run, read and cancel a run: docs/ui.md."
)


def _sigterm_ends_serving(signum: int, frame: object) -> None:
    """SIGTERM (`asp serve`'s wrapper on Ctrl-C, a service manager) ends serving as Ctrl-C does: Prefect's own
    handler calls the runner's `stop()` from inside its event loop, where that returns the `astop()` coroutine
    without running it ("coroutine 'Runner.astop' was never awaited") and exits at once."""
    from prefect.exceptions import TerminationSignal

    raise TerminationSignal(signal=signum)


def serve(name: str = "asp-pipeline", on_ready: Callable[[str], object] = print) -> None:
    """Register the deployments (asp-pipeline/`name` and asp-drift-loop/asp-drift-loop) on the Prefect server,
    report their UI addresses to `on_ready`, then run their flow runs until Ctrl-C or SIGTERM (as `prefect.serve`
    does, with `_sigterm_ends_serving` for SIGTERM)."""
    from prefect.deployments.runner import EntrypointType  # prefect reads PREFECT_API_URL once, when first imported
    from prefect.exceptions import TerminationSignal
    from prefect.runner import Runner

    from asp.orchestration.drift_loop import loop_deployment
    from asp.orchestration.flow import asp_pipeline
    from asp.orchestration.prefect_run import deployment_url

    deployment = asp_pipeline.to_deployment(
        name=name,
        concurrency_limit=1,  # one run at a time writes this workspace's outputs/ and dvc.lock
        description=DESCRIPTION,
        tags=["asp"],
        entrypoint_type=EntrypointType.MODULE_PATH,
    )
    loop = loop_deployment()
    ui = prefect_api_url().rstrip("/").removesuffix("/api")
    for dep, flow_name in ((deployment, "asp-pipeline"), (loop, "asp-drift-loop")):
        on_ready(f"deployment '{flow_name}/{dep.name}': {deployment_url(ui, str(dep.apply()))}")
    runner = Runner(pause_on_shutdown=True)
    runner.handle_sigterm = _sigterm_ends_serving  # what `start` installs for SIGTERM
    for dep in (deployment, loop):
        runner.add_deployment(dep)
    try:
        asyncio.run(runner.start())
    except (KeyboardInterrupt, TerminationSignal) as exc:
        logging.getLogger("asp.orchestration").info("%s: stopped serving", type(exc).__name__)


if __name__ == "__main__":  # `asp serve` runs this in its own process group, so Ctrl-C / SIGTERM stop it for sure
    import sys

    serve(sys.argv[1] if len(sys.argv) > 1 else "asp-pipeline", lambda line: print(line, file=sys.stderr, flush=True))
