"""Opening a results store: the Store class (one database, SQLAlchemy URL) and open_store (one Store per URL and
process). The contract a store keeps for many searches, processes and hosts is trainscout.store's docstring.

Opening a store checks a SQLite file and repairs a damaged one (store.repair), sets SQLite's write-ahead log and busy
timeout on every connection, creates the tables a new database lacks (store.schema), and pins a SQLite file's
identity (store.guard). A URL's password never reaches self.url (store.secrets).

Keys that survive (docs/store.md). A measurement's key (store.schema.measurement_key, scheme KEY_VERSION 2) hashes only
the knobs set away from their default in the trial's context, so a knob added by a release or a plugin, left at its
default, changes no key. Stores written under scheme 1 (every knob hashed, defaults included; by an older
trainscout) are read and served as they are, by re-keying on read, never by rewriting:
a lookup that misses (get, samples, stored_key) reads each row of the store once per process and computes today's
key from the row's own record (schema.record_key: its config, model config, recipe, device, ranks, hardware,
versions, placement, fault), so a row measured before a knob existed is found by the key of the same
configuration with that knob at its default. Nothing is added, changed or deleted: the rows keep their keys, an
older trainscout on the same (e.g. PostgreSQL) store finds what it stored as before, and a new measurement of a
configuration an old row holds goes under that row's key (search.trainable: stored_key before claim and write), so
it is that key's sample, as every second measurement is. A row that cannot be re-keyed (no config, model config or
recipe: written by another tool) is served under its stored key only, with a one-line warning naming it (Store.unkeyed).
"""
from __future__ import annotations

import json
import sqlite3
import sys

import sqlalchemy as sa

from trainscout.spaces import ConfigError
from trainscout.trial.records import Record
from trainscout.trial.status import Status, served  # served: the outcomes served from the store

from . import claims, guard, samples, schema, secrets, shared
from .guard import StoreLost
from .repair import repair_sqlite
from .schema import MEASUREMENTS, METRIC_COLUMNS, QUALITY, SEARCH_TRIALS, SEARCHES, now
from .urls import driver_missing, with_driver


