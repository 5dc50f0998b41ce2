"""The salvage of a damaged SQLite store, run when a store is opened (store.store.Store): repair_sqlite.

A damaged file (a truncated or overwritten tail) is replaced by a fresh one holding every row that can still be
read, the damaged file kept beside it, and one line says what was dropped. Each table is read in rowid order,
stepping over unreadable pages (_readable_rows); a row whose JSON columns do not parse or whose key holds a zero byte
(store.schema.JSON_COLUMNS, KEY_COLUMNS) is dropped too.
"""
from __future__ import annotations

import json
import os
import sqlite3
import sys

from trainscout.spaces import ConfigError

from .schema import JSON_COLUMNS, KEY_COLUMNS


def repair_sqlite(path: str | None) -> str | None:
    """Open-time check of a SQLite store. A damaged file (a truncated or overwritten tail: a full disk, a copy cut
    short, a crash under a lying disk) is replaced by a fresh file holding every row that can still be read; the
    damaged one is kept beside it (PATH.damaged-TIME). Returns (and prints) the one-line warning of what was
    dropped, or None when the file is healthy. A torn write-ahead log needs none of this: SQLite drops the torn,
    uncommitted frames itself. A file that is not SQLite at all is refused, never touched."""
    if not path or path == ":memory:" or path.startswith("file:") or not os.path.isfile(path):
        return None
    if os.path.getsize(path) == 0:
        return None
    if not _is_sqlite(path):
        raise ConfigError("--storage", f"{path} is not a SQLite database: give a results.db written by trainscout "
                                       "or a new path")
    if _sqlite_healthy(path):
        return None
    import fcntl
    with open(path + ".lock", "w") as lock:  # one process repairs; the others then find the repaired file
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _sqlite_healthy(path):
            return None
        warning = _salvage(path)
    print(f"trainscout: warning: {warning}", file=sys.stderr, flush=True)
    return warning


def _is_sqlite(path: str) -> bool:
    """Read the header through SQLite itself. Never open() and close() the database file in a process that may
    hold SQLite connections to it: closing any descriptor of a file drops every POSIX lock the process holds on it,
    and SQLite's locks with them (a resumed search corrupted its store this way: 'database disk image is
    malformed')."""
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=60)
    try:
        con.execute("PRAGMA schema_version").fetchone()
        return True
    except sqlite3.OperationalError as e:  # busy or locked: it is a database
        return "not a database" not in str(e)
    except sqlite3.DatabaseError as e:
        return "not a database" not in str(e)
    finally:
        con.close()


def _sqlite_healthy(path: str) -> bool:
    con = sqlite3.connect(path, timeout=60)
    try:
        if con.execute("PRAGMA quick_check").fetchall() != [("ok",)]:
            return False
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        for table in tables & set(JSON_COLUMNS):  # the b-tree may be intact around damaged values (zeroed bytes)
            bad = " OR ".join([f"NOT json_valid({c})" for c in JSON_COLUMNS[table]]
                              + [f"instr({c}, char(0))" for c in KEY_COLUMNS[table]])
            if con.execute(f'SELECT 1 FROM "{table}" WHERE {bad} LIMIT 1').fetchone():
                return False
        return True
    except sqlite3.OperationalError:  # busy, locked, read-only: not a sign of damage
        return True
    except sqlite3.DatabaseError:  # malformed, not a database
        return False
    finally:
        con.close()


def _probe(con, table: str, after: int) -> tuple[bool, int | None]:
    """(readable, rowid of the first row after `after`)."""
    try:
        row = con.execute(f'SELECT rowid FROM "{table}" WHERE rowid > ? ORDER BY rowid LIMIT 1', (after,)).fetchone()
        return True, (row[0] if row else None)
    except sqlite3.DatabaseError:
        return False, None


def _readable_rows(con, table: str) -> tuple[list, list, int | None]:
    """Every row of `table` that can be read, in rowid order, stepping over unreadable pages. Returns (rows,
    skipped rowid ranges (after, up to], rowid after which nothing could be read or None)."""
    rows, skipped, last = [], [], -(1 << 63)
    while True:
        try:
            for r in con.execute(f'SELECT rowid, * FROM "{table}" WHERE rowid > ? ORDER BY rowid', (last,)):
                rows.append(r)
                last = r[0]
            return rows, skipped, None
        except sqlite3.DatabaseError:
            pass
        step, hi = 1, None  # the first rowid past the damage: double, then bisect
        while step < (1 << 62):
            if _probe(con, table, last + step)[0]:
                hi = last + step
                break
            step *= 2
        if hi is None:
            return rows, skipped, last
        lo = last + step // 2 if step > 1 else last  # lo unreadable (or the failed scan's start), hi readable
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if _probe(con, table, mid)[0] else (mid, hi)
        if _probe(con, table, hi)[1] is None:
            return rows, skipped, last
        skipped.append((last, hi))
        last = hi


