"""A team's servers: `asp ui prefect|mlflow --database-url postgresql://...` keep their data in PostgreSQL, tested
against a real PostgreSQL server the test starts itself (initdb + pg_ctl from Debian's `postgresql` package, in a
temporary folder, on 127.0.0.1 at a free port, as the `postgres` user when run as root; skipped, saying so, when
the binaries are absent). The MLflow server then keeps artifacts itself (mlflow-artifacts:/), so clients anywhere
log through it. Bad URLs are a usage error (exit 2) before anything starts; passwords never reach a banner.

    .venv/bin/python -m pytest tests/test_team_server.py -q      (about 30 s; -m "not slow": the URL checks only)
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from asp.cli.ui import postgres_url, redact


def _main(*args: str) -> int:
    from asp.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(list(args))
    return exit_info.value.code


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_database_urls_are_checked_and_get_each_servers_driver() -> None:
    url = "postgresql://team:s3cret@db.example:5432/prefect"
    assert postgres_url(url, "prefect") == "postgresql+asyncpg://team:s3cret@db.example:5432/prefect"
    assert postgres_url("postgres://db.example/mlflow", "mlflow") == "postgresql+psycopg2://db.example/mlflow"
    assert redact(url) == "postgresql://team:***@db.example:5432/prefect"
    assert redact("postgresql://team@db.example/prefect") == "postgresql://team@db.example/prefect"


@pytest.mark.parametrize("ui", ["prefect", "mlflow"])
@pytest.mark.parametrize("url", ["sqlite:///x.db", "postgresql://team:s3cret@db.example:5432/", "mysql://h/db"])
def test_a_bad_database_url_exits_2_before_anything_starts(
    ui: str, url: str, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    assert _main("ui", ui, "--port", str(_free_port()), "--database-url", url) == 2
    err = capsys.readouterr().err
    assert "is not a PostgreSQL database URL: give postgresql://USER[:PASSWORD]@HOST[:PORT]/DATABASE" in err
    assert "s3cret" not in err and "Traceback" not in err


# ---- a real PostgreSQL server --------------------------------------------------------------------------------------


def _pg_bin() -> Path | None:
    """The folder of initdb and pg_ctl: on PATH, else Debian's /usr/lib/postgresql/<version>/bin (newest)."""
    found = shutil.which("initdb")
    if found and shutil.which("pg_ctl"):
        return Path(found).resolve().parent
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3]))
    return Path(versions[-1]).parent if versions else None


@pytest.fixture(scope="module")
def postgres() -> Iterator[str]:
    """A PostgreSQL server on 127.0.0.1 (trust auth for its superuser `asp`, fsync off) with the databases prefect
    and mlflow; yields its URL without a database. Stopped and removed at the end."""
    bindir = _pg_bin()
    if bindir is None:
        pytest.skip("no PostgreSQL server binaries (initdb, pg_ctl): apt-get install postgresql")
    as_user: list[str] = []
    data = Path(tempfile.mkdtemp(prefix="asp-pg-"))  # not under pytest's tmp: the server's user must reach it
    if os.geteuid() == 0:  # PostgreSQL refuses to run as root
        user = "postgres" if _has_user("postgres") else "nobody"
        shutil.chown(data, user)
        as_user = ["runuser", "-u", user, "--"]
    port = _free_port()
    pgdata = data / "data"
    try:
        run = lambda *cmd: subprocess.run([*as_user, *cmd], check=True, capture_output=True, text=True, timeout=120)  # noqa: E731
        run(str(bindir / "initdb"), "-D", str(pgdata), "-U", "asp", "--auth=trust", "-E", "UTF8", "--no-sync")
        options = f"-h 127.0.0.1 -p {port} -k {data} -c fsync=off -c synchronous_commit=off"
        run(str(bindir / "pg_ctl"), "-D", str(pgdata), "-o", options, "-l", str(data / "log"), "-w", "start")
        import psycopg2

        con = psycopg2.connect(host="127.0.0.1", port=port, user="asp", dbname="postgres")
        con.autocommit = True
        with con.cursor() as cur:
            cur.execute("CREATE DATABASE prefect")
            cur.execute("CREATE DATABASE mlflow")
        con.close()
        yield f"postgresql://asp@127.0.0.1:{port}"
    finally:
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            subprocess.run(
                [*as_user, str(bindir / "pg_ctl"), "-D", str(pgdata), "-m", "immediate", "stop"], timeout=60
            )
        shutil.rmtree(data, ignore_errors=True)


def _has_user(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


def _query(base: str, database: str, sql: str) -> list[tuple]:
    import psycopg2

    with contextlib.closing(psycopg2.connect(f"{base}/{database}")) as con, con.cursor() as cur:
        cur.execute(sql)
        return cur.fetchall()


@pytest.mark.slow
def test_prefect_and_mlflow_servers_keep_their_data_in_postgresql(postgres: str, tmp_path: Path, background) -> None:
    prefect_port, mlflow_port = _free_port(), _free_port()
    home = tmp_path / "prefect_home"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_TRACKING"))}
    env = dict(
        env, PREFECT_HOME=str(home), PREFECT_SERVER_ANALYTICS_ENABLED="false", PREFECT_SERVER_UI_ENABLED="false"
    )
    asp = [sys.executable, "-m", "asp", "ui"]
    prefect = background.start(
        [*asp, "prefect", "--port", str(prefect_port), "--database-url", f"{postgres}/prefect"],
        log=tmp_path / "prefect.log",
        env=env,
        cwd=tmp_path,
    )
    mlflow = background.start(
        [*asp, "mlflow", "--port", str(mlflow_port), "--database-url", f"{postgres}/mlflow"],
        log=tmp_path / "mlflow.log",
        env=env,
        cwd=tmp_path,
    )
    t0 = time.monotonic()
    prefect_api = f"http://127.0.0.1:{prefect_port}/api"
    background.wait_http(f"{prefect_api}/health", prefect, 180)
    background.wait_http(f"http://127.0.0.1:{mlflow_port}/health", mlflow, 180)
    print(f"both servers on PostgreSQL answered after {time.monotonic() - t0:.1f} s")
    assert f"(database {postgres}/prefect)" in background.log(prefect)

    from tests.conftest import prefect_api as call

    call({"PREFECT_API_URL": prefect_api}, "/flows/", {"name": "team-flow"})
    assert ("team-flow",) in _query(postgres, "prefect", "SELECT name FROM flow")
    assert not (home / "prefect.db").exists()  # no SQLite database beside it

    from mlflow import MlflowClient

    deadline = time.monotonic() + 30  # the UI creates the experiment once the server answers
    while "MLflow UI:" not in background.log(mlflow) and time.monotonic() < deadline:
        time.sleep(0.2)
    client = MlflowClient(f"http://127.0.0.1:{mlflow_port}")  # what a team's clients log through
    experiment = client.get_experiment_by_name("asp")
    assert experiment.artifact_location.startswith("mlflow-artifacts:")
    run = client.create_run(experiment.experiment_id, run_name="team-run")
    client.log_text(run.info.run_id, "k: 3", "schedule.txt")
    client.set_terminated(run.info.run_id)
    assert ("team-run",) in _query(postgres, "mlflow", "SELECT name FROM runs")
    assert [p.read_text() for p in (tmp_path / "mlartifacts").rglob("schedule.txt")] == ["k: 3"]
    for server in (prefect, mlflow):  # both at once (the fixture would stop them one after the other)
        os.killpg(server.pid, signal.SIGTERM)
    assert prefect.wait(60) == 143 and mlflow.wait(60) == 143
