"""The README's "three doors" timings, measured reproducibly on a copy of a project `make run` has built.

How long a run takes from the Prefect UI's Run button to a terminal state, and `asp repro` from the shell, with
everything up to date (and a forced rerun, a DVC experiment, a bad override).

Run:  .venv/bin/python benchmarks/doors_timing.py                       (the repository, idle machine, 1 repeat)
      .venv/bin/python benchmarks/doors_timing.py --repeats 3 --load 2  (medians of 3; 2 CPU-burning processes)
      .venv/bin/python benchmarks/doors_timing.py --project PATH --keep (another built project; keep the copy)

What it does, never touching the project's own workspace:

1. Copies the project (dvc.yaml, dvc.lock, params.yaml, stages/, src/, data/, configs/, metrics/, plots/,
   outputs/ without outputs/.work, .dvcignore, .gitignore, .dvc/config and the DVC cache without its run cache)
   into a temporary directory as a git + DVC repository with one commit, and checks that `dvc status` is clean
   there (exit 2 otherwise: run `make run` in the project first).
2. Starts `asp ui prefect` (its server, UI on) on a free 127.0.0.1 port with a throw-away PREFECT_HOME, and
   `asp serve` in the copy with the runner polling every `--poll-s` seconds (2 s, as tests/e2e/test_three_doors.py
   sets PREFECT_RUNNER_POLL_FREQUENCY), MLflow logging to a SQLite store in the temporary directory.
3. With `--load N`, starts N plain Python busy loops, then for each of `--repeats` rounds runs, in this order:
   the deployment's Quick run (no parameters: every stage, all up to date), `asp repro` of every stage from the
   shell, `schedule` only, `schedule` with force, `schedule` with {"schedule.k": 7} (a DVC experiment; the run
   cache is emptied first so every round computes it), and a bad override key (must fail). Flow runs are created
   through the deployment's API (`POST /deployments/{id}/create_flow_run`, what the UI's Run button does); the
   wall time is trigger -> terminal state (polled every 0.25 s), the flow run's own duration is Prefect's
   total_run_time. After each run `dvc status` is checked (and params.yaml compared).
4. Prints a markdown table (medians over the rounds; min-max when more than one) and the load average, then stops
   every process it started (also on Ctrl-C / SIGTERM) and removes the copy unless `--keep`.

Setup (copy, servers, deployment) takes about a minute on an idle 2-core machine and is not in the table.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
COPIED = (
    "dvc.yaml",
    "dvc.lock",
    "params.yaml",
    "stages",
    "src",
    "data",
    "configs",
    "metrics",
    "plots",
    "outputs",
    ".dvcignore",
    ".gitignore",
)
TERMINAL = ("COMPLETED", "FAILED", "CRASHED", "CANCELLED")
DEPLOYMENT = "asp-pipeline/asp-pipeline"


@dataclass(frozen=True)
class Door:
    """One row of the table: a flow run of the deployment with `parameters`, or `asp repro` when `shell`."""

    label: str
    parameters: dict[str, Any] = field(default_factory=dict)
    shell: bool = False
    expect: str = "COMPLETED"
    fresh_run_cache: bool = False  # empty .dvc/cache/runs first, so DVC computes the experiment every round


DOORS = (
    Door("Quick run: every stage, everything up to date"),
    Door("`asp repro` of every stage, everything up to date (shell)", shell=True),
    Door("`schedule` only, up to date", {"stages": ["schedule"]}),
    Door("`schedule` only, `force` (reruns it in the workspace)", {"stages": ["schedule"], "force": True}),
    Door(
        "`schedule` with `schedule.k=7` (a DVC experiment)",
        {"stages": ["schedule"], "overrides": "schedule.k=7"},
        fresh_run_cache=True,
    ),
    Door(
        "a bad override key `schedule.kk=3`",
        {"stages": ["schedule"], "overrides": "schedule.kk=3"},
        expect="FAILED",
    ),
)


@dataclass
class Result:
    wall_s: float
    flow_s: float | None
    tasks: str
    status: str
    load1: float


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--project", type=Path, default=ROOT, help="a project `make run` has built (default: this repo)"
    )
    parser.add_argument("--load", type=int, default=0, metavar="N", help="CPU-burning processes during the runs")
    parser.add_argument("--repeats", type=int, default=1, metavar="K", help="rounds; the table shows medians")
    parser.add_argument("--poll-s", type=float, default=2.0, help="runner poll interval (the tests use 2 s)")
    parser.add_argument("--timeout-s", type=float, default=1800.0, help="give up on one run after this long")
    parser.add_argument("--keep", action="store_true", help="keep the temporary copy (its path is printed)")
    args = parser.parse_args(argv)
    if args.load < 0:
        parser.error(f"--load {args.load}: give 0 or more processes")
    if args.repeats < 1:
        parser.error(f"--repeats {args.repeats}: give 1 or more")
    if args.poll_s <= 0 or args.timeout_s <= 0:
        parser.error("--poll-s and --timeout-s must be positive")
    missing = [
        name for name in ("dvc.yaml", "dvc.lock", "params.yaml", "outputs") if not (args.project / name).exists()
    ]
    if missing:
        parser.error(f"--project {args.project}: no {', '.join(missing)} there; run `make run` in it first")
    return args


def summarize(values: Sequence[float | None], digits: int = 1) -> str:
    """The median of `values` (min-max after it when they are several); '–' when there are none."""
    got = [v for v in values if v is not None]
    if not got:
        return "–"
    med = f"{statistics.median(got):.{digits}f}"
    return med if len(got) == 1 else f"{med} ({min(got):.{digits}f}-{max(got):.{digits}f})"


def task_summary(states: Sequence[str]) -> str:
    """`['Skipped', 'Skipped']` -> '2 × Skipped'; one state -> its name; none -> '–'."""
    if not states:
        return "–"
    counts = Counter(states)
    return ", ".join(name if n == 1 else f"{n} × {name}" for name, n in sorted(counts.items()))


def table(rows: Sequence[tuple[Door, list[Result]]]) -> str:
    lines = [
        "| run | wall s (trigger → terminal) | flow-run s | task states | `dvc status` after |",
        "|---|---|---|---|---|",
    ]
    for door, results in rows:
        tasks = " / ".join(dict.fromkeys(r.tasks for r in results))
        status = " / ".join(dict.fromkeys(r.status for r in results))
        flow = summarize([r.flow_s for r in results], 2 if door.expect == "FAILED" else 1)
        lines.append(f"| {door.label} | {summarize([r.wall_s for r in results])} | {flow} | {tasks} | {status} |")
    return "\n".join(lines)


# --- processes -------------------------------------------------------------------------------------------------


class Procs:
    """Processes started in their own session; `stop_all` ends each one's whole tree (children included)."""

    def __init__(self) -> None:
        self.procs: list[tuple[subprocess.Popen, Path | None, int]] = []

    def start(
        self,
        cmd: list[str],
        env: dict[str, str],
        cwd: Path | None = None,
        log: Path | None = None,
        sig: int = signal.SIGTERM,
    ) -> subprocess.Popen:
        out = log.open("w") if log else subprocess.DEVNULL
        try:
            proc = subprocess.Popen(
                cmd, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        finally:
            if log:
                out.close()  # type: ignore[union-attr]
        self.procs.append((proc, log, sig))
        return proc

    def log(self, proc: subprocess.Popen) -> str:
        log = next(log for p, log, _ in self.procs if p is proc)
        return log.read_text(errors="replace")[-4000:] if log else ""

    def stop(self, proc: subprocess.Popen, timeout_s: float = 60.0) -> None:
        """Send the process its stop signal, SIGKILL its group after `timeout_s`; then SIGKILL any descendant left
        (`asp ui prefect` and `asp serve` run their server in a process group of its own)."""
        sig = next(s for p, _, s in self.procs if p is proc)
        try:
            import psutil

            tree = psutil.Process(proc.pid).children(recursive=True) if proc.poll() is None else []
        except Exception:  # psutil missing or the process gone
            tree = []
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
        for child in tree:
            with contextlib.suppress(Exception):
                child.kill()

    def stop_all(self) -> None:
        for proc, _, _ in reversed(self.procs):
            self.stop(proc)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def api(base: str, path: str, body: Any = None) -> Any:
    """GET (no `body`) or POST `path` of the Prefect API at `base`; a 503 (SQLite busy) is retried."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, headers={"content-type": "application/json"})
    for attempt in range(6):
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                return json.load(resp)
        except urllib.error.HTTPError as err:
            if err.code != 503 or attempt == 5:
                raise
            time.sleep(0.5 * 2**attempt)
    raise AssertionError("unreachable")


def wait_until(what: str, check: Callable[[], Any], proc: subprocess.Popen, procs: Procs, timeout_s: float) -> Any:
    """Call `check` until it returns something truthy (returned); exit with `proc`'s log if it ends first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"error: {proc.args} exited with {proc.returncode} before {what}:\n{procs.log(proc)}")
        with contextlib.suppress(urllib.error.URLError, OSError, ValueError):
            if got := check():
                return got
        time.sleep(0.5)
    sys.exit(f"error: no {what} within {timeout_s:g} s; log of {proc.args}:\n{procs.log(proc)}")


# --- the project copy --------------------------------------------------------------------------------------------


def run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: float = 600) -> str:
    out = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    if out.returncode:
        sys.exit(
            f"error: {' '.join(cmd)} failed ({out.returncode}) in {cwd}:\n{out.stdout[-3000:]}{out.stderr[-3000:]}"
        )
    return out.stdout + out.stderr


