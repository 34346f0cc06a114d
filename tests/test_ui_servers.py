"""`asp ui mlflow|prefect`: a taken port is a user error (exit 2, one message naming the port and what to do);
the MLflow UI answers on a free port, prints the classic-view URL of the project's experiment, stays under
1 GiB RSS (whole process tree, no job runners), and SIGTERM / SIGINT to the `asp` wrapper alone stop the
whole tree (exit 143 / 130).

    .venv/bin/python -m pytest tests/test_ui_servers.py          # all, about 40 s on 2 busy cores
    .venv/bin/python -m pytest tests/test_ui_servers.py -m "not slow"
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import sys
import time
import urllib.request
from pathlib import Path

import psutil
import pytest

from asp.cli.ui import base_url, experiment_runs_url

ROOT = Path(__file__).resolve().parents[1]
GiB = 1 << 30


def _main(*args: str) -> int:
    from asp.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(list(args))
    return exit_info.value.code


@pytest.mark.parametrize("ui", ["mlflow", "prefect"])
def test_taken_port_exits_2_naming_the_port(
    ui: str, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert _main("ui", ui, "--port", str(port)) == 2
    err = capsys.readouterr().err
    assert f"error: cannot start the {'MLflow UI' if ui == 'mlflow' else 'Prefect server'}: port {port}" in err
    assert "--port N" in err and "Traceback" not in err
    assert sum(line.startswith("error") for line in err.splitlines()) == 1, err


@pytest.mark.parametrize("ui", ["mlflow", "prefect"])
@pytest.mark.parametrize("port", ["70000", "-5", "0"])
def test_ports_outside_1_65535_exit_2_up_front(
    ui: str, port: str, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)
    t0 = time.monotonic()
    assert _main("ui", ui, "--port", port) == 2
    err = capsys.readouterr().err
    bound = "less than or equal to 65535" if port == "70000" else "greater than or equal to 1"
    assert f"Error: Invalid value for '--port': Input should be {bound}" in err and "Traceback" not in err
    assert "host" not in err and time.monotonic() - t0 < 30  # no server was started (it used to wait 60 s)


def test_port_check_refuses_non_ports() -> None:
    from asp.cli.procs import check_port_free
    from asp.errors import UserError

    for port in (0, 70000, -5):
        with pytest.raises(UserError, match=rf"port {port} is not a TCP port; give --port a number from 1 to 65535"):
            check_port_free("127.0.0.1", port, "the MLflow UI")


def test_loopback_or_not() -> None:
    from asp.cli.ui import is_loopback

    assert all(is_loopback(h) for h in ("127.0.0.1", "127.0.1.1", "::1", "[::1]", "localhost"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "::", "", "10.1.2.3", "no-such-host.invalid"))


def test_mlflow_ui_on_every_interface_says_so_and_warns(tmp_path: Path, background) -> None:
    """The banner names what is bound and warns that there is no authentication (printed before the server
    starts; the wrapper is stopped right after)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path / 'mlflow.db'}")
    log = tmp_path / "ui.log"
    cmd = [sys.executable, "-m", "asp", "ui", "mlflow", "--host", "0.0.0.0", "--port", str(port)]
    wrapper = background.start(cmd, log=log, env=env, cwd=tmp_path)
    deadline = time.monotonic() + 60
    while "warning:" not in log.read_text() and time.monotonic() < deadline and wrapper.poll() is None:
        time.sleep(0.2)
    os.kill(wrapper.pid, signal.SIGTERM)
    wrapper.wait(60)
    lines = log.read_text().splitlines()
    assert lines[0].startswith(
        f"starting the MLflow server bound to every network interface (0.0.0.0) port {port}; on this machine "
        f"open http://127.0.0.1:{port}"
    ), lines
    assert lines[1].startswith(f"warning: the MLflow server has no authentication: anyone who can reach port {port}")
    assert "keep --host 127.0.0.1" in lines[1]


def test_mlflow_ui_refuses_a_damaged_store(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    damaged = tmp_path / "mlflow.db"
    damaged.write_bytes(os.urandom(8192))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{damaged}")
    monkeypatch.chdir(tmp_path)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert _main("ui", "mlflow", "--port", str(port)) == 2  # a free port: the store is what is refused
    err = capsys.readouterr().err
    assert err.startswith(
        f"error: the MLflow store sqlite:///{damaged}: {damaged} is damaged (file is not a database)"
    )


def test_urls() -> None:
    assert base_url("0.0.0.0", 5000) == "http://127.0.0.1:5000"
    assert base_url("::1", 5000) == "http://[::1]:5000"
    url = experiment_runs_url("http://127.0.0.1:5000", "7")
    assert url == "http://127.0.0.1:5000/#/experiments/7/runs?workflowType=machine_learning"


def _tree_rss(proc: psutil.Process) -> tuple[int, list[psutil.Process]]:
    tree = [proc, *proc.children(recursive=True)]
    return sum(p.memory_info().rss for p in tree), tree


def _get(url: str, body: dict | None = None) -> bytes:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as resp:
        return resp.read()


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One SQLite store for both server tests: the first creates it (and the experiment), the second finds them."""
    return f"sqlite:///{tmp_path_factory.mktemp('ui_store') / 'mlflow.db'}"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("sig", "code"),
    [(signal.SIGTERM, 143), pytest.param(signal.SIGINT, 130, marks=pytest.mark.extended)],
    ids=["SIGTERM", "SIGINT"],
)
def test_mlflow_ui_answers_fits_in_1_gib_and_stops_with_its_tree(
    sig: int, code: int, store: str, tmp_path: Path, background
) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, MLFLOW_TRACKING_URI=store)
    log = tmp_path / "ui.log"
    wrapper = background.start(
        [sys.executable, "-m", "asp", "ui", "mlflow", "--port", str(port)], log=log, env=env, cwd=tmp_path
    )
    base = f"http://127.0.0.1:{port}"
    background.wait_http(f"{base}/health", wrapper, 120)
    deadline = time.monotonic() + 30
    while "MLflow UI:" not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.2)
    url = rf"MLflow UI: {re.escape(base)}/#/experiments/(\d+)/runs\?workflowType=machine_learning "
    match = re.search(url, log.read_text())
    assert match, log.read_text()
    experiment = json.loads(_get(f"{base}/api/2.0/mlflow/experiments/get-by-name?experiment_name=asp"))["experiment"]
    assert experiment["experiment_id"] == match[1]  # no params.yaml in tmp_path: the default experiment, created

    top = psutil.Process(wrapper.pid)
    rss, tree = _tree_rss(top)
    assert rss <= GiB, [(p.cmdline()[:4], p.memory_info().rss) for p in tree]
    assert not any("huey" in " ".join(p.cmdline()) for p in tree)  # job execution off
    _get(f"{base}/")
    _get(f"{base}/ajax-api/2.0/mlflow/experiments/search?max_results=100")
    _get(f"{base}/ajax-api/2.0/mlflow/runs/search", {"experiment_ids": [match[1]], "max_results": 100})
    rss, tree = _tree_rss(top)
    assert rss <= GiB, [(p.cmdline()[:4], p.memory_info().rss) for p in tree]

    os.kill(wrapper.pid, sig)  # the wrapper alone: it must stop the server's own process group
    assert wrapper.wait(60) == code, background.log(wrapper)
    alive = [p for p in tree[1:] if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not alive, [p.cmdline()[:4] for p in alive]
    assert ("terminated" if code == 143 else "interrupted") in log.read_text()
