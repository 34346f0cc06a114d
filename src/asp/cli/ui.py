"""`asp ui mlflow|prefect`: the local web UIs, bound to 127.0.0.1, stopped with Ctrl-C or SIGTERM.

    asp ui mlflow [--port 5000]    MLflow server on the project's store; prints the experiment's runs URL
    asp ui prefect [--port 4200]   Prefect server + UI (analytics off); then `asp serve` in another shell

Both check that the port is free first (exit 2 with a message when it is taken or outside 1-65535) and print the
URL to open once the server answers. With `--host` other than loopback (e.g. 0.0.0.0: every interface) they say
what they bind and warn that the UI has no authentication. The server runs in its own process group; Ctrl-C or
SIGTERM to `asp` stops its whole process tree (SIGKILL after 15 s) and `asp` exits 130 / 143. The MLflow server
runs one uvicorn worker with job execution off (no huey job runners), about 0.5 GB RSS for the whole tree. Its URL
opens the classic machine-learning view of the experiment (`?workflowType=machine_learning`; MLflow 3 defaults to
GenAI).
"""

from __future__ import annotations

import importlib.util
import ipaddress
import json
import os
import socket
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Annotated, Any

import typer

from asp.cli.procs import check_port_free, exit_like, run_server
from asp.errors import UserError

# as asp.cli's
PLAIN: dict[str, Any] = {"no_args_is_help": True, "rich_markup_mode": None, "pretty_exceptions_enable": False}
app = typer.Typer(help="Local web UIs (bound to 127.0.0.1 unless --host says otherwise).", **PLAIN)

PortOpt = Annotated[int, typer.Option(min=1, max=65535, help="port to listen on (1-65535)")]
HostOpt = Annotated[
    str, typer.Option(help="interface to bind; keep 127.0.0.1 (loopback only: the UIs have no authentication)")
]
# Job execution (on by default in MLflow 3) starts a job runner and 7 huey consumers, ~1.2 GB RSS more, for
# GenAI features (scorers, online evaluation) that this project does not use.
MLFLOW_SERVER_ENV = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", "MLFLOW_DISABLE_TELEMETRY": "true"}
CLASSIC_VIEW = "workflowType=machine_learning"  # MLflow 3's UI toggle; without it the UI opens the GenAI view

# `prefect server start`, with the API running again a request Prefect answered 503 (its SQLite database busy)
PREFECT_SERVER_CMD = [sys.executable, "-m", "asp.cli.prefect_server", "server", "start"]


DatabaseOpt = Annotated[
    str | None,
    typer.Option(
        "--database-url",
        help="PostgreSQL database for a server a team shares: postgresql://USER[:PASSWORD]@HOST[:PORT]/DATABASE "
        "(one database for Prefect, another for MLflow); default: the embedded SQLite file",
    ),
]
POSTGRES_DRIVERS = {"prefect": "asyncpg", "mlflow": "psycopg2"}  # the driver each server's SQLAlchemy uses
POSTGRES_EXTRA = "pip install -e '.[postgres]'"


def redact(url: str) -> str:
    """`url` with its password (if any) replaced by ***, for messages and banners."""
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def postgres_url(url: str, server: str) -> str:
    """The SQLAlchemy URL through which `server` ("prefect" or "mlflow") reaches the PostgreSQL database `url`
    (postgresql:// or postgres://, any +driver replaced by the server's own).

    Raises:
        UserError: `url` is not a PostgreSQL URL naming a database, or the server's driver is not installed.
    """
    parts = urllib.parse.urlsplit(url)
    if parts.scheme.split("+")[0] not in ("postgresql", "postgres") or not parts.path.strip("/") or not parts.hostname:
        raise UserError(
            f"--database-url {redact(url)!r} is not a PostgreSQL database URL: give "
            "postgresql://USER[:PASSWORD]@HOST[:PORT]/DATABASE (one database for Prefect, another for MLflow)."
        )
    driver = POSTGRES_DRIVERS[server]

    if importlib.util.find_spec(driver) is None:
        raise UserError(f"the {server} server needs the Python package {driver} for PostgreSQL: {POSTGRES_EXTRA}.")
    return urllib.parse.urlunsplit(parts._replace(scheme=f"postgresql+{driver}"))


def prefect_server_env(database_url: str | None = None) -> dict[str, str]:
    """The Prefect server's database: its embedded SQLite file (PREFECT_HOME/prefect.db) without `database_url`,
    else the PostgreSQL database at `database_url` (through asyncpg, Prefect's driver for it)."""
    if not database_url:
        return {}
    return {"PREFECT_SERVER_DATABASE_CONNECTION_URL": postgres_url(database_url, "prefect")}


def base_url(host: str, port: int) -> str:
    """The URL a browser on this machine uses for a server bound to `host`."""
    if host in ("", "0.0.0.0"):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def is_loopback(host: str) -> bool:
    """Whether binding `host` keeps a server on this machine only (127.0.0.0/8, ::1, a name that resolves there)."""
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        pass
    try:
        found = {info[4][0] for info in socket.getaddrinfo(host, None)}
    except (OSError, UnicodeError):
        return False
    return bool(found) and all(ipaddress.ip_address(str(a).split("%")[0]).is_loopback for a in found)