def dvc_changed(repo: Path, env: dict[str, str]) -> dict[str, Any]:
    """`dvc status --json` of `repo`: {} when everything is up to date."""
    out = subprocess.run(
        [sys.executable, "-m", "dvc", "status", "--json"], cwd=repo, env=env, capture_output=True, text=True
    )
    if out.returncode:
        return {"<dvc status failed>": out.stderr[-500:]}
    return json.loads(out.stdout or "{}")


def copy_project(project: Path, repo: Path, env: dict[str, str]) -> None:
    """A git + DVC repository at `repo` with `project`'s pipeline, params, outputs and DVC cache (not its run
    cache), one commit; exit 2 unless `dvc status` is clean there."""
    repo.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", ".work")
    for item in COPIED:
        src = project / item
        if src.is_dir():
            shutil.copytree(src, repo / item, ignore=ignore, symlinks=True)
        elif src.exists():
            shutil.copy2(src, repo / item)
    for cmd in (
        ["git", "init", "-q"],
        ["git", "config", "user.email", "bench@example.com"],
        ["git", "config", "user.name", "doors_timing"],
        [sys.executable, "-m", "dvc", "init", "-q"],
    ):
        run(cmd, repo, env)
    if (project / ".dvc" / "config").is_file():
        shutil.copy2(project / ".dvc" / "config", repo / ".dvc" / "config")
    cache = project / ".dvc" / "cache"
    if cache.is_dir():
        shutil.copytree(cache, repo / ".dvc" / "cache", ignore=shutil.ignore_patterns("runs"), dirs_exist_ok=True)
    run(["git", "add", "-A"], repo, env)
    run(["git", "commit", "-qm", "built project (benchmarks/doors_timing.py)"], repo, env)
    changed = dvc_changed(repo, env)  # also fills DVC's hash cache, so the first measured run does not pay for it
    if changed:
        print(
            f"error: `dvc status` in the copy of {project} is not clean: {json.dumps(changed)[:1500]}\n"
            "Run `make run` (or `asp repro`) in the project first, and keep its stage dependencies unchanged.",
            file=sys.stderr,
        )
        sys.exit(2)


