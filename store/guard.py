"""The store a search writes is the store it opened, and a store that fails while in use is said in one line.

A SQLite store deleted while a search ran (results.db with its -wal and -shm) went on taking writes: every process
that had it open wrote into the unlinked file, a process that opened it afterwards made a new empty one, and the
search printed a normal summary and exited 0 with nothing left on disk. So a SQLite store's file identity (device,
inode) is taken when it is opened; a new connection to a path that no longer is that file is refused (it would create
an empty database there), a search checks the identity on every step of its loop and before each trial, and stops;
its driver then copies what its own connection to the old file still reads into a new results.db (SQLite's backup
API): nothing measured before the deletion is lost. A store that fails to write (a full disk, a file made read-only)
stops the search the same way, with what was recorded before named.
"""
from __future__ import annotations

import errno
import os
import sqlite3
import time

import sqlalchemy as sa

# OSError numbers that mean the storage failed, not the input: no space, read-only, denied, I/O, quota, too large
STORAGE_ERRNOS = {errno.ENOSPC, errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO, errno.EDQUOT, errno.EFBIG}


class StoreError(RuntimeError):
    """The results store failed while in use (deleted, replaced, full, read-only). The message is one line: what
    failed and what was kept; the CLI prints it and exits 1."""


class StoreLost(StoreError):
    """The store's file is gone or is another file than the one opened."""


def sqlite_path(url: str) -> str | None:
    """The database file of a SQLite URL (None: another backend, in memory, or a URI filename)."""
    try:
        u = sa.engine.make_url(url)
    except sa.exc.ArgumentError:
        return None
    if u.get_backend_name() != "sqlite" or not u.database or u.database == ":memory:" \
            or u.database.startswith("file:"):
        return None
    return u.database


def identity(path: str | None) -> tuple[int, int] | None:
    """(device, inode) of a file, None when there is none."""
    if not path:
        return None
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def lost(path: str | None, ident) -> str | None:
    """Why `path` is no longer the file whose identity was `ident` (None: it still is, or nothing to check)."""
    if not path or not ident:
        return None
    now = identity(path)
    if now is None:
        return f"{path} was deleted"
    if tuple(now) != tuple(ident):
        return f"{path} was replaced by another file"
    return None


def pin(engine, path: str | None, ident) -> None:
    """Refuse a new connection of `engine` to `path` once it is not the file it was (SQLite would create an empty
    database there, and the writes of this process would go to it, apart from the others')."""
    if not path or not ident:
        return

    @sa.event.listens_for(engine, "do_connect")
    def _check(dialect, record, cargs, cparams):
        why = lost(path, ident)
        if why:
            raise StoreLost(f"the results store {why} while in use")
        return None


def failure_of(exc: BaseException) -> str | None:
    """One line saying how the storage failed, when exc (or what caused it) is a storage failure; else None."""
    import optuna
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, StoreError):
            return str(exc)
        if isinstance(exc, sa.exc.DBAPIError):
            return _line(exc.orig) if exc.orig is not None else _line(exc)
        if isinstance(exc, sqlite3.Error):
            return _line(exc)
        if isinstance(exc, OSError) and exc.errno in STORAGE_ERRNOS:
            return f"{exc.strerror or exc}" + (f": {exc.filename}" if exc.filename else "")
        if isinstance(exc, optuna.exceptions.StorageInternalError) and exc.__cause__ is None:
            return _line(exc)
        exc = exc.__cause__ or exc.__context__
    return None


def _line(exc) -> str:
    text = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), type(exc).__name__)
    return text[:300]


class Keeper:
    """A read-only connection to a SQLite store held for a search's whole run: after the file was deleted it still
    reads what every process wrote (they share the unlinked file, its log and its shared memory), so `rescue` can
    write it back."""

    def __init__(self, path: str | None):
        self.path, self.ident, self.con = path, identity(path), None
        if self.ident:
            try:
                self.con = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=60, check_same_thread=False)
                self.con.execute("SELECT count(*) FROM sqlite_master").fetchone()  # opens the file and its log now
            except sqlite3.Error:
                self.con = None

    def lost(self) -> str | None:
        return lost(self.path, self.ident)

    def rescue(self) -> str | None:
        """Copy the store as this connection reads it to its path if the path is free, else beside it
        (PATH.rescued-TIME); returns the file written, None when nothing could be read."""
        if self.con is None:
            return None
        dest = self.path if identity(self.path) is None else f"{self.path}.rescued-{time.strftime('%Y%m%dT%H%M%S')}"
        for suffix in ("-wal", "-shm"):  # a log left from the deleted file must not be paired with the new one
            if dest == self.path and os.path.exists(dest + suffix):
                os.replace(dest + suffix, f"{dest}{suffix}.orphaned-{time.strftime('%Y%m%dT%H%M%S')}")
        try:
            out = sqlite3.connect(dest)
            try:
                self.con.backup(out)
            finally:
                out.close()
        except (sqlite3.Error, OSError):
            return None
        return dest

    def close(self) -> None:
        if self.con is not None:
            self.con.close()
            self.con = None


def counts(url: str, search: str, store=None) -> tuple[int, int] | None:
    """(trials of the search, measurements) a store holds now, read through a fresh read-only connection of SQLite
    where it is a file, else through `store` (None: not readable)."""
    path = sqlite_path(url)
    try:
        if path:
            con = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
            try:
                trials = con.execute("SELECT count(*) FROM trainscout_search_trials WHERE search = ?",
                                     (search,)).fetchone()[0]
                measured = con.execute("SELECT count(*) FROM trainscout_measurements").fetchone()[0]
            finally:
                con.close()
            return trials, measured
        if store is None:
            return None
        return len(store.trials(search)), len(store.measurements())
    except Exception:  # noqa: BLE001 - a store that cannot be read now: say so, never raise from a report
        return None
