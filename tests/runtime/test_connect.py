"""A wrong or closed ``runtime.ray.address`` ends within ``runtime.ray.connect_timeout_s`` with one message naming it
(`asp.runtime.connect`), instead of Ray's endless "Failed to connect to GCS" loop.

The driver runs in its own process (this one may hold the session's Ray already, and then `ray_session` joins
nothing); the closed address is a port bound here and never listened on.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest

from asp.errors import UserError
from asp.runtime.connect import check_reachable, split_address

DRIVER = """
import sys
from asp.errors import UserError
from asp.runtime.config import RuntimeConfig
from asp.runtime.profile_actors import actor_pool
from asp.runtime.run import ray_session

config = RuntimeConfig(ray={"address": sys.argv[1], "connect_timeout_s": float(sys.argv[2])})
try:
    if sys.argv[3] == "launch":  # run_async joins through ray_session
        with ray_session(config):
            print("joined", flush=True)
    else:  # profile / predict on actors join through actor_pool
        with actor_pool(config, object, lambda unit, actor: (), what=sys.argv[3], knob=f"{sys.argv[3]}.actors"):
            print("joined", flush=True)
except UserError as exc:
    print(exc, file=sys.stderr)
    sys.exit(exc.exit_code)
"""


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, never listened to, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize("stage", ["launch", "profile", "predict"])
def test_closed_address_stops_within_the_timeout_naming_the_param(stage: str) -> None:
    address = f"127.0.0.1:{_closed_port()}"
    started = time.monotonic()
    cmd = [sys.executable, "-c", DRIVER, address, "3", stage]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    took = time.monotonic() - started
    assert done.returncode == 2, done.stderr[-2000:]
    assert took < 60
    assert "runtime.ray.address" in done.stderr and address in done.stderr
    assert "ray status" in done.stderr and "Traceback" not in done.stderr
    assert "joined" not in done.stdout


def test_unresponsive_host_waits_at_most_the_timeout() -> None:
    started = time.monotonic()
    with pytest.raises(UserError, match=r"runtime.ray.connect_timeout_s = 0.5"):
        check_reachable("192.0.2.1:6379", 0.5)  # TEST-NET-1: never answers (or is unroutable at once)
    assert time.monotonic() - started < 5


@pytest.mark.parametrize("address", ["127.0.0.1", "head:port", ":6379", "host:0", "ray://host"])
def test_malformed_address_names_the_forms(address: str) -> None:
    with pytest.raises(UserError, match="HEAD_IP:6379"):
        split_address(address)


def test_address_forms() -> None:
    assert split_address("10.0.0.5:6379") == ("10.0.0.5", 6379)
    assert split_address("ray://head:10001") == ("head", 10001)
    assert split_address("[::1]:6379") == ("::1", 6379)
