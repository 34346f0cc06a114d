"""`asp serve`: register the Prefect deployments asp-pipeline and asp-drift-loop and run their flow runs.

    asp ui prefect              # Prefect server + UI on http://127.0.0.1:4200
    asp serve                   # (other shell) = python -m asp.orchestration.serve [NAME], in its own process group

Its own module (not `flow.py`), so the two flows (`asp.orchestration.flow`, `asp.orchestration.drift_loop`) are
imported by this one module and never by each other. `prefect_api_url` and `check_server` import no prefect: the
`asp serve` command checks the server before Prefect reads its settings.
The deployment addresses it prints open the UI the server sends a user to (`asp.orchestration.prefect_run`).
"""

from __future__ import annotations

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


def serve(name: str = "asp-pipeline", on_ready: Callable[[str], object] = print) -> None:
    """Register the deployments (asp-pipeline/`name` and asp-drift-loop/asp-drift-loop) on the Prefect server,
    report their UI addresses to `on_ready`, then run their flow runs until Ctrl-C."""
    from prefect import serve as prefect_serve  # prefect reads PREFECT_API_URL once, when first imported
    from prefect.deployments.runner import EntrypointType

    from asp.orchestration.drift_loop import loop_deployment
    from asp.orchestration.flow import asp_pipeline
    from asp.orchestration.prefect_run import deployment_url

    deployment = asp_pipeline.to_deployment(
        name=name,
        concurrency_limit=1,  # one run at a time writes this workspace's outputs/ and dvc.lock
        description="The asp pipeline through DVC. Choose stages, a preset and param overrides (dotted keys).",
        tags=["asp"],
        entrypoint_type=EntrypointType.MODULE_PATH,
    )
    loop = loop_deployment()
    ui = prefect_api_url().rstrip("/").removesuffix("/api")
    for dep, flow_name in ((deployment, "asp-pipeline"), (loop, "asp-drift-loop")):
        on_ready(f"deployment '{flow_name}/{dep.name}': {deployment_url(ui, str(dep.apply()))}")
    prefect_serve(deployment, loop, print_starting_message=False)


if __name__ == "__main__":  # `asp serve` runs this in its own process group, so Ctrl-C / SIGTERM stop it for sure
    import sys

    serve(sys.argv[1] if len(sys.argv) > 1 else "asp-pipeline", lambda line: print(line, file=sys.stderr, flush=True))