def _salvage(path: str) -> str:
    """Copy every readable row of `path` into a new file, put it in the damaged file's place (the damaged one, and its
    log, kept as PATH.damaged-TIME); the warning saying what was kept and dropped."""
    src = sqlite3.connect(path, timeout=60)
    src.execute("PRAGMA writable_schema=ON")  # read past a header that counts more pages than the file holds
    try:
        schema = src.execute("SELECT type, name, sql FROM sqlite_master WHERE sql IS NOT NULL").fetchall()
    except sqlite3.DatabaseError:
        schema = []
    tmp = path + ".repairing"
    if os.path.exists(tmp):
        os.remove(tmp)
    dst = sqlite3.connect(tmp)
    kept_all, notes = 0, []
    for kind, name, sql in schema:
        if kind != "table" or name.startswith("sqlite_"):
            continue
        kept, note = _copy_table(src, dst, name, sql)
        kept_all += kept
        if note:
            notes.append(note)
    for kind, name, sql in schema:
        if kind in ("index", "trigger", "view"):
            try:
                dst.execute(sql)
            except sqlite3.DatabaseError:
                pass
    dst.commit()
    dst.close()
    src.close()
    damaged = _swap_in(path, tmp)
    dropped = "; ".join(notes) if notes else ("everything: its schema was unreadable" if not schema else "no row")
    return (f"{path} was damaged and has been repaired: kept {kept_all} rows, dropped {dropped}; "
            f"the damaged file is kept as {damaged}")


def _copy_table(src, dst, name: str, sql: str) -> tuple[int, str | None]:
    """One table's readable rows whose JSON parses and whose keys hold no NUL, copied from src into dst (created by
    sql there): (the rows kept, what was dropped, where anything was)."""
    dst.execute(sql)
    cols = [r[1] for r in src.execute(f'PRAGMA table_info("{name}")')]
    rows, skipped, tail = _readable_rows(src, name)
    json_cols = [cols.index(c) + 1 for c in JSON_COLUMNS.get(name, ()) if c in cols]
    key_cols = [cols.index(c) + 1 for c in KEY_COLUMNS.get(name, ()) if c in cols]
    good = []
    for r in rows:
        try:
            for i in json_cols:
                json.loads(r[i])
            if any("\x00" in str(r[i]) for i in key_cols):
                raise ValueError(r)
            good.append(r)
        except (TypeError, ValueError):
            pass
    marks = ", ".join("?" * (len(cols) + 1))
    names = ", ".join(["rowid"] + [f'"{c}"' for c in cols])
    dst.executemany(f'INSERT OR IGNORE INTO "{name}" ({names}) VALUES ({marks})', good)
    kept = dst.execute(f'SELECT count(*) FROM "{name}"').fetchone()[0]
    try:  # the original count, from the table or any intact index
        total = src.execute(f'SELECT count(*) FROM "{name}"').fetchone()[0]
    except sqlite3.DatabaseError:
        total = None
    if total is not None and total != kept:
        return kept, f"{name} {total - kept} of {total} rows"
    if total is None and (skipped or tail is not None or len(good) < len(rows)):
        gaps = sum(b - a - 1 for a, b in skipped) + len(rows) - len(good)
        what = [f"{gaps} rows"] if gaps else []
        if tail is not None:
            what.append(f"every row after rowid {tail}")
        return kept, f"{name} {' and '.join(what)}"
    return kept, None


def _swap_in(path: str, tmp: str) -> str:
    """The repaired file tmp put in path's place; the damaged file and its log kept aside: their new path."""
    import time
    damaged = f"{path}.damaged-{time.strftime('%Y%m%dT%H%M%S')}"
    os.replace(path, damaged)
    for suffix in ("-wal", "-shm", "-journal"):  # never pair the new file with the damaged file's log
        if os.path.exists(path + suffix):
            os.replace(path + suffix, damaged + suffix)
    os.replace(tmp, path)
    return damaged
