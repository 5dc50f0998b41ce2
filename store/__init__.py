"""The results store: every measurement once, keyed by what it depends on; the trials of each search.

SQLite in the output folder by default, any SQLAlchemy URL (PostgreSQL for a cluster) otherwise. Rows hold
JSON text, never pickles. The Optuna study of a search lives in the same database (Optuna's own tables), so
optuna-dashboard can open it. A measurement is a trainscout.trial.records.Record; its to_dict() JSON is the row.

The contract of a store that many searches, processes and hosts use at once (as Optuna's storages/_base.py states
its own):

- Schema: created by whichever process opens a new database first; on PostgreSQL under an advisory lock, so that
  processes opening it together wait instead of failing (store.shared), Optuna's tables likewise.
- Who writes a measurement: the trial process that holds the key's claim (store.claims: a lease with a heartbeat),
  so one configuration is measured by one search at a time; a second search's trial waits and is served the
  record. Imports and benchmark scripts write without a claim, under the same rules.
- A second measurement of a key never replaces the first: the key's measurement (get, measurements) is its first
  ok, oom or invalid record, and every other record of the key is kept as a sample (store.samples; samples(key)).
  Before a key has such a record, its latest crash or timeout stands, and the next measurement takes its place
  (the crash stays, as a sample). The same record written twice is stored once. Each write is one transaction:
  a reader sees the old measurement or the new one, never none.
- One driver per search name at a time, across hosts (store.claims.hold_search).
- What a crashed owner leaves: nothing half-written (a record is one row, written when its trial ends); its claim
  and its driver's lease expire LEASE_S after its last heartbeat (at once for a process of this host that is
  gone); its Optuna trials left RUNNING are failed by the next --resume (search.service.recover_interrupted).
- Passwords: a URL's password is taken out where the URL is read and never stored or printed (store.secrets).
"""
from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import sys
from datetime import datetime, timezone

import sqlalchemy as sa

from trainscout.spaces import ConfigError
from trainscout.trial.records import Record, TrialSpec
from trainscout.trial.status import DETERMINISTIC, Status  # DETERMINISTIC: outcomes served from the store

from . import claims, guard, samples, secrets, shared
from .guard import StoreError, StoreLost  # noqa: F401  (the store failed while in use: deleted, full, read-only)

secrets.install()  # a stripped URL's password reaches every connection of this process, never the URL

META = sa.MetaData()
MEASUREMENTS = sa.Table(
    "trainscout_measurements", META,
    sa.Column("key", sa.String(64), primary_key=True),
    sa.Column("model", sa.String(200), nullable=False),
    sa.Column("device", sa.String(16)),
    sa.Column("world_size", sa.Integer),
    sa.Column("gpu", sa.String(200)),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("tokens_per_s", sa.Float),
    sa.Column("step_s", sa.Float),
    sa.Column("mfu", sa.Float),
    sa.Column("peak_memory_gib", sa.Float),
    sa.Column("projected_days", sa.Float),
    sa.Column("config", sa.Text, nullable=False),   # JSON: the canonical knob settings
    sa.Column("record", sa.Text, nullable=False),   # JSON: the whole trial record
    sa.Column("source", sa.String(200), nullable=False, default="local"),
    sa.Column("created_at", sa.String(32), nullable=False),
)
SEARCH_TRIALS = sa.Table(
    "trainscout_search_trials", META,
    sa.Column("search", sa.String(200), primary_key=True),
    sa.Column("trial", sa.String(64), primary_key=True),   # Ray Tune trial id
    sa.Column("key", sa.String(64)),
    sa.Column("status", sa.String(16), nullable=False),    # a Status: ok | oom | invalid | crash | timeout | stopped | pruned
    sa.Column("cached", sa.Boolean, nullable=False, default=False),
    sa.Column("tokens_per_s", sa.Float),
    sa.Column("config", sa.Text, nullable=False),
    sa.Column("created_at", sa.String(32), nullable=False),
    sa.Column("error", sa.Text),  # why it did not run or failed (invalid: the refusal); added to older stores on write
)
QUALITY = sa.Table(  # the quality gate's verdicts (trial/quality.py) and `verify --quality` results; made by the
    "trainscout_quality", sa.MetaData(),  # first verdict written (opening a store to read it changes nothing)
    sa.Column("key", sa.String(64), primary_key=True),    # kind gate: trial.quality.gate_key; verify: a measurement key
    sa.Column("kind", sa.String(16), primary_key=True),   # gate | verify
    sa.Column("result", sa.Text, nullable=False),         # JSON
    sa.Column("created_at", sa.String(32), nullable=False),
)
SEARCHES = sa.Table(
    "trainscout_searches", META,
    sa.Column("name", sa.String(200), primary_key=True),
    sa.Column("args", sa.Text, nullable=False),
    sa.Column("created_at", sa.String(32), nullable=False),
)


