"""Reaching Ray before anything is started or written. Ray retries an address where nothing listens for minutes
(after a search has written its store, log and lock, so a rerun in that folder is refused: docs/CLUSTER.md), and a
temp folder it cannot write ends in a traceback. Both are refused here in one line that
names the setting and the fix."""
from __future__ import annotations

import os
import socket

from trainscout.spaces import ConfigError

CONNECT_TIMEOUT_S = 5.0  # a TCP connect to a cluster's GCS: a live one answers in milliseconds, even across hosts
DEFAULT_PORT = 6379  # Ray's GCS port when an address names none


def check_address(address: str, flag: str) -> None:
    """Refuse (ConfigError on `flag`) a Ray address where nothing accepts a TCP connection within CONNECT_TIMEOUT_S.
    "auto" and "local" are Ray's own words: ray.init resolves them and fails at once (see start_error)."""
    if address == "local":
        return
    shown = address
    if address == "auto":  # the cluster `ray start` recorded on this machine, found the way ray.init finds it
        try:
            from ray._private.services import canonicalize_bootstrap_address_or_die
        except ImportError:  # another Ray: ray.init resolves it (and start_error names what it says)
            return
        try:
            address = canonicalize_bootstrap_address_or_die("auto")
        except ConnectionError as e:
            raise start_error(e, "auto", flag) from None
        shown = f"auto (the cluster recorded on this machine, {address})"
    target = address.split("://", 1)[1] if "://" in address else address
    host, sep, port = target.rstrip("/").rpartition(":")
    if not sep or not port.isdigit():
        host, port = target.rstrip("/"), str(DEFAULT_PORT)
    host = host.strip("[]")  # [::1]:6379
    if not host:
        raise ConfigError(flag, f"{flag} {address} names no host: give HOST:PORT of the cluster's head, e.g. "
                                f"127.0.0.1:{DEFAULT_PORT}, or auto")
    try:
        conn = socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S)
    except OSError as e:
        why = "no answer within %gs" % CONNECT_TIMEOUT_S if isinstance(e, TimeoutError) else (e.strerror or str(e))
        raise ConfigError(flag, f"{flag} {shown}: nothing listens there ({why}): start the cluster first (ray start "
                                f"--head on that host), correct the address, or leave {flag} out"
                                + (" (unset it)" if flag == "RAY_ADDRESS" else "") + " to start Ray on 127.0.0.1")
    with conn:
        why = _not_grpc(conn)
    if why:
        raise ConfigError(flag, f"{flag} {shown}: something listens there but it is not a Ray cluster's head ({why}): "
                                f"give HOST:PORT of the head's GCS (ray start --head prints it; default port "
                                f"{DEFAULT_PORT}), or leave {flag} out"
                                + (" (unset it)" if flag == "RAY_ADDRESS" else "") + " to start Ray on 127.0.0.1")


# HTTP/2's client preface and an empty SETTINGS frame: Ray's GCS is a gRPC server, which answers with its own SETTINGS
# frame at once (9-byte header: length 3 bytes, type 4, flags, stream 0). ray.init keeps retrying for minutes where
# something else accepted the connection (a silent listener, an HTTP or SSH server).
_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
ANSWER_TIMEOUT_S = 2.0  # a gRPC server sends its SETTINGS within a round trip


def _not_grpc(conn: socket.socket) -> str | None:
    """Why the server on conn is not a gRPC (HTTP/2) server such as Ray's GCS, or None when it is. A cluster with
    TLS on (RAY_USE_TLS) expects a TLS handshake first: not checked there."""
    if os.environ.get("RAY_USE_TLS", "0").lower() not in ("0", "", "false"):
        return None
    import time
    deadline = time.monotonic() + ANSWER_TIMEOUT_S
    got = b""
    try:
        conn.settimeout(ANSWER_TIMEOUT_S)
        conn.sendall(_PREFACE)
        while len(got) < 9:
            conn.settimeout(max(0.01, deadline - time.monotonic()))
            chunk = conn.recv(9 - len(got))
            if not chunk:
                return "it closed the connection without an HTTP/2 answer" if not got else \
                    f"it answered {got[:9]!r}, not gRPC's HTTP/2 SETTINGS"
            got += chunk
    except TimeoutError:
        return (f"no gRPC answer within {ANSWER_TIMEOUT_S:g} s" if not got else
                f"it answered {got[:9]!r}, not gRPC's HTTP/2 SETTINGS")
    except OSError as e:
        return f"the connection failed: {e.strerror or e}"
    if got[3] != 0x04 or got[5:9] != b"\x00\x00\x00\x00":  # a SETTINGS frame on stream 0
        return f"it answered {got[:9]!r}, not gRPC's HTTP/2 SETTINGS"
    return None


def start_error(e: BaseException, address: str | None, flag: str) -> ConfigError | None:
    """The one-line error for a ray.init that failed (None: not one of the failures named here): no cluster found
    for auto, or a temp folder Ray cannot write."""
    if isinstance(e, ConnectionError) and address:
        first = next((ln.strip() for ln in str(e).splitlines() if ln.strip()), type(e).__name__)
        return ConfigError(flag, f"{flag} {address}: no Ray cluster to attach to ({first[:200]}): start one (ray start "
                                 f"--head), give its HOST:PORT, or leave {flag} out to start Ray on 127.0.0.1")
    if isinstance(e, OSError) and not isinstance(e, ConnectionError):
        var = "RAY_TMPDIR" if "RAY_TMPDIR" in os.environ else "TMPDIR" if "TMPDIR" in os.environ else "RAY_TMPDIR"
        where = os.environ.get(var) or "/tmp"
        made = f" ({e.filename})" if e.filename and e.filename != where else ""
        return ConfigError(var, f"{var} {where}: Ray cannot make its temp folder there{made}: {e.strerror or e}: "
                                f"set {var} to a folder you can write to, e.g. {var}=$HOME/.cache/ray-tmp")
    return None
