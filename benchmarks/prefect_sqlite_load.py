"""How often Prefect's embedded SQLite server answers the UI's *Run* (`create_flow_run`) with 503, on this machine.

Run:  .venv/bin/python benchmarks/prefect_sqlite_load.py                    (`asp ui prefect`'s server, 60 s)
      .venv/bin/python benchmarks/prefect_sqlite_load.py --prefect-defaults  (plain `prefect server start`)
      .venv/bin/python benchmarks/prefect_sqlite_load.py --database-url postgresql://USER@127.0.0.1:PORT/DB

Starts a Prefect server (as `asp ui prefect` does, or plain `prefect server start`) on a free 127.0.0.1 port with a
throw-away PREFECT_HOME, registers one deployment, and then, for `--seconds`, does what a served deployment and
a running flow do to the database (a runner polling for work every `--poll-s` seconds, a flow run sending log
batches every 2 s) while a "user" posts `create_flow_run` every `--click-s` seconds without retrying, as Prefect's
UI does. Prints how many of those answers were 503 (the server's SQLite busy) and the CPU load meanwhile. The
503s come from SQLite refusing to turn a read transaction into a write one while another connection writes (no
busy timeout applies there), so they grow with the machine's load and with the number of writers.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from pathlib import Path
from typing import Any


def _post(api: str, path: str, body: Any) -> tuple[int, Any]:
    req = urllib.request.Request(
        api + path, data=json.dumps(body).encode(), headers={"content-type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as err:
        return err.code, None


def _wait(api: str, proc: subprocess.Popen, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the Prefect server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"{api}/health", timeout=5):
                return
        except (urllib.error.URLError, OSError):
            time.sleep(0.5)
    raise SystemExit("the Prefect server did not answer")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prefect-defaults", action="store_true", help="plain `prefect server start`")
    parser.add_argument("--database-url", default=None, help="a PostgreSQL URL instead of the embedded SQLite")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--poll-s", type=float, default=2.0, help="runner poll interval (the tests use 2 s)")
    parser.add_argument("--click-s", type=float, default=0.5)
    args = parser.parse_args()

    from asp.cli.ui import PREFECT_SERVER_CMD, prefect_server_env

    home = Path(tempfile.mkdtemp(prefix="prefect_load_"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    api = f"http://127.0.0.1:{port}/api"
    env = dict(os.environ, PREFECT_HOME=str(home), PREFECT_API_URL=api, PREFECT_SERVER_ANALYTICS_ENABLED="false")
    env["PREFECT_API_LOG_RETRYABLE_ERRORS"] = "true"  # the server logs each busy refusal: counted below
    env.update(prefect_server_env(args.database_url))
    start = [sys.executable, "-m", "prefect", "server", "start"] if args.prefect_defaults else PREFECT_SERVER_CMD
    cmd = [*start, "--host", "127.0.0.1", "--port", str(port)]
    log = (home / "server.log").open("w")
    server = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    stop = threading.Event()
    try:
        _wait(api, server)
        _, flow = _post(api, "/flows/", {"name": f"load-{uuid.uuid4().hex[:6]}"})
        _, dep = _post(api, "/deployments/", {"name": "load", "flow_id": flow["id"]})
        _, run = _post(api, f"/deployments/{dep['id']}/create_flow_run", {})

        def poll() -> None:  # what `asp serve` (a Prefect runner) does between flow runs
            while not stop.wait(args.poll_s):
                _post(api, "/deployments/get_scheduled_flow_runs", {"deployment_ids": [dep["id"]]})

        def logs() -> None:  # what a running flow does: log batches every 2 s (PREFECT_LOGGING_TO_API_*)
            while not stop.wait(2.0):
                now = time.time()
                batch = [
                    {"name": "asp", "level": 20, "message": f"line {i}", "timestamp": now, "flow_run_id": run["id"]}
                    for i in range(20)
                ]
                _post(api, "/logs/", batch)

        threads = [threading.Thread(target=f, daemon=True) for f in (poll, logs)]
        for t in threads:
            t.start()
        codes: Counter[int] = Counter()
        load0 = os.getloadavg()[0]
        t0 = time.monotonic()
        while time.monotonic() - t0 < args.seconds:
            code, _ = _post(api, f"/deployments/{dep['id']}/create_flow_run", {})
            codes[code] += 1
            time.sleep(args.click_s)
        stop.set()
        what = (
            "PostgreSQL"
            if args.database_url
            else "SQLite, " + ("plain prefect server start" if args.prefect_defaults else "asp ui prefect's server")
        )
        total = sum(codes.values())
        log.flush()
        busy = (home / "server.log").read_text().count("Encountered retryable exception")
        print(
            f"{what}: {codes.get(503, 0)} of {total} create_flow_run answered 503 "
            f"({100 * codes.get(503, 0) / max(total, 1):.1f} %), codes {dict(codes)}; "
            f"the server refused {busy} requests as busy (all endpoints, before any retry); "
            f"runner poll {args.poll_s:g} s, "
            f"load average {load0:.1f} -> {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
        )
    finally:
        stop.set()
        os.killpg(server.pid, signal.SIGTERM)  # the server and its children (its own session)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)


if __name__ == "__main__":
    main()