def announce(what: str, host: str, port: int, doing: str) -> None:
    """Print on stderr what the server binds; for anything but loopback, warn that it is open to the network and
    has no authentication."""
    base = base_url(host, port)
    if is_loopback(host):
        typer.echo(f"starting {what} on {base} {doing}...", err=True)
        return
    every = host in ("", "0.0.0.0", "::")
    bound = f"every network interface ({host or '0.0.0.0'}) port {port}" if every else f"{host} port {port}"
    here = f"; on this machine open {base}" if every else ""
    typer.echo(f"starting {what} bound to {bound}{here} {doing}...", err=True)
    typer.echo(
        f"warning: {what} has no authentication: anyone who can reach port {port} of this machine can read and "
        "change what it serves. Unless this network is trusted, keep --host 127.0.0.1 (the default) and reach it "
        f"through an SSH tunnel (ssh -L {port}:127.0.0.1:{port} THIS_HOST).",
        err=True,
    )


def experiment_runs_url(base: str, experiment_id: str) -> str:
    """The runs table of an experiment in the classic machine-learning view of the MLflow 3 UI."""
    return f"{base}/#/experiments/{experiment_id}/runs?{CLASSIC_VIEW}"


def _api(base: str, endpoint: str, body: dict | None = None, query: dict | None = None) -> dict:
    url = f"{base}/api/2.0/mlflow/{endpoint}" + (f"?{urllib.parse.urlencode(query)}" if query else "")
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as resp:
        return json.loads(resp.read() or b"{}")


def server_experiment_id(base: str, name: str, artifact_location: str | None) -> str:
    """The id of experiment `name` on the MLflow server at `base`, created (as the pipeline would) if missing.

    Through the server's REST API, so this process does not import mlflow (~200 MB) for the lifetime of the UI."""
    for attempt in range(2):
        try:
            found = _api(base, "experiments/get-by-name", query={"experiment_name": name})
            return found["experiment"]["experiment_id"]
        except urllib.error.HTTPError as exc:
            if exc.code != 404 or attempt:
                raise
        body = {"name": name, **({"artifact_location": artifact_location} if artifact_location else {})}
        try:
            return _api(base, "experiments/create", body=body)["experiment_id"]
        except urllib.error.HTTPError:  # created meanwhile by a stage: look it up again
            continue
    raise RuntimeError(f"experiment {name!r} not found")  # not reached


@app.command("mlflow")
def ui_mlflow(port: PortOpt = 5000, host: HostOpt = "127.0.0.1", database_url: DatabaseOpt = None) -> None:
    """Start the MLflow UI on the project's store (one worker, no job runners) and print the experiment's URL.

    With --database-url the store is that PostgreSQL database and the server keeps artifacts itself (under
    ./mlartifacts, served as mlflow-artifacts:/): clients then log through the server (MLFLOW_TRACKING_URI=its URL).
    """
    from asp.config import load_params
    from asp.tracking import ARTIFACT_DIR, check_store, resolve_tracking_uri
    from asp.tracking.store import relocate_artifacts

    common = load_params().common if Path("params.yaml").is_file() else None
    uri = postgres_url(database_url, "mlflow") if database_url else None
    uri = uri or resolve_tracking_uri(common.tracking_uri if common else None)
    experiment = common.experiment if common else "asp"
    check_port_free(host, port, "the MLflow UI")
    check_store(uri, writable=False)
    relocate_artifacts(uri)
    artifact_root = Path(ARTIFACT_DIR).resolve().as_uri()
    cmd = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", uri]
    if database_url:  # a team's server: artifacts through the server (mlflow-artifacts:/), wherever clients run
        cmd += ["--artifacts-destination", artifact_root]
    else:
        cmd += ["--default-artifact-root", artifact_root]
    cmd += ["--host", host, "--port", str(port), "--workers", "1"]
    base = base_url(host, port)
    announce("the MLflow server", host, port, f"(store {redact(uri)}) ")

    def show_url() -> None:
        try:
            # The same artifact location as asp.tracking.ensure_experiment gives an experiment of a SQLite store.
            exp_id = server_experiment_id(base, experiment, artifact_root if uri.startswith("sqlite:") else None)
        except (urllib.error.URLError, OSError, KeyError, ValueError) as exc:
            typer.echo(f"MLflow UI: {base}/#/experiments?{CLASSIC_VIEW}  ({experiment!r} lookup failed: {exc})")
        else:
            typer.echo(f"MLflow UI: {experiment_runs_url(base, exp_id)}  (experiment {experiment!r})")
        typer.echo("Ctrl-C stops the server.", err=True)

    env = dict(os.environ, **MLFLOW_SERVER_ENV)
    exit_like(*run_server(cmd, env, ready_url=f"{base}/health", on_ready=show_url))


@app.command("prefect")
def ui_prefect(port: PortOpt = 4200, host: HostOpt = "127.0.0.1", database_url: DatabaseOpt = None) -> None:
    """Start the Prefect server and UI (analytics off); `asp serve` in another shell makes the pipeline runnable.

    Its database is the embedded SQLite file, or with --database-url that PostgreSQL database (a team's server).
    """
    server_env = prefect_server_env(database_url)
    check_port_free(host, port, "the Prefect server")
    base = base_url(host, port)
    env = dict(os.environ, PREFECT_SERVER_ANALYTICS_ENABLED="false", PREFECT_API_URL=f"{base}/api", **server_env)
    cmd = [*PREFECT_SERVER_CMD, "--host", host, "--port", str(port), "--analytics-off"]
    store = f"(database {redact(database_url)}) " if database_url else ""
    announce("the Prefect server", host, port, store)

    def show_url() -> None:
        typer.echo(f"Prefect UI: {base}")
        typer.echo(f"in another shell: PREFECT_API_URL={env['PREFECT_API_URL']} asp serve; Ctrl-C stops it", err=True)

    exit_like(*run_server(cmd, env, ready_url=f"{base}/api/health", on_ready=show_url))