def now() -> str:
    """The current UTC time, ISO 8601 to the second (the stores' timestamps)."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def default_url(out_dir: str) -> str:
    """The SQLite URL of a search folder's store: OUT/results.db, as an absolute path."""
    return "sqlite:///" + os.path.abspath(os.path.join(out_dir, "results.db"))


def storage_url(url: str, flag: str = "--storage") -> str:
    """A storage URL that every process of a search opens as the same database: a relative SQLite path made absolute
    (the trials run in Ray's working directories, where it named another file each: every measurement was lost), an
    in-memory SQLite database (one per process, gone when it ends) refused with the fix. Other URLs as given."""
    url = secrets.strip(url)  # its password stays in this process's memory, never in what is saved or printed
    try:
        u = sa.engine.make_url(url)
    except sa.exc.ArgumentError:
        return url  # Store() refuses it, naming the flag
    if u.get_backend_name() != "sqlite":
        return _with_driver(u, url)
    db = u.database or ""
    uri = db.startswith("file:")
    path = db[5:].split("?")[0] if uri else db
    if not path or path == ":memory:" or "mode=memory" in db or u.query.get("mode") == "memory":
        raise ConfigError(flag, f"{flag} {url} is an in-memory SQLite database (each process its own, lost when it "
                                f"ends): give a file, e.g. sqlite:///{os.path.abspath('results.db')}, "
                                f"or leave {flag} out")
    if os.path.isabs(path):
        return url
    db = "file:" + os.path.abspath(path) + db[5 + len(path):] if uri else os.path.abspath(path)
    return u.set(database=db).render_as_string(hide_password=False)


# SQLAlchemy driver name -> the package that provides it (pip install ...), where the two differ or are not obvious
DRIVER_PACKAGES = {"psycopg2": "psycopg2-binary", "psycopg": "psycopg[binary]", "mysqldb": "mysqlclient",
                   "pymysql": "pymysql", "mysqlconnector": "mysql-connector-python", "mariadbconnector": "mariadb",
                   "pyodbc": "pyodbc", "oracledb": "oracledb", "cx_oracle": "cx_Oracle", "pg8000": "pg8000",
                   "asyncpg": "asyncpg", "aiomysql": "aiomysql"}


def driver_missing(url: str, e: ImportError) -> str:
    """What is missing for a storage URL whose database driver does not import, and how to install it (the URL's
    own driver: a mysql:// URL named the PostgreSQL one)."""
    try:
        u = sa.engine.make_url(url)
        backend, driver = u.get_backend_name(), u.get_driver_name()
    except Exception:  # noqa: BLE001 - a URL SQLAlchemy cannot parse: the import error alone
        return f"its database driver is missing ({e}): install it"
    package = DRIVER_PACKAGES.get(driver, driver)
    if backend == "postgresql":  # the extra trainscout[cluster] installs psycopg, which postgresql:// then uses
        package = f"{package}, or 'trainscout[cluster]', which has psycopg"
    return (f"the {backend} driver {driver} is missing ({e}): install it (pip install {package}), or name an "
            f"installed one in the URL ({backend}+DRIVER://...)")


def _with_driver(u, url: str) -> str:
    """postgresql://: the installed PostgreSQL driver (psycopg, of trainscout[cluster]), where SQLAlchemy's default
    (psycopg2) is not installed. The same database either way."""
    if u.drivername != "postgresql":
        return url
    import importlib.util
    if importlib.util.find_spec("psycopg2") is None and importlib.util.find_spec("psycopg") is not None:
        return u.set(drivername="postgresql+psycopg").render_as_string(hide_password=False)
    return url


def check_folder(path: str | None, flag: str = "--out") -> str:
    """An output folder that can be made and written (nothing is created here): its absolute path, or ConfigError
    with the fix for an empty name, a file on the way or a folder that is not writable."""
    if path is None or not str(path).strip():
        raise ConfigError(flag, f"{flag} is empty: give a folder, e.g. {flag} runs/out")
    full = os.path.abspath(path)
    probe = full
    while not os.path.lexists(probe):
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        what = "is a file" if probe == full else f"is on the way and is a file ({probe})"
        raise ConfigError(flag, f"{flag} {path} {what}, not a folder: give a folder path")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise ConfigError(flag, f"{flag} {path}: {probe} is not writable: give a folder you can write to")
    return full