# --- measuring -----------------------------------------------------------------------------------------------------


def status_text(repo: Path, env: dict[str, str], params_sha: str) -> str:
    changed = dvc_changed(repo, env)
    text = "up to date" if not changed else "changed: " + ", ".join(sorted(k.split(":")[-1] for k in changed))
    same = hashlib.sha256((repo / "params.yaml").read_bytes()).hexdigest() == params_sha
    return text + ("" if same else ", params.yaml CHANGED")


def trigger(base: str, deployment_id: str, door: Door, timeout_s: float) -> tuple[float, dict[str, Any]]:
    """Create a flow run as the UI's Run button does; (wall seconds to a terminal state, the flow run)."""
    t0 = time.monotonic()
    flow_run = api(base, f"/deployments/{deployment_id}/create_flow_run", {"parameters": door.parameters})
    while time.monotonic() - t0 < timeout_s:
        flow_run = api(base, f"/flow_runs/{flow_run['id']}")
        if flow_run["state_type"] in TERMINAL:
            return time.monotonic() - t0, flow_run
        time.sleep(0.25)
    sys.exit(f"error: flow run {flow_run['id']} ({door.label}) still {flow_run['state_type']} after {timeout_s:g} s")


def measure(door: Door, ctx: dict[str, Any], procs: Procs) -> Result:
    repo: Path = ctx["repo"]
    if door.fresh_run_cache:
        shutil.rmtree(repo / ".dvc" / "cache" / "runs", ignore_errors=True)
    if door.shell:
        t0 = time.monotonic()
        log = ctx["tmp"] / "asp_repro.log"
        proc = procs.start([sys.executable, "-m", "asp", "repro"], ctx["env"], cwd=repo, log=log, sig=signal.SIGINT)
        try:
            rc = proc.wait(ctx["timeout_s"])
        except subprocess.TimeoutExpired:
            sys.exit(f"error: asp repro still running after {ctx['timeout_s']:g} s")
        wall = time.monotonic() - t0
        text = log.read_text(errors="replace")
        if rc:
            sys.exit(f"error: asp repro failed ({rc}):\n{text[-3000:]}")
        states = re.findall(r"^\[asp\] \S+ +(ran|skipped|failed) ", text, flags=re.M)
        flow_s, tasks = None, task_summary(states) + " (asp's summary)"
    else:
        wall, flow_run = trigger(ctx["base"], ctx["deployment_id"], door, ctx["timeout_s"])
        if flow_run["state_type"] != door.expect:
            ended = f"flow run ended {flow_run['state_name']}, expected {door.expect}"
            sys.exit(f"error: {door.label}: {ended}:\n{flow_run['state']}")
        flow_s = float(flow_run["total_run_time"])
        found = api(ctx["base"], "/task_runs/filter", {"flow_runs": {"id": {"any_": [flow_run["id"]]}}})
        tasks = task_summary([t["state"]["name"] for t in found])
        if door.expect == "FAILED":
            tasks += f" (flow run {flow_run['state_name']}: {(flow_run['state'].get('message') or '')[:60]}…)"
    status = status_text(repo, ctx["env"], ctx["params_sha"])
    return Result(wall, flow_s, tasks, status, os.getloadavg()[0])


