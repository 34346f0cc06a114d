"""The local Ray cluster `ray_session` starts (no `runtime.ray.address`) listens on loopback only.

A separate Python process starts the cluster exactly as `run_async` does (`asp.runtime.ray_session`), so it does
not clash with the session's shared cluster, runs an actor and a task (so worker processes exist), and reports
every listening TCP socket and bound UDP socket of itself and of each process it started (GCS server, raylet,
workers, runtime-env and dashboard agents, the autoscaler monitor, the log monitor) with psutil.
"""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys

import pytest

PROBE = r"""
import json, os, socket, time
import psutil, ray
from asp.runtime import RuntimeConfig, ray_session

with ray_session(RuntimeConfig(ray={"num_cpus": 1, "num_gpus": 0})) as started:
    @ray.remote(num_cpus=0)
    class Echo:
        def pid(self):
            return os.getpid()

    @ray.remote(num_cpus=0)
    def pid():
        return os.getpid()

    actor = Echo.remote()
    workers = {ray.get(actor.pid.remote()), ray.get(pid.remote())}
    time.sleep(2.0)  # let the agents and monitors finish starting their servers
    me = psutil.Process()
    rows = []
    for proc in [me, *me.children(recursive=True)]:
        try:
            name = " ".join(os.path.basename(part) for part in proc.cmdline()[:2]) or proc.name()
            conns = proc.net_connections(kind="inet")
        except psutil.Error:
            continue  # gone meanwhile
        tcp_listen = [c for c in conns if c.status == psutil.CONN_LISTEN]
        udp_bound = [c for c in conns if c.type == socket.SOCK_DGRAM and c.laddr and not c.raddr]
        listening = [f"{c.laddr.ip}|{c.laddr.port}" for c in tcp_listen + udp_bound]
        rows.append({"pid": proc.pid, "name": name, "listening": listening, "worker": proc.pid in workers})
    print("PROBE " + json.dumps({"started": started, "node_ip": ray.util.get_node_ip_address(), "procs": rows}))
"""


def is_loopback(ip: str) -> bool:
    addr = ipaddress.ip_address(ip.split("%")[0])
    mapped = getattr(addr, "ipv4_mapped", None)  # Ray's gRPC servers use IPv6 sockets: ::ffff:127.0.0.1
    return addr.is_loopback or (mapped is not None and mapped.is_loopback)


def test_local_cluster_listens_on_loopback_only(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_ADDRESS")}
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    proc = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("PROBE ")]
    if proc.returncode or not lines:
        pytest.fail(f"probe exited with {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    report = json.loads(lines[-1].removeprefix("PROBE "))
    assert report["started"] and report["node_ip"] == "127.0.0.1"
    sockets = [(p["name"], s.rsplit("|", 1)[0]) for p in report["procs"] for s in p["listening"]]
    exposed = [(name, ip) for name, ip in sockets if not is_loopback(ip)]
    assert exposed == [], f"Ray processes listening beyond loopback: {exposed}"
    # not vacuous: the servers were there and were seen
    names = {p["name"].split()[0] for p in report["procs"] if p["listening"]}
    assert {"gcs_server", "raylet"} <= names, report["procs"]
    assert sum(bool(p["listening"]) for p in report["procs"] if p["worker"]) == 2, report["procs"]
