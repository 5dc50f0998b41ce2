"""Leases in the store: who measures a configuration now, and who drives a search now, across processes and hosts.

A lease is a row (name, holder, expiry on the database's clock) that its holder keeps alive with a heartbeat;
a holder that dies (SIGKILL, a lost host) stops beating and its lease expires LEASE_S later, when anyone may take it.
A holder on this host whose process is gone gives its lease up at once. Two uses:

- claim:KEY, a measurement being taken. A search's trial claims the key before it measures; a second search's
  trial of the same configuration waits while the claim lives and is then served the first one's record (or, if
  that one crashed, claims the key and measures it itself), so two searches never measure one configuration at
  once.
- search:NAME, the driver of a search. One driver at a time across hosts: a second is refused, naming the holder
  (host, pid), where two drivers of one search would crash one (UpdateFinishedTrialError).
  A driver paused for LEASE_S or more (SIGSTOP, a frozen VM) is taken for dead and another may take its lease: the
  paused one, when it wakes, checks its lease before every write of the search (Lease.check, guarded_storage) and
  stops in one line (LeaseLost) instead of writing over its successor's study (docs/store.md).

A holder is named by host AND a machine instance (BOOT: the kernel's boot id and this process's PID namespace) and
its process's start: "gone at once" is decided only for a holder of the same instance (two hosts with one hostname,
or two containers, each took the other's live lease when only the hostname was compared), and a pid reused by
another process is not taken for the holder. A heartbeat that fails is said on stderr (one line, at most every
BEAT_WARN_S), not skipped silently.
"""
from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
import uuid

import sqlalchemy as sa

from .guard import StoreError
from .shared import db_time

META = sa.MetaData()
LEASES = sa.Table(
    "trainscout_leases", META,
    sa.Column("name", sa.String(120), primary_key=True),  # claim:KEY or search:NAME
    sa.Column("token", sa.String(32), nullable=False),    # this holding (a process may hold several)
    sa.Column("holder", sa.Text, nullable=False),         # JSON: host, pid, and what it does (search, trial)
    sa.Column("expires_at", sa.Float, nullable=False),    # the database's clock, seconds since the epoch
    sa.Column("heartbeat_at", sa.Float, nullable=False),
)
# a holder that stops beating for this long is taken for dead (heartbeats every LEASE_S / 6); TRAINSCOUT_LEASE_S
# shortens it for tests of a paused holder
LEASE_S = float(os.environ.get("TRAINSCOUT_LEASE_S") or 60.0)
WAIT_POLL_S = 2.0  # a trial waiting for another search's measurement looks again this often
HOST = socket.gethostname()
BEAT_WARN_S = 30.0  # a failing heartbeat is said at most this often


def _read(path: str) -> str:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read().strip()
    except OSError:
        return ""


def _instance() -> str:
    """This machine instance: the kernel's boot id and the PID namespace (pids compare only within one). A machine
    without /proc (macOS) gets a uuid per process: its holders are never taken for gone, only expired."""
    boot = _read("/proc/sys/kernel/random/boot_id")
    try:
        ns = os.readlink("/proc/self/ns/pid")
    except OSError:
        ns = ""
    return f"{boot}/{ns}" if boot else f"process-{uuid.uuid4().hex}"


def _started(pid: int) -> str | None:
    """A process's start (clock ticks since boot, /proc/PID/stat field 22), None where unknown: with the pid, it
    names one process (a pid is reused once its process is gone)."""
    stat = _read(f"/proc/{pid}/stat")
    try:
        return stat.rsplit(")", 1)[1].split()[19] if stat else None
    except IndexError:
        return None


BOOT = _instance()


class Held(Exception):
    """The lease is held by a live holder: .holder (its JSON) and .age_s (since its last heartbeat)."""

    def __init__(self, holder: dict, age_s: float):
        super().__init__(f"held by {describe(holder)}")
        self.holder, self.age_s = holder, age_s


class LeaseLost(StoreError):
    """This process's lease was taken over by another holder (this one was presumed dead): str() is the one line
    (cli.main ends a command with it, exit 1, as a failed store ends one)."""


def describe(holder: dict) -> str:
    """host, pid and what it does, as the refusals print them."""
    what = f", search {holder['search']}" if holder.get("search") else ""
    return f"host {holder.get('host', '?')} pid {holder.get('pid', '?')}{what}"


