"""What shared the node while a trial's timed steps ran: a node-local registry of running trials (issue 50).

5 trials at once on 2 CPU cores stored 321 tokens/s for a configuration measured at 1,293-8,996 alone, and later
searches were served 321. Now each rank process of a trial writes <dir>/<pid>.json (dir: TRAINSCOUT_RUNNING_DIR,
default <tmp>/trainscout-running) when its trial starts (build, compile, warm-up, timed steps, gate: all of it uses
the device) and writes its end when the trial ends (worker.reset_process). A rank counts the other trials (other
`trial` tokens: a trial's own ranks share its token) present during its timed steps: live at their start, or
present at any time between their start and end (one file per process holds its latest trial: a window of it that
began inside ours is its latest). A dead process's open entry (killed) counts only where it began inside our window
or was live at its start. Files rather than a Ray actor: every search, Ray job and `trainscout trial` on the host
sees them, with nothing to start or to lose.

Which peers contend: on the CPU every other trial on the node (the cores are shared, and a GPU trial's host side
uses them); on a GPU the trials on one of its GPUs, and CPU trials (their threads take the cores that launch its
kernels); a trial on another GPU of the node is counted in `trials`, not in `sharing`. A record's
metrics["shared_with"]: {"trials", "sharing", "devices"}; contended(record): sharing > 0. Such a measurement is
kept apart: never served as the configuration's stored answer (trial.status.served), a clean one of its key takes
its place (store.samples), and rankings prefer clean ones (analysis.ties).
"""
from __future__ import annotations

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
    """The process's start time in clock ticks (/proc/<pid>/stat field 22), "" where /proc is not; None: no process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except FileNotFoundError:
        return None
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)
            return ""
        except ProcessLookupError:
            return None
        except OSError:
            return ""


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
            try:  # a dead process's, older than any window it could have overlapped
                os.remove(os.path.join(registry(), name))
            except OSError:
                pass
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
        try:
            os.chmod(registry(), 0o1777)  # every user's trials on the host write here (sticky, as /tmp)
        except OSError:
            pass
        _write(entry)
        _mine.update(entry=entry)
    except OSError as e:
        _mine.update(why=f"the registry {registry()} cannot be written ({e.strerror or e}): {DIR_ENV}=<folder>")


def timed_start() -> None:
    """The timed steps begin: the trials live now are present in them."""
    if "entry" in _mine:
        _mine.update(t0=time.time(), live={e["trial"]: e for e in _entries() if e["alive"] and e.get("end") is None})


def timed_end() -> dict:
    """The timed steps ended: {"trials": other trials present during them, "sharing": of those, the ones on its
    device (module docstring), "devices": its own}; {"unknown": why} where the registry could not be used."""
    if "t0" not in _mine:
        return {"unknown": _mine.get("why") or "the trial was not registered (trial.contention.enter)"}
    t0, t1, me = _mine["t0"], time.time(), _mine["entry"]
    present = dict(_mine["live"])
    for e in _entries():
        start, end = e.get("start", 0.0), e.get("end")
        if end is not None and start <= t1 and end >= t0 or end is None and (
                e["alive"] and start <= t1 or t0 <= start <= t1):
            present.setdefault(e["trial"], e)
    present.pop(me["trial"], None)
    mine = set(me["devices"])
    sharing = [e for e in present.values() if "cpu" in mine or "cpu" in e.get("devices", []) or mine & set(e["devices"])]
    return {"trials": len(present), "sharing": len(sharing), "devices": me["devices"]}


def leave() -> None:
    """This process's trial ended (worker.reset_process): its entry says when, for the windows it overlapped."""
    if "entry" in _mine:
        try:
            _write(dict(_mine["entry"], end=time.time()))
        except OSError:
            pass
        _mine.clear()


def merge(ranks: list[dict | None]) -> dict | None:
    """A trial's shared_with from its ranks' (ranks on several nodes see their own node's): the most of each."""
    known = [r for r in ranks if r and "trials" in r]
    if not known:
        return next((r for r in ranks if r), None)
    return {"trials": max(r["trials"] for r in known), "sharing": max(r["sharing"] for r in known),
            "devices": sorted({d for r in known for d in r["devices"]})}


def shared_in(metrics: dict | None) -> dict | None:
    """metrics["shared_with"] where peers shared its device (contended), else None."""
    s = (metrics or {}).get("shared_with") or {}
    return s if s.get("sharing") else None


def contended(record) -> bool:
    """Whether a measurement (a Record, or its JSON) ran with other trials sharing its CPU or GPU: kept apart."""
    metrics = record.get("metrics") if isinstance(record, dict) else getattr(record, "metrics", None)
    return shared_in(metrics) is not None


def label(metrics: dict | None) -> str | None:
    """The `shared` column: "3 trials (cpu)" for a contended measurement, else None."""
    s = shared_in(metrics)
    return None if s is None else f"{s['sharing']} trial{'s' if s['sharing'] != 1 else ''} ({','.join(s['devices'])})"


def note(records: list) -> str | None:
    """The summary's line on a search's measurements taken beside other trials, or None where none was."""
    shared = sum(1 for r in records if contended(r))
    if not shared:
        return None
    return (f"{shared} of {len(records)} measurement{'s' if len(records) != 1 else ''} ran beside other trials on "
            "the node (kept apart: not served to later searches; marked in results): --max-concurrent 1 to measure "
            "alone")
