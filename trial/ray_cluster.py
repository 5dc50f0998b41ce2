"""Ray started or attached to, for a trial, a search and `trainscout train`: the cluster's address, a local Ray kept
on the loopback, an unreachable one refused in seconds (trial/reach.py), and ranks the cluster can never place."""
from __future__ import annotations

import os

from trainscout.spaces import ConfigError

from . import pool, reach


def cluster_address(address: str | None = None) -> str | None:
    """The Ray cluster a command attaches to: --address, else RAY_ADDRESS (set by `ray job submit`); None: it starts
    its own Ray."""
    return address or os.environ.get("RAY_ADDRESS") or None


def ensure_ray(address: str | None = None) -> None:
    """Start (or attach to) Ray. A local Ray binds to 127.0.0.1 and starts no dashboard. An address where nothing
    listens, no cluster for auto, or a temp folder Ray cannot write: ConfigError in a few seconds (trial.reach)."""
    import ray
    if ray.is_initialized():
        return
    flag = "--address" if address else "RAY_ADDRESS"
    address = cluster_address(address)
    try:
        _init(ray, address, flag)
    except ConfigError:
        raise
    except Exception as e:  # only the failures reach names are turned into one line
        err = reach.start_error(e, address, flag)
        if err is None:
            raise
        raise err from None


def check_resources(world: int, device: str, flag: str, per_trial: dict | None = None) -> None:
    """Refuse (ConfigError on flag) ranks the Ray cluster can never place: each rank's bundle (pool.rank_bundle: a GPU
    and a CPU, or half a CPU on a CPU run) times the ranks, plus what else a trial holds (per_trial: a search's Tune
    actor), against the cluster's total. `--gpus-per-trial 8` on a 2-core CPU waited until the trial's timeout."""
    import ray
    need = {k: v * world for k, v in pool.rank_bundle(device == "cuda").items()}
    for k, v in (per_trial or {}).items():
        need[k] = need.get(k, 0) + v
    have = ray.cluster_resources()
    for res, n in need.items():
        if have.get(res, 0) + 1e-9 < n:
            each = pool.rank_bundle(device == "cuda")[res]
            fit = int((have.get(res, 0) - (per_trial or {}).get(res, 0)) // each)
            extra = f" + {per_trial[res]:g} for the trial's Tune actor" if (per_trial or {}).get(res) else ""
            raise ConfigError(flag, f"{flag} {world} needs {n:g} {res} ({each:g} per rank{extra}) but this Ray cluster "
                                    f"has {have.get(res, 0):g}: give {flag} {max(1, fit)} or fewer, or a larger "
                                    "cluster")


def _init(ray, address: str | None, flag: str) -> None:
    kw = dict(include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    if address:
        reach.check_address(address, flag)  # nothing listening: refused in seconds (trial/reach.py)
        from . import attach
        attach.prepare(address, flag)  # loopback mode, the local token, a refused token said in one line
        ray.init(address=address, **kw)
    else:
        # Ray turns 127.0.0.1 into the machine's address and binds its gRPC servers to every interface unless it
        # runs as a one-machine "cluster" (its macOS/Windows mode, this switch): keep it all on the loopback.
        from ray._private import ray_constants
        os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # Ray's own processes read it at import
        ray_constants.ENABLE_RAY_CLUSTER = False  # this process imported Ray already
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # no usage-stats process, nothing sent out
        # address="local": a Ray of its own, never the cluster a `ray start` on this machine recorded (ray.init's
        # default attaches to it: the suite's test cluster took a later test's trials, whose actors died)
        ray.init(address="local", _node_ip_address="127.0.0.1", **kw)