def _interrupt(signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    project = args.project.resolve()
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)  # also when started in the background (where SIGINT is ignored)
    procs = Procs()
    tmp = Path(tempfile.mkdtemp(prefix="doors_timing_"))
    load_before = os.getloadavg()
    rc = 0
    try:
        env = {k: v for k, v in os.environ.items() if k not in ("ASP_PARENT_RUN_ID", "PREFECT_API_URL")}
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
        env.update(
            DVC_NO_ANALYTICS="1",
            MLFLOW_TRACKING_URI=f"sqlite:///{tmp / 'mlflow' / 'mlflow.db'}",
            PREFECT_HOME=str(tmp / "prefect"),
            PREFECT_SERVER_ANALYTICS_ENABLED="false",
        )
        (tmp / "mlflow").mkdir()
        repo = tmp / "repo"
        t_setup = time.monotonic()
        print(f"copying {project} to {repo} ...", file=sys.stderr, flush=True)
        copy_project(project, repo, env)
        commit = (
            run(["git", "rev-parse", "--short", "HEAD"], project, env).strip() if (project / ".git").exists() else "?"
        )

        port = free_port()
        base = f"http://127.0.0.1:{port}/api"
        env["PREFECT_API_URL"] = base
        print(f"starting `asp ui prefect --port {port}` and `asp serve` ...", file=sys.stderr, flush=True)
        server = procs.start(
            [sys.executable, "-m", "asp", "ui", "prefect", "--port", str(port)], env, cwd=tmp, log=tmp / "prefect.log"
        )
        wait_until("the Prefect server's /api/health", lambda: api(base, "/health"), server, procs, 180)
        serve_env = dict(env, PREFECT_RUNNER_POLL_FREQUENCY=f"{args.poll_s:g}")
        serve = procs.start(
            [sys.executable, "-m", "asp", "serve"], serve_env, cwd=repo, log=tmp / "serve.log", sig=signal.SIGINT
        )
        deployment = wait_until(
            "the deployment", lambda: api(base, f"/deployments/name/{DEPLOYMENT}"), serve, procs, 180
        )
        # `asp serve` prints the deployment's URL just before its runner starts polling
        wait_until(
            "the runner", lambda: f"/deployments/deployment/{deployment['id']}" in procs.log(serve), serve, procs, 120
        )
        setup_s = time.monotonic() - t_setup
        burners = [
            procs.start([sys.executable, "-c", "while True: pass"], env, sig=signal.SIGKILL) for _ in range(args.load)
        ]
        time.sleep(5.0)  # let the runner's start settle (and the burners get going)
        ctx = {
            "repo": repo,
            "tmp": tmp,
            "env": env,
            "base": base,
            "deployment_id": deployment["id"],
            "timeout_s": args.timeout_s,
            "params_sha": hashlib.sha256((repo / "params.yaml").read_bytes()).hexdigest(),
        }
        load_start = os.getloadavg()
        results: list[list[Result]] = [[] for _ in DOORS]
        for round_ in range(args.repeats):
            for door, done in zip(DOORS, results, strict=True):
                print(f"round {round_ + 1}/{args.repeats}: {door.label} ...", file=sys.stderr, flush=True)
                result = measure(door, ctx, procs)
                print(f"  {result.wall_s:.1f} s wall, {result.status}", file=sys.stderr, flush=True)
                done.append(result)
        load_end = os.getloadavg()
        for proc in burners:
            procs.stop(proc)
        samples = [r.load1 for rs in results for r in rs]
        print(
            f"\n{len(DOORS)} runs x {args.repeats} round(s) on a copy of {project} "
            f"(its working tree at commit {commit}); "
            f"`asp ui prefect` + `asp serve` (runner polling every {args.poll_s:g} s); "
            f"{args.load} CPU-burning process(es); {os.cpu_count()} CPUs; setup {setup_s:.0f} s (not in the table)\n"
        )
        print(table(list(zip(DOORS, results, strict=True))))
        print(
            "\nload average (1, 5, 15 min): before setup "
            + ", ".join(f"{x:.2f}" for x in load_before)
            + "; when the runs began "
            + ", ".join(f"{x:.2f}" for x in load_start)
            + "; after the last "
            + ", ".join(f"{x:.2f}" for x in load_end)
            + f"; 1-min load after each run: mean {statistics.mean(samples):.2f}, max {max(samples):.2f}"
        )
    except KeyboardInterrupt:
        print("\ninterrupted: stopping what was started", file=sys.stderr)
        rc = 130
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the cleanup short
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        procs.stop_all()
        if args.keep:
            print(f"kept {tmp} (logs: prefect.log, serve.log, asp_repro.log)", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
