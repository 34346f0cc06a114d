"""Joining the Ray cluster of ``runtime.ray.address`` within a bounded wait, or one `UserError` saying why not.

Ray's own connect loop retries an unreachable GCS for minutes (printing "Failed to connect to GCS ... within 5
seconds" every ~40 s) without ever giving up, so `join_cluster` first resolves the address (``auto`` reads the
cluster Ray recorded; ``ray://host:port`` is a Ray Client address) and opens a TCP connection to it, waiting at most
``runtime.ray.connect_timeout_s``; only when the port answers does it call ``ray.init(address=...)``. (A port that
answers but is not a Ray GCS, e.g. the dashboard's, still meets Ray's unbounded loop: Ray offers no way to bound it
from Python.) Every failure is a `UserError` (exit 2) naming ``runtime.ray.address``, what was tried and what to
check. `ray_session` (`asp.runtime.run`), which launch, profile and predict on actors use, calls it.
Tests: tests/runtime/test_connect.py.
"""

from __future__ import annotations

import socket

from asp.errors import UserError

CLIENT_PREFIX = "ray://"


def split_address(address: str) -> tuple[str, int]:
    """``host:port`` (optionally ``ray://host:port``) -> (host, port).

    Raises:
        UserError: not of that form.
    """
    bare = address.removeprefix(CLIENT_PREFIX)
    host, sep, port = bare.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UserError(
            f"runtime.ray.address = {address!r} is not an address Ray can join: use 'auto' (the cluster `ray start` "
            "started on this machine), HEAD_IP:6379 (the head node's GCS port) or ray://HEAD_IP:10001 (Ray Client), "
            "or null to start a local cluster."
        )
    return host.strip("[]"), int(port)


def resolve_address(address: str) -> str:
    """The ``host:port`` Ray would dial for `address` ('auto' looks up the running cluster).

    Raises:
        UserError: 'auto' and no running cluster is recorded on this machine.
    """
    if address != "auto":
        return address
    from ray._private.services import canonicalize_bootstrap_address_or_die

    try:
        return str(canonicalize_bootstrap_address_or_die(address))
    except (ConnectionError, ValueError) as exc:
        raise UserError(
            "runtime.ray.address = 'auto' but no running Ray cluster was found on this machine "
            f"({str(exc).splitlines()[0] if str(exc) else type(exc).__name__}). Check that `ray start --head` ran "
            "on this node (`ray status` lists the cluster), or set runtime.ray.address to HEAD_IP:6379, or null to "
            "start a local cluster."
        ) from None


def check_reachable(address: str, timeout_s: float) -> None:
    """Open (and close) a TCP connection to `address`'s host and port, waiting at most `timeout_s` seconds.

    Raises:
        UserError: the host does not resolve, refuses the connection or does not answer in time.
    """
    host, port = split_address(address)
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return
    except OSError as exc:
        why = "no answer" if isinstance(exc, TimeoutError) else (exc.strerror or str(exc) or type(exc).__name__)
    raise UserError(
        f"cannot reach the Ray cluster at runtime.ray.address = {address!r}: a TCP connection to {host}:{port} "
        f"failed ({why}) within runtime.ray.connect_timeout_s = {timeout_s:g} s. Check that the cluster is running "
        f"(`ray status` on the head node), that the address is the head node's GCS address (`ray start --head` "
        f"prints it; default port 6379, or ray://HOST:10001 for Ray Client) and that a firewall lets this machine "
        "reach it; or set runtime.ray.address: null to start a local cluster."
    )


def join_cluster(address: str, timeout_s: float, **options: object) -> None:
    """`ray.init(address=address, **options)` once the address answers (see the module docstring).

    Raises:
        UserError: the address is malformed, not found ('auto'), unreachable, or Ray could not connect to it.
    """
    import ray

    target = resolve_address(address)
    check_reachable(target, timeout_s)
    try:
        ray.init(address=address, **options)
    except (ConnectionError, TimeoutError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise UserError(
            f"Ray could not join the cluster at runtime.ray.address = {address!r} ({target} answers, but: {first}). "
            "Check that it is the head node's GCS address (`ray start --head` prints it; not the dashboard's port), "
            "that this machine runs the cluster's Ray and Python versions, or set runtime.ray.address: null."
        ) from None
