"""Leases in the store: who measures a configuration now, and who drives a search now, across processes and hosts.

A lease is a row (name, holder, expiry on the database's clock) that its holder keeps alive with a heartbeat;
a holder that dies (SIGKILL, a lost host) stops beating and its lease expires LEASE_S later, when anyone may take it.
A holder on this host whose process is gone gives its lease up at once. Two uses:

- claim:KEY, a measurement being taken. A search's trial claims the key before it measures; a second search's
  trial of the same configuration waits while the claim lives and is then served the first one's record (or, if
  that one crashed, claims the key and measures it itself). Two searches on one database measured the same 2
  configurations at the same time before this (2026-12-02).
- search:NAME, the driver of a search. One driver at a time across hosts: a second is refused, naming the holder
  (host, pid). The same search resumed from two hosts crashed one driver with UpdateFinishedTrialError before.
"""
from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid

import sqlalchemy as sa

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
LEASE_S = 60.0  # a holder that stops beating for this long is taken for dead (heartbeats every LEASE_S / 6)
WAIT_POLL_S = 2.0  # a trial waiting for another search's measurement looks again this often
HOST = socket.gethostname()


class Held(Exception):
    """The lease is held by a live holder: .holder (its JSON) and .age_s (since its last heartbeat)."""

    def __init__(self, holder: dict, age_s: float):
        super().__init__(f"held by {describe(holder)}")
        self.holder, self.age_s = holder, age_s


def describe(holder: dict) -> str:
    """host, pid and what it does, as the refusals print them."""
    what = f", search {holder['search']}" if holder.get("search") else ""
    return f"host {holder.get('host', '?')} pid {holder.get('pid', '?')}{what}"


def _gone(holder: dict) -> bool:
    """Whether a holder is a process of this host that no longer exists."""
    if holder.get("host") != HOST or not isinstance(holder.get("pid"), int):
        return False
    try:
        os.kill(holder["pid"], 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, another user's
        return False
    return False


class Lease:
    """One lease by name: acquire() or Held, a heartbeat thread while held, release(). `lost` turns true when a
    heartbeat found the lease taken over (this holder was presumed dead: a pause of LEASE_S or more)."""

    def __init__(self, engine: sa.engine.Engine, name: str, holder: dict | None = None, lease_s: float = LEASE_S):
        self.engine, self.name, self.lease_s = engine, name, lease_s
        self.holder = {"host": HOST, "pid": os.getpid(), **(holder or {})}
        self.token = uuid.uuid4().hex
        self.lost = False
        self.taken_over: dict | None = None  # the dead holder this acquire replaced, if any
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def try_acquire(self) -> None:
        """Take the lease (free, expired, or its holder's process gone from this host), else raise Held."""
        from .samples import _insert_ignore
        from .shared import ensure_table
        ensure_table(self.engine, LEASES)  # made by the first lease (reading a store changes nothing)
        with self.engine.begin() as c:
            now = db_time(c)
            row = {"name": self.name, "token": self.token, "holder": json.dumps(self.holder),
                   "expires_at": now + self.lease_s, "heartbeat_at": now}
            if _insert_ignore(c, LEASES, row):
                return self._started()
            cur = c.execute(sa.select(LEASES).where(LEASES.c.name == self.name)).mappings().first()
            if cur is None:  # released between the two statements: the next try takes it
                raise Held({}, 0.0)
            other = json.loads(cur["holder"])
            if cur["expires_at"] >= now and not _gone(other):
                raise Held(other, now - cur["heartbeat_at"])
            # expired or dead: take it over, unless another taker was first (the token changed meanwhile)
            took = c.execute(LEASES.update().where(LEASES.c.name == self.name, LEASES.c.token == cur["token"])
                             .values(token=self.token, holder=row["holder"], expires_at=row["expires_at"],
                                     heartbeat_at=now)).rowcount
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
                    self.lost = True
                    return
            except sa.exc.SQLAlchemyError:  # the database away for a moment: the next beat tries again
                continue

    def release(self) -> None:
        """End the heartbeat and free the lease (only this holding's: a successor's stays)."""
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


def hold_search(engine: sa.engine.Engine, name: str, flag: str = "--out") -> Lease:
    """The driver's lease of search `name`; ConfigError naming the live holder (host, pid) if another has it."""
    from trainscout.spaces import ConfigError
    lease = Lease(engine, f"search:{name}"[:120], {"search": name, "role": "driver"})
    try:
        lease.try_acquire()
    except Held as e:
        raise ConfigError(flag, f"the search {name} is being run by {describe(e.holder)} (last heartbeat "
                                f"{e.age_s:.0f} s ago; taken for dead after {LEASE_S:.0f} s without one): wait for "
                                f"it to end, or give another --out") from None
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
