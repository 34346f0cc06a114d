"""Ray processes a SIGKILLed owner left running are found from its record and stopped the next time a local cluster
starts (`asp.runtime.raysession`); a live owner's cluster is never touched.

The killed owner is real: a process that starts a local cluster through `ray_session` (as `run_async` does) and then
SIGKILLs itself; Ray's agent processes outlive it (a minute here) and are what the reaper must stop.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import psutil
import pytest

from asp.runtime import raysession

# The owner records its cluster in the test's own registry (argv[1]): another process that starts Ray meanwhile (a
# second pytest-xdist worker, a launch stage) reaps the records of dead owners it finds, and must not get there first.
OWNER = """
import os, signal, sys
from pathlib import Path
from asp.runtime import raysession
raysession.registry = lambda: Path(sys.argv[1])
from asp.runtime.config import RuntimeConfig
from asp.runtime.run import ray_session

with ray_session(RuntimeConfig(ray={"num_cpus": 1})):
    print("started", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.slow
def test_ray_left_by_a_sigkilled_owner_is_stopped_and_named(
    tmp_path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.setattr(raysession, "registry", lambda: tmp_path / "registry")
    cmd = [sys.executable, "-c", OWNER, str(tmp_path / "registry")]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == -9 and "started" in out, err[-3000:]
    path = raysession.registry() / f"{proc.pid}.json"
    record = json.loads(path.read_text())
    assert record["session_dir"] and str(proc.pid) in record["session_dir"]
    left = raysession.leftovers(record)  # GCS server and raylet may still be on their way out; the agents stay
    agents = {f"{p.name()} (pid {p.pid})" for p in left if p.name().startswith("ray::") and "Agent" in p.name()}
    assert agents, f"no Ray agent outlived its owner: nothing to clean up ({left})"

    stopped = raysession.reap_dead_sessions()
    assert agents <= set(stopped)
    deadline = time.monotonic() + 10
    while any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in left) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in left)
    assert not path.exists()
    said = capsys.readouterr().err
    assert f"of the local Ray cluster of process {proc.pid}, which was killed without shutting it down" in said


def test_a_live_owners_cluster_is_left_alone(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(raysession, "registry", lambda: tmp_path)
    me = psutil.Process()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        name = psutil.Process(child.pid).name()
        entry = {"pid": child.pid, "start": psutil.Process(child.pid).create_time(), "name": name}
        record = {"pid": me.pid, "start": me.create_time(), "session_dir": None, "processes": [entry]}
        (tmp_path / f"{me.pid}.json").write_text(json.dumps(record))
        assert raysession.reap_dead_sessions() == [] and child.poll() is None  # the owner (this process) is alive
        dead = {**record, "pid": 999_999_999}
        (tmp_path / f"{me.pid}.json").unlink()
        (tmp_path / "999999999.json").write_text(json.dumps(dead))
        assert raysession.reap_dead_sessions() == [f"{name} (pid {child.pid})"]
        assert child.wait(10) is not None and not list(tmp_path.iterdir())
        (tmp_path / "1.json").write_text("{cut")  # unreadable: dropped, nothing stopped
        assert raysession.reap_dead_sessions() == [] and not list(tmp_path.iterdir())
    finally:
        child.kill()
        child.wait()