class Store:
    """A results database (SQLAlchemy URL): measurements (with their samples), quality verdicts, searches, their
    trials, and the leases of who measures or drives what (store.claims)."""

    def __init__(self, url: str):
        self.warning = None  # what was dropped when a damaged SQLite file was repaired on opening
        url = secrets.strip(url)  # self.url, printed and saved, never holds the password
        try:
            url = with_driver(sa.engine.make_url(url), url)
        except sa.exc.ArgumentError:
            pass  # refused below, naming the flag
        try:
            self.engine = sa.create_engine(url, future=True, **self.engine_kwargs(url))
            if self.engine.dialect.name == "sqlite":
                self.warning = repair_sqlite(self.engine.url.database)
                sa.event.listen(self.engine, "connect", _sqlite_pragmas)
            schema.create(self.engine)  # samples, leases and verdicts: made by their first write (store.schema)
        except ImportError as e:  # the URL's database driver is not installed (psycopg for PostgreSQL, ...)
            raise ConfigError("--storage", f"cannot open storage {secrets.masked(url)!r}: {driver_missing(url, e)}, "
                                           "or give "
                                           "sqlite:///path/results.db")
        except ConfigError:
            raise
        except (sa.exc.ArgumentError, sa.exc.NoSuchModuleError, sa.exc.DatabaseError, ValueError) as e:
            first = str(e).splitlines()[0]
            fix = ("give its password in PGPASSWORD or ~/.pgpass (as psql reads it)"
                   if "no password supplied" in first or "password authentication failed" in first else
                   "give sqlite:///path/results.db or a reachable SQLAlchemy URL")
            raise ConfigError("--storage", f"cannot open storage {secrets.masked(url)!r}: {first[:200]}; {fix}")
        self.url = url
        # the file opened (device, inode): a new connection to the path once it is another file is refused (guard)
        self.path = guard.sqlite_path(url)
        self.identity = guard.identity(self.path)
        guard.pin(self.engine, self.path, self.identity)
        self._error_column = None  # whether trainscout_search_trials has "error" (a store older than it has not)
        self._rekeyed: dict[str, str] = {}  # today's key -> the key an older scheme's row is stored under (stored_key)
        self._seen: set[str] = set()        # the stored keys read into _rekeyed
        self.unkeyed: dict[str, str] = {}   # stored keys whose record cannot be re-keyed, and why

    def _has_error_column(self) -> bool:
        if not self._error_column:
            self._error_column = schema.has_error_column(self.engine)
        return self._error_column

    def _add_error_column(self) -> None:
        """Older stores get the column when a search writes to them (reading one changes nothing)."""
        if not self._has_error_column():
            schema.add_error_column(self.engine)
            self._error_column = True

    @staticmethod
    def engine_kwargs(url: str) -> dict:
        """What an engine of this storage URL is created with: SQLite waits up to a minute for a locked database."""
        return {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {}

    def checkpoint(self) -> None:
        """Fold SQLite's write-ahead log into the database file, so that results.db alone holds everything
        (a copy of the file without its -wal companion would otherwise miss the latest rows)."""
        if self.engine.dialect.name == "sqlite":
            with self.engine.connect() as c:
                c.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")

    # --- measurements ---------------------------------------------------------------------------------------
    def get(self, key: str) -> Record | None:
        """The measurement of key (stored under it, or under an older scheme's key: stored_key), or None."""
        row = self._record_row(key)
        if row is None and (old := self.stored_key(key)) != key:
            key, row = old, self._record_row(old)
        return _read(json.loads(row[0]), key) if row else None

    def _record_row(self, key: str):
        with self.engine.connect() as c:
            return c.execute(sa.select(MEASUREMENTS.c.record).where(MEASUREMENTS.c.key == key)).first()

    def stored_key(self, key: str) -> str:
        """The key the measurement of `key` (store.schema.measurement_key) is stored under: key itself where a row
        has it, else the key of a row written under an older key scheme whose record re-keys to it (its own config,
        model config, recipe, hardware and versions, store.schema.record_key), else key. Rows are re-keyed in this
        process when a key is first missed (each row once; nothing is written: the store reads as it did)."""
        if key in self._rekeyed or self._has_key(key):
            return self._rekeyed.get(key, key)
        self._index()
        return self._rekeyed.get(key, key)

    def _has_key(self, key: str) -> bool:
        with self.engine.connect() as c:
            return c.execute(sa.select(MEASUREMENTS.c.key).where(MEASUREMENTS.c.key == key)).first() is not None

    def _index(self) -> None:
        """Read the rows not yet re-keyed (written since by another process, or by an older trainscout) into
        _rekeyed. Where several old rows re-key to one key (measured under different knob sets that are the same
        configuration today), the first deterministic (ok, oom, invalid) one stands, else the first."""
        with self.engine.connect() as c:
            present = {k for (k,) in c.execute(sa.select(MEASUREMENTS.c.key))}
        new = sorted(present - self._seen)
        if not new:
            return
        from trainscout.trial.status import DETERMINISTIC

        from .schema import record_key
        rows = []
        for i in range(0, len(new), 500):
            with self.engine.connect() as c:
                rows += c.execute(sa.select(MEASUREMENTS.c.key, MEASUREMENTS.c.status, MEASUREMENTS.c.created_at,
                                            MEASUREMENTS.c.record).where(MEASUREMENTS.c.key.in_(new[i:i + 500]))).all()
        kept = {str(x) for x in DETERMINISTIC}
        unkeyed = []
        for r in sorted(rows, key=lambda r: (r.status not in kept, r.created_at or "", r.key)):
            self._seen.add(r.key)
            try:
                ours = record_key(json.loads(r.record))
            except Exception as e:  # noqa: BLE001 - a row of another tool or version: served under its own key only
                self.unkeyed[r.key] = one_line(f"{type(e).__name__}: {e}", 200)
                unkeyed.append(r.key)
                continue
            if ours != r.key and ours not in self._rekeyed and ours not in present:
                self._rekeyed[ours] = r.key
        if unkeyed:
            first = (unkeyed[0], self.unkeyed[unkeyed[0]])
            print(f"trainscout: warning: {len(unkeyed)} stored measurement(s) of {self.url} cannot be "
                  f"re-keyed to today's key scheme, so they are served only under their stored key (e.g. {first[0]}: "
                  f"{first[1]})", file=sys.stderr, flush=True)

    @staticmethod
    def _row(key: str, record: Record | dict, source: str) -> dict:
        """A measurement's row: the record's JSON (a dict, e.g. an imported line, is stored as given) and the
        columns read from it."""
        data = record.to_dict() if isinstance(record, Record) else record
        record = record if isinstance(record, Record) else Record.from_dict(record)
        m = record.m
        return dict(key=key, model=record.model, device=record.device, world_size=record.world_size,
                    gpu=(record.hardware or {}).get("gpu"), status=str(record.status),
                    **{name: m.get(name) for name in METRIC_COLUMNS},
                    config=json.dumps(record.config, sort_keys=True), record=json.dumps(data),
                    source=source, created_at=record.started_at or now())

    def put(self, key: str, record: Record | dict, source: str = "local") -> bool:
        """Store a measurement once; False if the key was already there (the first one is kept)."""
        try:
            with self.engine.begin() as c:
                c.execute(MEASUREMENTS.insert().values(**self._row(key, record, source)))
            return True
        except sa.exc.IntegrityError:
            return False

    def add_measurement(self, key: str, record: Record | dict, source: str = "local") -> str:
        """Store a new measurement of key under the store's contract (store.samples): "first", "replaced" (a crash
        or timeout gave way; it is kept as a sample), "sample" (the key had its measurement: this one is kept
        beside it), or "duplicate" (this record was stored already). One transaction: a concurrent reader sees the
        old measurement or the new one, never none."""
        return samples.add(self.engine, MEASUREMENTS, self._row(key, record, source))

    def samples(self, key: str) -> list[Record]:
        """Every record of a key: its measurement first, then its other samples, oldest first."""
        key = self.stored_key(key)
        first = self.get(key)
        rest = [Record.from_dict(dict(json.loads(r["record"]), key=key, source=r["source"]))
                for r in samples.of(self.engine, key)]
        return ([first.replace(key=key)] if first else []) + rest

    def claim(self, key: str, holder: dict) -> claims.Claim:
        """Claim measurement key for this process (store.claims.measuring): waits while another live holder
        measures it; Claim.served is the record it measured (ok, oom or invalid), else this process measures and
        then calls Claim.release()."""
        return claims.measuring(self.engine, key, self.get, holder, lambda r: served(r.status, r.error, r.metrics))

    def hold_search(self, name: str, flag: str = "--out") -> claims.Lease:
        """The driver's lease of search `name` (heartbeat until released); ConfigError naming the live holder."""
        return claims.hold_search(self.engine, name, flag)

    def measurements(self) -> list[Record]:
        """Every stored record, with its key and source."""
        with self.engine.connect() as c:
            rows = c.execute(sa.select(MEASUREMENTS.c.key, MEASUREMENTS.c.source, MEASUREMENTS.c.record)).all()
        return [rec for r in rows if (rec := _read(dict(json.loads(r.record), key=r.key, source=r.source)))]

    def export_jsonl(self, path: str) -> int:
        """Every measurement as one JSON line (record + key + source), to pool results between labs."""
        rows = self.measurements()
        try:
            with open(path, "w", encoding="utf-8") as f:
                for r in rows:
                    f.write(json.dumps(r.to_dict(), sort_keys=True) + "\n")
        except OSError as e:
            raise ConfigError("--export", f"cannot write {path}: {e.strerror}: give a writable file path")
        return len(rows)

    def import_jsonl(self, path: str):
        """Add the measurements of an exported or shared file, each checked (store.contrib: its rules, what is
        refused and why); a key already here is merged, not duplicated. Returns contrib.ImportReport(added,
        present, refused)."""
        from .contrib import import_file
        return import_file(self, path)

    # --- quality verdicts ------------------------------------------------------------------------------------
    def put_quality(self, key: str, kind: str, result: dict) -> None:
        """A quality verdict: kind "gate" (one step, keyed by trial.quality.gate_key) or "verify" (`verify
        --quality`, keyed by the measurement's key); a newer one of the same key and kind replaces it."""
        shared.ensure_table(self.engine, QUALITY)
        with self.engine.begin() as c:
            c.execute(QUALITY.delete().where((QUALITY.c.key == key) & (QUALITY.c.kind == kind)))
            c.execute(QUALITY.insert().values(key=key, kind=kind, result=json.dumps(result), created_at=now()))

    def _has_quality(self) -> bool:
        return shared.has_table(self.engine, QUALITY)

    def quality(self, key: str, kind: str) -> dict | None:
        """The quality verdict stored under key and kind, or None."""
        if not self._has_quality():
            return None
        with self.engine.connect() as c:
            row = c.execute(sa.select(QUALITY.c.result).where((QUALITY.c.key == key)
                                                              & (QUALITY.c.kind == kind))).first()
        return json.loads(row[0]) if row else None

    def verified(self) -> dict[str, dict]:
        """Every `verify --quality` result, by measurement key."""
        if not self._has_quality():
            return {}
        with self.engine.connect() as c:
            rows = c.execute(sa.select(QUALITY.c.key, QUALITY.c.result).where(QUALITY.c.kind == "verify")).all()
        return {r.key: json.loads(r.result) for r in rows}

    # --- searches -------------------------------------------------------------------------------------------
    def add_search(self, name: str, args: dict) -> None:
        """Record a new search and the settings it was started with (a name already recorded is left as it is)."""
        self._add_error_column()
        with self.engine.begin() as c:
            if c.execute(sa.select(SEARCHES.c.name).where(SEARCHES.c.name == name)).first() is None:
                c.execute(SEARCHES.insert().values(name=name, args=json.dumps(args), created_at=now()))

    def update_search(self, name: str, args: dict) -> None:
        """A resumed search's settings (more --trials): the next resume starts from them."""
        with self.engine.begin() as c:
            c.execute(SEARCHES.update().where(SEARCHES.c.name == name).values(args=json.dumps(args)))

    def searches(self) -> list[str]:
        """The names of the searches in this store, oldest first."""
        with self.engine.connect() as c:
            return [r[0] for r in c.execute(sa.select(SEARCHES.c.name).order_by(SEARCHES.c.created_at))]

    def search_args(self, name: str) -> dict | None:
        """The settings a search was started (or last resumed) with, or None for a search not recorded."""
        with self.engine.connect() as c:
            row = c.execute(sa.select(SEARCHES.c.args).where(SEARCHES.c.name == name)).first()
        return json.loads(row[0]) if row else None

    def add_trial(self, search: str, trial: str, key: str | None, status: Status, cached: bool,
                  tokens_per_s: float | None, config: dict, error: str | None = None) -> bool:
        """One row per finished trial of a search, with why it failed or did not run (error); False if that trial
        was already recorded."""
        self._add_error_column()
        try:
            with self.engine.begin() as c:
                c.execute(SEARCH_TRIALS.insert().values(
                    search=search, trial=trial, key=key, status=str(status), cached=cached, tokens_per_s=tokens_per_s,
                    config=json.dumps(config, sort_keys=True, default=str), created_at=now(),
                    error=None if error is None else str(error)[:4000]))
            return True
        except sa.exc.IntegrityError:
            return False

    def trials(self, search: str) -> list[dict]:
        """A search's trial rows in the order they ended (error None in a store older than that column)."""
        cols = [c for c in SEARCH_TRIALS.c if c.name != "error" or self._has_error_column()]
        with self.engine.connect() as c:
            rows = c.execute(sa.select(*cols).where(SEARCH_TRIALS.c.search == search)
                             .order_by(SEARCH_TRIALS.c.created_at)).mappings().all()
        return [{"error": None, **r, "config": json.loads(r["config"])} for r in rows]


def _read(data: dict, key: str | None = None) -> Record | None:
    """A stored record as read: its FLOP metrics counted under predictor.flops.CONVENTION (a record stored under an
    older count is recounted here, its stored figures kept beside as *_dense_v0; the row is not rewritten). A row
    whose fields are not of a record's types (written by hand or by another tool) is left out, with a warning
    naming its key and field, once per process: None."""
    from pydantic import ValidationError

    from trainscout.predictor.flops import recount
    try:
        return recount(Record.from_dict(data))
    except ValidationError as e:
        key = key or data.get("key") or "?"
        if key not in _UNREADABLE:
            _UNREADABLE.add(key)
            err = e.errors()[0]
            where = ".".join(str(x) for x in err["loc"])
            print(f"trainscout: warning: stored measurement {key} left out: its {where} is not a record's "
                  f"({err['msg']}, got {str(err.get('input'))[:40]!r})", file=sys.stderr, flush=True)
        return None


_UNREADABLE: set[str] = set()  # the keys warned of


_OPEN: dict[str, Store] = {}


def open_store(url: str, expect=None) -> Store:
    """One Store per URL and process (objects that Ray pickles keep the URL, not the engine). expect: the (device,
    inode) of the SQLite file the caller opened (a search's driver): StoreLost, and nothing created, when the path is
    not that file any more."""
    if expect:
        why = guard.lost(guard.sqlite_path(url), expect)
        if why is None and url in _OPEN and _OPEN[url].identity and tuple(_OPEN[url].identity) != tuple(expect):
            why = f"{_OPEN[url].path} is another file than the search opened"
        if why:
            raise StoreLost(f"the results store {why} while the search ran")
    if url not in _OPEN:
        _OPEN[url] = Store(url)
    return _OPEN[url]


def _sqlite_pragmas(dbapi_conn, _):
    """WAL once per file (it persists), the busy timeout on every connection. Switching to WAL takes an exclusive
    lock that SQLite does not wait for: two processes opening a new store at once got 'database is locked'."""
    import time
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA busy_timeout=60000")
    for attempt in range(600):
        try:
            if cur.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
                cur.execute("PRAGMA journal_mode=WAL")
            break
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) or attempt == 599:
                raise
            time.sleep(0.1)
    cur.close()


def one_line(text: str | None, width: int = 100) -> str:
    """An error as one line of at most `width` characters (its first non-empty line)."""
    line = next((ln.strip() for ln in str(text or "").splitlines() if ln.strip()), "")
    return line if len(line) <= width else line[: width - 3] + "..."
