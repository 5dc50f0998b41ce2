"""What shared the node while a trial's timed steps ran: trials at once on a few CPU cores measure a fraction of
what a configuration does alone, and a store must not serve that (docs/trial.md).

A node-local registry: each rank process writes <dir>/<pid>.json (TRAINSCOUT_RUNNING_DIR, default
<tmp>/trainscout-running) as its trial starts (build, warm-up, timed steps, gate: all of it uses the device) and its
end as the trial ends (worker.reset_process). A rank counts the other trials (other `trial` tokens) present during
its timed steps: live as they began, or with a start and end overlapping them (a file holds its process's latest
trial, so one that began inside the window is seen), or killed (open entry, dead pid) after beginning inside it.
Files, not a Ray actor: every search, Ray job and `trainscout trial` on the host sees them, nothing to start or lose.

`sharing` (contending): on the CPU every other trial on the node; on a GPU those on one of its GPUs, and CPU trials
(their threads take the cores that launch its kernels); a trial on another GPU counts in `trials` only.
metrics["shared_with"] = {"trials", "sharing", "devices"}; contended(record): sharing > 0. Such a measurement is
kept apart: never served (trial.status.served), the first clean one of its key takes its place (store.samples),
rankings prefer clean ones (analysis.ties), tables mark it (results' `shared`).
"""
from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time

DIR_ENV = "TRAINSCOUT_RUNNING_DIR"
PRUNE_S = 3600.0  # a dead process's entry ended longer ago than this is removed (no timed window is that long)
_mine: dict = {}  # this process's open entry, and the start of its timed window


def registry() -> str:
    return os.environ.get(DIR_ENV) or os.path.join(tempfile.gettempdir(), "trainscout-running")


def _started(pid: int) -> str | None:
    """The process's start time in clock ticks (/proc/<pid>/stat field 22); None: no such process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except FileNotFoundError:
        return None
    except (OSError, IndexError):
        return ""  # not readable: taken as live


def _alive(e: dict) -> bool:
    started = _started(int(e.get("pid", -1)))
    return started is not None and started in ("", e.get("boot") or "")  # a reused pid is another process


def _write(entry: dict) -> None:
    path = os.path.join(registry(), f"{entry['pid']}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(entry, f)
    os.replace(path + ".tmp", path)


def _entries() -> list[dict]:
    out, now = [], time.time()
    for name in os.listdir(registry()):
        if not name.endswith(".json") or name == f"{os.getpid()}.json":
            continue
        try:
            with open(os.path.join(registry(), name)) as f:
                e = json.load(f)
        except (OSError, ValueError):
            continue  # being replaced, or removed meanwhile
        e["alive"] = _alive(e)
        if not e["alive"] and (e.get("end") or e.get("start") or 0.0) < now - PRUNE_S:
            with contextlib.suppress(OSError):  # a dead process's, older than any window it could have overlapped
                os.remove(os.path.join(registry(), name))
            continue
        out.append(e)
    return out


def enter(trial: str, devices: list[str]) -> None:
    """This process runs a trial (token `trial`, shared by its ranks) on `devices` ("cpu", or GPU ids) from now."""
    _mine.clear()
    entry = {"pid": os.getpid(), "boot": _started(os.getpid()) or "", "trial": trial, "devices": devices,
             "start": time.time(), "end": None}
    try:
        os.makedirs(registry(), exist_ok=True)
        with contextlib.suppress(OSError):
            os.chmod(registry(), 0o1777)  # every user's trials on the host write here (sticky, as /tmp)
        _write(entry)
        _mine.update(entry=entry)
    except OSError as e:
        _mine.update(why=f"the registry {registry()} cannot be written ({e.strerror or e}): {DIR_ENV}=<folder>")


def timed_start() -> None:
    """The timed steps begin: the trials live now are present in them."""
    try:
        if "entry" in _mine:
            _mine.update(t0=time.time(),
                         live={e["trial"]: e for e in _entries() if e["alive"] and e.get("end") is None})
    except OSError as e:
        _mine.update(why=f"the registry {registry()} could not be read ({e.strerror or e})")


def timed_end() -> dict:
    """The timed steps ended: {"trials": other trials present during them, "sharing": of those, the ones on its
    device (module docstring), "devices": its own}; {"unknown": why} where the registry could not be used."""
    if "t0" not in _mine:
        return {"unknown": _mine.get("why") or "the trial was not registered (trial.contention.enter)"}
    t0, t1, me = _mine["t0"], time.time(), _mine["entry"]
    present = dict(_mine["live"])
    try:
        for e in _entries():
            start, end = e.get("start", 0.0), e.get("end")
            if end is not None and start <= t1 and end >= t0 or end is None and (
                    e["alive"] and start <= t1 or t0 <= start <= t1):
                present.setdefault(e["trial"], e)
    except OSError as e:
        return {"unknown": f"the registry {registry()} could not be read ({e.strerror or e})"}
    present.pop(me["trial"], None)
    mine = set(me["devices"])
    sharing = [e for e in present.values()
               if "cpu" in mine or "cpu" in e.get("devices", []) or mine & set(e["devices"])]
    return {"trials": len(present), "sharing": len(sharing), "devices": me["devices"]}


def leave() -> None:
    """This process's trial ended (worker.reset_process): its entry says when, for the windows it overlapped."""
    if "entry" in _mine:
        with contextlib.suppress(OSError):
            _write(dict(_mine["entry"], end=time.time()))
    _mine.clear()