def one_line(text: str | None, width: int = 100) -> str:
    """An error as one line of at most `width` characters (its first non-empty line)."""
    line = next((ln.strip() for ln in str(text or "").splitlines() if ln.strip()), "")
    return line if len(line) <= width else line[: width - 3] + "..."


def measurement_key(spec: TrialSpec, hardware: dict, versions: dict, placement: dict | None = None) -> str:
    """What a measurement depends on: effective config, model, recipe, hardware fingerprint, library versions; and
    for ranks split over nodes (placement, trial.pool.placement_of) how they were split, as inter-node links change
    the speed: a split measurement never stands for a one-node one (whose key is as it always was)."""
    ident = {
        "config": spec.config, "model_config": spec.model_config, "recipe": spec.recipe,
        "device": spec.device, "world_size": spec.world_size,
        "hardware": {k: hardware.get(k) for k in ("gpu", "gpu_memory_gib", "cpu", "cpu_count")},
        "versions": {k: versions.get(k) for k in ("torch", "transformers", "deepspeed")},
    }
    if spec.fault:  # an injected failure is not a measurement of the configuration: never serve it for one
        ident["fault"] = spec.fault
    if placement and placement.get("split"):
        ident["ranks_per_node"] = placement["ranks_per_node"]
    return hashlib.sha256(json.dumps(ident, sort_keys=True, default=str).encode()).hexdigest()[:32]


