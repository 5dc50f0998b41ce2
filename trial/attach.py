"""Attaching to a Ray cluster someone started: the settings Ray needs that nobody is told, and its refusal in one
line (exit 2, nothing written) instead of a traceback.

- A head on the loopback (`RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 ray start --head --node-ip-address 127.0.0.1`: that
  switch keeps it off every other interface). A driver in Ray's multi-node mode turns 127.0.0.1 into the machine's
  address and waits for a GCS that is not there: an address on the loopback puts this driver in Ray's one-machine
  mode too.
- Token authentication, on by default in Ray 2.60 (the first local ray.init or `ray start` writes
  ~/.ray/auth_token). ray.init with an explicit address sends the token only under RAY_AUTH_MODE=token, and without
  it fails after its retries with a traceback. Here the cluster is asked first (a GCS client; docs/CLUSTER.md). One
  on the loopback that refuses a driver without a token gets this machine's (RAY_AUTH_MODE unset, a token in
  RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token), as Ray does for its own `auto`; a remote cluster is
  never sent this machine's token unasked (RAY_AUTH_MODE=token asks). A cluster that still refuses is refused in
  one line naming what to set.
"""
from __future__ import annotations

import contextlib
import os
import socket

from trainscout.spaces import ConfigError

LOOPBACK = ("localhost", "::1")


def host_port(address: str) -> tuple[str, int] | None:
    """(host, port) of a HOST:PORT GCS address; None for Ray's own words (auto, local) and ray:// client URLs."""
    if not address or address in ("auto", "local") or "://" in address:
        return None
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def on_loopback(address: str) -> bool:
    hp = host_port(address)
    return hp is not None and (hp[0].startswith("127.") or hp[0] in LOOPBACK)


def one_machine_mode() -> None:
    """Ray's one-machine mode in this process and the processes it starts: 127.0.0.1 stays 127.0.0.1 and nothing
    binds another interface."""
    from ray._private import ray_constants
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # Ray's own processes read it at import
    ray_constants.ENABLE_RAY_CLUSTER = False  # this process imported Ray already


def _token_mode() -> bool:
    return os.environ.get("RAY_AUTH_MODE", "").lower() == "token"


def _local_token() -> bool:
    """Token mode for a cluster on this machine that asks for it, when RAY_AUTH_MODE is unset and a token is at
    hand (Ray's own helper for its `auto` address). Only then: a driver in token mode attached to a cluster
    without it had every Tune actor die before it ran (their calls to the driver refused). True if switched on."""
    if "RAY_AUTH_MODE" in os.environ:
        return False  # set by the user: respected
    try:
        from ray._private.authentication.authentication_token_setup import _enable_token_auth
        from ray._raylet import AuthenticationTokenLoader
    except ImportError:  # a Ray without token authentication
        return False
    if not AuthenticationTokenLoader.instance().has_token(ignore_auth_mode=True):
        return False
    _enable_token_auth()
    return True


@contextlib.contextmanager
def _quiet_stderr():
    """Ray's C++ client logs each refused attempt to the process's stderr: the one-line refusal says it instead."""
    saved, null = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


def _refused(hp: tuple[str, int]) -> bool:
    """Whether the cluster's GCS refuses this process's authentication (False: it answered, or failed otherwise,
    which ray.init then reports)."""
    try:
        from ray._raylet import GcsClient
        from ray.exceptions import AuthenticationError
    except ImportError:
        return False
    try:
        with _quiet_stderr():
            GcsClient(address=f"{hp[0]}:{hp[1]}").internal_kv_get(b"session_name", b"session", timeout=10)
    except AuthenticationError:
        return True
    except Exception:  # noqa: BLE001 - anything else: ray.init reports it
        return False
    return False


def check_auth(address: str, flag: str) -> None:
    """Refuse (ConfigError on flag) a cluster that rejects this driver's authentication, before ray.init waits out
    its retries; a cluster on this machine that asks for a token gets this machine's (see the module's note). An
    address where nothing listens is left to ray.init's own checks (a short connect decides)."""
    hp = host_port(address)
    if hp is None:
        return
    try:
        socket.create_connection(hp, timeout=2).close()
    except OSError:
        return
    if not _refused(hp):
        return
    if on_loopback(address) and not _token_mode() and _local_token() and not _refused(hp):
        return
    if _token_mode():
        fix = ("this driver's token (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token) is not the "
               "cluster's: copy the head's (`ray get-auth-token` on it) into ~/.ray/auth_token or RAY_AUTH_TOKEN")
    else:
        fix = ("set RAY_AUTH_MODE=token and give the cluster's token (`ray get-auth-token` on its head) in "
               "~/.ray/auth_token or RAY_AUTH_TOKEN")
    raise ConfigError(flag, f"{flag} {address}: the cluster refused this driver (Ray token authentication): "
                            f"{fix}") from None


def prepare(address: str, flag: str = "--address") -> None:
    """What attaching to `address` needs before ray.init: one-machine mode for a loopback address, the local token
    for a cluster on this machine, and the authentication check."""
    if on_loopback(address):
        one_machine_mode()
    check_auth(address, flag)