def merge(ranks: list[dict | None]) -> dict | None:
    """A trial's shared_with from its ranks' (ranks on several nodes see their own node's): the most of each."""
    known = [r for r in ranks if r and "trials" in r]
    if not known:
        return next((r for r in ranks if r), None)
    return {"trials": max(r["trials"] for r in known), "sharing": max(r["sharing"] for r in known),
            "devices": sorted({d for r in known for d in r["devices"]})}


def shared_in(metrics: dict | None) -> dict | None:
    """metrics["shared_with"] where peers shared its device, or where the registry could not tell (unknown: never
    taken as clean), else None."""
    s = (metrics or {}).get("shared_with") or {}
    return s if s.get("sharing") or s.get("unknown") else None


def contended(record) -> bool:
    """Whether a measurement (a Record, or its JSON) ran with other trials sharing its CPU or GPU: kept apart."""
    metrics = record.get("metrics") if isinstance(record, dict) else getattr(record, "metrics", None)
    return shared_in(metrics) is not None


def label(metrics: dict | None) -> str | None:
    """The `shared` column: "3 trials (cpu)" for a contended measurement, "unknown trials" where the registry could
    not tell, else None."""
    s = shared_in(metrics)
    if s is None:
        return None
    if not s.get("sharing"):
        return "unknown trials"
    return f"{s['sharing']} trial{'s' if s['sharing'] != 1 else ''} ({','.join(s['devices'])})"


def check_registry() -> None:
    """ConfigError naming the registry's folder where this process cannot write, list and remove an entry there: every
    measurement would then say its contention is unknown (kept apart, never served), so a search does not start."""
    from trainscout.spaces import ConfigError
    probe = os.path.join(registry(), f".check-{os.getpid()}")
    try:
        os.makedirs(registry(), exist_ok=True)
        with open(probe, "w") as f:
            f.write("{}")
        os.listdir(registry())
        os.remove(probe)
    except OSError as e:
        raise ConfigError(DIR_ENV, f"the running-trials registry {registry()} cannot be used ({e.strerror or e}): "
                                   f"trainscout could not tell which measurements shared a device; set {DIR_ENV} "
                                   "to a writable folder, or make this one writable") from None


def note(records: list) -> str | None:
    """The summary's line on a search's measurements taken beside other trials, or None where none was."""
    n = sum(1 for r in records if contended(r))
    return (f"{n} of {len(records)} measurements ran beside other trials on the node, or where the running-trials "
            "registry could not tell (kept apart; not served; marked `shared` in results): --max-concurrent 1 to "
            "measure alone") if n else None