def _gone(holder: dict) -> bool:
    """Whether a holder is a process of this machine instance (same host, boot and PID namespace: BOOT) that no longer
    exists. A holder of another instance, or one that names no instance (an older trainscout's), is never taken
    for gone here: only its lease's expiry frees it (another host of the same hostname held a live lease)."""
    if holder.get("host") != HOST or holder.get("boot") != BOOT or not isinstance(holder.get("pid"), int):
        return False
    try:
        os.kill(holder["pid"], 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, another user's
        return False
    started = holder.get("started")
    return started is not None and _started(holder["pid"]) not in (None, started)  # the pid is another process's


class Lease:
    """One lease by name: acquire() or Held, a heartbeat thread while held, release(). `lost` turns true when a
    heartbeat found the lease taken over (this holder was presumed dead: a pause of LEASE_S or more)."""

    def __init__(self, engine: sa.engine.Engine, name: str, holder: dict | None = None, lease_s: float = LEASE_S):
        self.engine, self.name, self.lease_s = engine, name, lease_s
        pid = os.getpid()
        self.holder = {"host": HOST, "pid": pid, "boot": BOOT, "started": _started(pid), **(holder or {})}
        self.token = uuid.uuid4().hex
        self.lost = False
        self.lost_to: dict | None = None  # the holder that took this lease over (lost), as its row says
        self.taken_over: dict | None = None  # the dead holder this acquire replaced, if any
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._warned = 0.0  # when a failing heartbeat was last said (time.monotonic)

    def try_acquire(self) -> None:
        """Take the lease (free, expired, or its holder's process gone from this host), else raise Held."""
        from .samples import insert_ignore
        from .shared import ensure_table
        ensure_table(self.engine, LEASES)  # made by the first lease (reading a store changes nothing)
        with self.engine.begin() as c:
            now = db_time(c)
            row = {"name": self.name, "token": self.token, "holder": json.dumps(self.holder),
                   "expires_at": now + self.lease_s, "heartbeat_at": now}
            if insert_ignore(c, LEASES, row):
                return self._started()
            cur = c.execute(sa.select(LEASES).where(LEASES.c.name == self.name)).mappings().first()
            if cur is None:  # released between the two statements: the next try takes it
                raise Held({}, 0.0)
            other = json.loads(cur["holder"])
            if cur["expires_at"] >= now and not _gone(other):
                raise Held(other, now - cur["heartbeat_at"])
            # expired or dead: take it over, unless another taker was first (the token changed meanwhile); the row
            # says whose holding it replaced and after how long without a heartbeat (the one replaced reads it)
            took = c.execute(LEASES.update().where(LEASES.c.name == self.name, LEASES.c.token == cur["token"])
                             .values(token=self.token, expires_at=row["expires_at"], heartbeat_at=now,
                                     holder=json.dumps({**self.holder, "replaced": cur["token"],
                                                        "after_s": round(now - cur["heartbeat_at"], 1)}))).rowcount
            if took != 1:
                raise Held(other, 0.0)
            self.taken_over = other
        return self._started()

    def _started(self) -> None:
        self._thread = threading.Thread(target=self._beat, name=f"lease {self.name}", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        while not self._stop.wait(self.lease_s / 6):
            try:
                with self.engine.begin() as c:
                    now = db_time(c)
                    n = c.execute(LEASES.update().where(LEASES.c.name == self.name, LEASES.c.token == self.token)
                                  .values(expires_at=now + self.lease_s, heartbeat_at=now)).rowcount
                if n != 1:
                    self.check()  # lost: who took it, for the line the holder stops with
                    return
            except sa.exc.SQLAlchemyError as e:  # the database away for a moment: the next beat tries again, said
                self._say_failed(e)
                continue

    def _say_failed(self, e: Exception) -> None:
        """One line on stderr for a failed heartbeat, at most every BEAT_WARN_S (the lease expires LEASE_S after the
        last one that went through: another holder may then take it)."""
        if time.monotonic() - self._warned < BEAT_WARN_S and self._warned:
            return
        self._warned = time.monotonic()
        why = next((ln.strip() for ln in str(getattr(e, "orig", None) or e).splitlines() if ln.strip()),
                   type(e).__name__)[:300]
        print(f"trainscout: warning: the heartbeat of lease {self.name} failed ({why}): retrying every "
              f"{self.lease_s / 6:.0f} s; after {self.lease_s:.0f} s without one another holder may take it",
              file=sys.stderr, flush=True)

    def check(self) -> str | None:
        """None while this holding is the lease's (read in the store now: call it before a write that only the
        holder may make); else the one line saying who took it over, and `lost` turns true. A store that cannot be
        read raises (the caller's write would fail the same way)."""
        if not self.lost:
            with self.engine.connect() as c:
                cur = c.execute(sa.select(LEASES.c.token, LEASES.c.holder)
                                .where(LEASES.c.name == self.name)).mappings().first()
            if cur is not None and cur["token"] == self.token:
                return None
            self.lost = True
            self.lost_to = json.loads(cur["holder"]) if cur is not None else {}
        return self.lost_line()

    def lost_line(self) -> str:
        """The line a holder whose lease was taken over stops with."""
        other = self.lost_to or {}
        what = other.get("search") or self.holder.get("search") or self.name.split(":", 1)[-1]
        if not other:
            return (f"search {what}: this driver's lease was freed by another (its row is gone) after it went without "
                    f"a heartbeat: this one stops; continue with --resume once no other driver runs it")
        after = (f" after {other['after_s']:.0f} s without a heartbeat"
                 if isinstance(other.get("after_s"), (int, float)) else "")
        return (f"search {what}: another driver (host {other.get('host', '?')}, pid {other.get('pid', '?')}) took "
                f"over this search's lease{after}: this one stops; its trials are theirs")

    def release(self) -> None:
        """End the heartbeat and free the lease (only this holding's: a successor's stays)."""
        if DRIVING.get(self.name) is self:
            DRIVING.pop(self.name, None)
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        try:
            with self.engine.begin() as c:
                c.execute(LEASES.delete().where(LEASES.c.name == self.name, LEASES.c.token == self.token))
        except sa.exc.SQLAlchemyError:  # the store is gone: the lease expires by itself
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()


DRIVING: dict[str, Lease] = {}  # lease name -> the driver's lease of that search held in this process


def driving(search: str) -> Lease | None:
    """The lease of search `search` this process holds as its driver (hold_search), None if none."""
    return DRIVING.get(f"search:{search}"[:120])


_WRITES = ("create_new_study", "delete_study", "set_study_user_attr", "set_study_system_attr", "create_new_trial",
           "set_trial_param", "set_trial_state_values", "set_trial_intermediate_value", "set_trial_user_attr",
           "set_trial_system_attr")


def _guarded_class():
    """RDBStorage whose writes check the lease of the search it is guarded for first (made on first use: importing
    optuna costs every command; module __getattr__ gives it to pickle, which Tune applies to its searcher)."""
    cls = globals().get("GuardedRDBStorage")
    if cls is not None:
        return cls
    import optuna

    def checked(name):
        def write(self, *a, **kw):
            lease = driving(self._trainscout_search) if getattr(self, "_trainscout_search", None) else None
            if lease is not None and (line := lease.check()) is not None:
                if self._trainscout_on_lost is not None:
                    self._trainscout_on_lost(line)
                raise LeaseLost(line)
            return getattr(optuna.storages.RDBStorage, name)(self, *a, **kw)
        write.__name__ = name
        return write
    cls = type("GuardedRDBStorage", (optuna.storages.RDBStorage,),
               {"__module__": __name__, **{n: checked(n) for n in _WRITES}})
    globals()["GuardedRDBStorage"] = cls
    return cls


def __getattr__(name):
    if name == "GuardedRDBStorage":
        return _guarded_class()
    raise AttributeError(name)


def guarded_storage(ostorage, search: str, on_lost=None):
    """ostorage (Optuna's RDBStorage of the search's study), its writes checking first the lease of `search` this
    process holds as its driver (driving(search); none held: no check): a lost lease calls on_lost(line) (a module
    function: the storage is pickled with Tune's searcher) and raises LeaseLost(line) instead of writing, so the
    successor's study is left as it is (the paused driver crashed on UpdateFinishedTrialError after telling trials
    the successor had settled). Reads pass. The check and the write are two statements: a pause of LEASE_S or more
    between them is not caught (the window is the write's own milliseconds)."""
    import optuna
    if type(ostorage) is not optuna.storages.RDBStorage:
        return ostorage
    ostorage.__class__ = _guarded_class()
    ostorage._trainscout_search, ostorage._trainscout_on_lost = search, on_lost
    return ostorage


def hold_search(engine: sa.engine.Engine, name: str, flag: str = "--out") -> Lease:
    """The driver's lease of search `name`; ConfigError naming the live holder (host, pid) if another has it. While
    held it is this process's driving(name) (the driver checks it before its writes)."""
    from trainscout.spaces import ConfigError
    lease = Lease(engine, f"search:{name}"[:120], {"search": name, "role": "driver"})
    try:
        lease.try_acquire()
    except Held as e:
        raise ConfigError(flag, f"the search {name} is being run by {describe(e.holder)} (last heartbeat "
                                f"{e.age_s:.0f} s ago; taken for dead after {LEASE_S:.0f} s without one): wait for "
                                f"it to end, or give another --out") from None
    DRIVING[lease.name] = lease
    return lease


class Claim:
    """A trial's claim of a measurement key (measuring()): `served` is the record another search measured while
    this one waited (None: this trial holds the claim and measures), `waited_s` how long it waited."""

    def __init__(self, lease: Lease | None, served, waited_s: float, other: dict | None):
        self.lease, self.served, self.waited_s, self.other = lease, served, waited_s, other

    def release(self) -> None:
        if self.lease is not None:
            self.lease.release()


def measuring(engine: sa.engine.Engine, key: str, get, holder: dict, served_if) -> Claim:
    """Claim measurement `key`, waiting while another live holder measures it. get(key) reads the store's record;
    served_if(record) says whether it stands for a new measurement (ok, oom, invalid). Returns a Claim: served (a
    record that appeared, claim not held) or held (measure now, then release)."""
    t0, other = time.monotonic(), None
    while True:
        lease = Lease(engine, f"claim:{key}", holder)
        try:
            lease.try_acquire()
        except Held as e:
            other = e.holder or other
            time.sleep(WAIT_POLL_S)
            continue
        record = get(key)  # measured meanwhile (before this claim, or by the holder it waited for)
        if record is not None and served_if(record):
            lease.release()
            return Claim(None, record, time.monotonic() - t0, other)
        return Claim(lease, None, time.monotonic() - t0, other)