class Store:
    """A results database (SQLAlchemy URL)."""

    def __init__(self, url: str):
        self.warning = None  # what was dropped when a damaged SQLite file was repaired on opening
        url = secrets.strip(url)  # self.url, printed and saved, never holds the password
        try:
            url = _with_driver(sa.engine.make_url(url), url)
        except sa.exc.ArgumentError:
            pass  # refused below, naming the flag
        try:
            self.engine = sa.create_engine(url, future=True, **self._engine_kwargs(url))
            if self.engine.dialect.name == "sqlite":
                self.warning = repair_sqlite(self.engine.url.database)
                sa.event.listen(self.engine, "connect", _sqlite_pragmas)
            for attempt in range(5):
                try:
                    with shared.schema_lock(self.engine), self.engine.begin() as c:
                        META.create_all(c)  # samples and leases: made by their first write (store.shared)
                    break
                except sa.exc.OperationalError as e:  # another process created a table between check and create
                    if "already exists" not in str(e) or attempt == 4:
                        raise
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

    def _has_error_column(self) -> bool:
        if not self._error_column:
            cols = sa.inspect(self.engine).get_columns(SEARCH_TRIALS.name)
            self._error_column = any(c["name"] == "error" for c in cols)
        return self._error_column

    def _add_error_column(self) -> None:
        """Older stores get the column when a search writes to them (reading one changes nothing)."""
        if self._has_error_column():
            return
        try:
            with self.engine.begin() as c:
                c.exec_driver_sql(f"ALTER TABLE {SEARCH_TRIALS.name} ADD COLUMN error TEXT")
        except sa.exc.DBAPIError:  # another process added it first
            self._error_column = None
            if not self._has_error_column():
                raise
        self._error_column = True

    @staticmethod
    def _engine_kwargs(url: str) -> dict:
        return {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {}

    def checkpoint(self) -> None:
        """Fold SQLite's write-ahead log into the database file, so that results.db alone holds everything
        (a copy of the file without its -wal companion would otherwise miss the latest rows)."""
        if self.engine.dialect.name == "sqlite":
            with self.engine.connect() as c:
                c.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")

    # --- measurements ---------------------------------------------------------------------------------------
    def get(self, key: str) -> Record | None:
        """The measurement stored under key, or None."""
        with self.engine.connect() as c:
            row = c.execute(sa.select(MEASUREMENTS.c.record).where(MEASUREMENTS.c.key == key)).first()
        return _read(json.loads(row[0])) if row else None

    @staticmethod
    def _row(key: str, record: Record | dict, source: str) -> dict:
        """A measurement's row: the record's JSON (a dict, e.g. an imported line, is stored as given) and the
        columns read from it."""
        data = record.to_dict() if isinstance(record, Record) else record
        record = record if isinstance(record, Record) else Record.from_dict(record)
        m = record.m
        return dict(key=key, model=record.model, device=record.device, world_size=record.world_size,
                    gpu=(record.hardware or {}).get("gpu"), status=str(record.status),
                    tokens_per_s=m.get("tokens_per_s"), step_s=m.get("step_s"), mfu=m.get("mfu"),
                    peak_memory_gib=m.get("peak_memory_gib"), projected_days=m.get("projected_days"),
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

    replace = add_measurement  # the former name (bench scripts): a crash or timeout measured again gives way

    def samples(self, key: str) -> list[Record]:
        """Every record of a key: its measurement first, then its other samples, oldest first."""
        first = self.get(key)
        rest = [Record.from_dict(dict(json.loads(r["record"]), key=key, source=r["source"]))
                for r in samples.of(self.engine, key)]
        return ([first.replace(key=key)] if first else []) + rest

    def claim(self, key: str, holder: dict) -> claims.Claim:
        """Claim measurement key for this process (store.claims.measuring): waits while another live holder
        measures it; Claim.served is the record it measured (ok, oom or invalid), else this process measures and
        then calls Claim.release()."""
        return claims.measuring(self.engine, key, self.get, holder, lambda r: r.status in DETERMINISTIC)

    def hold_search(self, name: str, flag: str = "--out") -> claims.Lease:
        """The driver's lease of search `name` (heartbeat until released); ConfigError naming the live holder."""
        return claims.hold_search(self.engine, name, flag)

    def measurements(self) -> list[Record]:
        """Every stored record, with its key and source."""
        with self.engine.connect() as c:
            rows = c.execute(sa.select(MEASUREMENTS.c.key, MEASUREMENTS.c.source, MEASUREMENTS.c.record)).all()
        return [_read(dict(json.loads(r.record), key=r.key, source=r.source)) for r in rows]

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
        for attempt in range(5):
            try:
                QUALITY.create(self.engine, checkfirst=True)
                break
            except sa.exc.DBAPIError:  # another process created it between the check and the create
                if attempt == 4:
                    raise
        with self.engine.begin() as c:
            c.execute(QUALITY.delete().where((QUALITY.c.key == key) & (QUALITY.c.kind == kind)))
            c.execute(QUALITY.insert().values(key=key, kind=kind, result=json.dumps(result), created_at=now()))

    def _has_quality(self) -> bool:
        return sa.inspect(self.engine).has_table(QUALITY.name)

    def quality(self, key: str, kind: str) -> dict | None:
        """The quality verdict stored under key and kind, or None."""
        if not self._has_quality():
            return None
        with self.engine.connect() as c:
            row = c.execute(sa.select(QUALITY.c.result).where((QUALITY.c.key == key) & (QUALITY.c.kind == kind))).first()
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


def _read(data: dict) -> Record:
    """A stored record as read: its FLOP metrics counted under trial.flops.CONVENTION (a record stored under an
    older count is recounted here, its stored figures kept beside as *_dense_v0; the row is not rewritten)."""
    from trainscout.trial.flops import recount
    return recount(Record.from_dict(data))


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


JSON_COLUMNS = {MEASUREMENTS.name: ("config", "record"), SEARCH_TRIALS.name: ("config",), SEARCHES.name: ("args",),
                QUALITY.name: ("result",)}
KEY_COLUMNS = {MEASUREMENTS.name: ("key",), SEARCH_TRIALS.name: ("search", "trial"), SEARCHES.name: ("name",),
               QUALITY.name: ("key", "kind")}


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
    import time
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
        kept_all += kept
        try:  # the original count, from the table or any intact index
            total = src.execute(f'SELECT count(*) FROM "{name}"').fetchone()[0]
        except sqlite3.DatabaseError:
            total = None
        if total is not None and total != kept:
            notes.append(f"{name} {total - kept} of {total} rows")
        elif total is None and (skipped or tail is not None or len(good) < len(rows)):
            gaps = sum(b - a - 1 for a, b in skipped) + len(rows) - len(good)
            what = [f"{gaps} rows"] if gaps else []
            if tail is not None:
                what.append(f"every row after rowid {tail}")
            notes.append(f"{name} {' and '.join(what)}")
    for kind, name, sql in schema:
        if kind in ("index", "trigger", "view"):
            try:
                dst.execute(sql)
            except sqlite3.DatabaseError:
                pass
    dst.commit()
    dst.close()
    src.close()
    damaged = f"{path}.damaged-{time.strftime('%Y%m%dT%H%M%S')}"
    os.replace(path, damaged)
    for suffix in ("-wal", "-shm", "-journal"):  # never pair the new file with the damaged file's log
        if os.path.exists(path + suffix):
            os.replace(path + suffix, damaged + suffix)
    os.replace(tmp, path)
    dropped = "; ".join(notes) if notes else ("everything: its schema was unreadable" if not schema else "no row")
    return (f"{path} was damaged and has been repaired: kept {kept_all} rows, dropped {dropped}; "
            f"the damaged file is kept as {damaged}")


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
