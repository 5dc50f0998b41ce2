"""The results store: every measurement once, keyed by what it depends on; the trials of each search.

SQLite in the output folder by default, any SQLAlchemy URL (PostgreSQL for a cluster) otherwise. Rows hold
JSON text, never pickles. The Optuna study of a search lives in the same database (Optuna's own tables), so
optuna-dashboard can open it.
"""
from __future__ import annotations

import hashlib
import json
import os
from datetime import datetime, timezone

import sqlalchemy as sa

from trainscout.spaces import ConfigError

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
    sa.Column("status", sa.String(16), nullable=False),    # ok | oom | invalid | crash | timeout | stopped
    sa.Column("cached", sa.Boolean, nullable=False, default=False),
    sa.Column("tokens_per_s", sa.Float),
    sa.Column("config", sa.Text, nullable=False),
    sa.Column("created_at", sa.String(32), nullable=False),
)
SEARCHES = sa.Table(
    "trainscout_searches", META,
    sa.Column("name", sa.String(200), primary_key=True),
    sa.Column("args", sa.Text, nullable=False),
    sa.Column("created_at", sa.String(32), nullable=False),
)

DETERMINISTIC = ("ok", "oom", "invalid")  # outcomes served from the store; crash and timeout are measured again


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def default_url(out_dir: str) -> str:
    return "sqlite:///" + os.path.abspath(os.path.join(out_dir, "results.db"))


def measurement_key(spec: dict, hardware: dict, versions: dict) -> str:
    """What a measurement depends on: effective config, model, recipe, hardware fingerprint, library versions."""
    ident = {
        "config": spec["config"], "model_config": spec["model_config"], "recipe": spec["recipe"],
        "device": spec["device"], "world_size": spec["world_size"],
        "hardware": {k: hardware.get(k) for k in ("gpu", "gpu_memory_gib", "cpu", "cpu_count")},
        "versions": {k: versions.get(k) for k in ("torch", "transformers", "deepspeed")},
    }
    return hashlib.sha256(json.dumps(ident, sort_keys=True, default=str).encode()).hexdigest()[:32]


class Store:
    """A results database (SQLAlchemy URL)."""

    def __init__(self, url: str):
        try:
            self.engine = sa.create_engine(url, future=True, **self._engine_kwargs(url))
            if self.engine.dialect.name == "sqlite":
                sa.event.listen(self.engine, "connect", _sqlite_pragmas)
            with self.engine.begin() as c:
                META.create_all(c)
        except (sa.exc.ArgumentError, sa.exc.NoSuchModuleError, sa.exc.OperationalError, ValueError) as e:
            raise ConfigError("--storage", f"cannot open storage {url!r}: {str(e).splitlines()[0][:200]}; "
                                           "give sqlite:///path/results.db or a reachable SQLAlchemy URL")
        self.url = url

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
    def get(self, key: str) -> dict | None:
        with self.engine.connect() as c:
            row = c.execute(sa.select(MEASUREMENTS.c.record).where(MEASUREMENTS.c.key == key)).first()
        return json.loads(row[0]) if row else None

    def put(self, key: str, record: dict, source: str = "local") -> bool:
        """Store a measurement once; False if the key was already there (the first one is kept)."""
        m = record.get("metrics") or {}
        row = dict(key=key, model=record["model"], device=record.get("device"), world_size=record.get("world_size"),
                   gpu=(record.get("hardware") or {}).get("gpu"), status=record["status"],
                   tokens_per_s=m.get("tokens_per_s"), step_s=m.get("step_s"), mfu=m.get("mfu"),
                   peak_memory_gib=m.get("peak_memory_gib"), projected_days=m.get("projected_days"),
                   config=json.dumps(record["config"], sort_keys=True), record=json.dumps(record),
                   source=source, created_at=record.get("started_at") or now())
        try:
            with self.engine.begin() as c:
                c.execute(MEASUREMENTS.insert().values(**row))
            return True
        except sa.exc.IntegrityError:
            return False

    def replace(self, key: str, record: dict) -> None:
        """A crash or timeout measured again: the newer record wins."""
        with self.engine.begin() as c:
            c.execute(MEASUREMENTS.delete().where(MEASUREMENTS.c.key == key))
        self.put(key, record)

    def measurements(self) -> list[dict]:
        with self.engine.connect() as c:
            rows = c.execute(sa.select(MEASUREMENTS.c.key, MEASUREMENTS.c.source, MEASUREMENTS.c.record)).all()
        return [dict(json.loads(r.record), key=r.key, source=r.source) for r in rows]

    def export_jsonl(self, path: str) -> int:
        """Every measurement as one JSON line (record + key + source), to pool results between labs."""
        rows = self.measurements()
        with open(path, "w", encoding="utf-8") as f:
            for r in rows:
                f.write(json.dumps(r, sort_keys=True) + "\n")
        return len(rows)

    def import_jsonl(self, path: str) -> tuple[int, int]:
        """Add the measurements of an exported file; a key already here is kept (merged, not duplicated).
        Imported rows are marked with their origin. Returns (added, already present)."""
        try:
            with open(path, encoding="utf-8") as f:
                lines = [(n, line) for n, line in enumerate(f, 1) if line.strip()]
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError("--import", f"cannot read {path}: {e}: give a file written by --export")
        records = []
        for n, line in lines:  # every line is checked before anything is written
            try:
                rec = json.loads(line)
                key, source = rec.pop("key"), rec.pop("source", "local")
                if not all(field in rec for field in ("status", "model", "config")):
                    raise KeyError("status/model/config")
            except (ValueError, KeyError, TypeError, AttributeError):
                raise ConfigError("--import", f"{path} line {n} is not a trainscout measurement: "
                                              "give a file written by `trainscout results DIR --export FILE`")
            origin = source if str(source).startswith("imported:") else f"imported:{os.path.basename(path)}"
            records.append((key, rec, origin))
        added = sum(self.put(key, rec, source=origin) for key, rec, origin in records)
        return added, len(records) - added

    # --- searches -------------------------------------------------------------------------------------------
    def add_search(self, name: str, args: dict) -> None:
        with self.engine.begin() as c:
            if c.execute(sa.select(SEARCHES.c.name).where(SEARCHES.c.name == name)).first() is None:
                c.execute(SEARCHES.insert().values(name=name, args=json.dumps(args), created_at=now()))

    def search_args(self, name: str) -> dict | None:
        with self.engine.connect() as c:
            row = c.execute(sa.select(SEARCHES.c.args).where(SEARCHES.c.name == name)).first()
        return json.loads(row[0]) if row else None

    def add_trial(self, search: str, trial: str, key: str | None, status: str, cached: bool,
                  tokens_per_s: float | None, config: dict) -> bool:
        """One row per finished trial of a search; False if that trial was already recorded."""
        try:
            with self.engine.begin() as c:
                c.execute(SEARCH_TRIALS.insert().values(
                    search=search, trial=trial, key=key, status=status, cached=cached, tokens_per_s=tokens_per_s,
                    config=json.dumps(config, sort_keys=True, default=str), created_at=now()))
            return True
        except sa.exc.IntegrityError:
            return False

    def trials(self, search: str) -> list[dict]:
        with self.engine.connect() as c:
            rows = c.execute(sa.select(SEARCH_TRIALS).where(SEARCH_TRIALS.c.search == search)
                             .order_by(SEARCH_TRIALS.c.created_at)).mappings().all()
        return [dict(r, config=json.loads(r["config"])) for r in rows]


_OPEN: dict[str, Store] = {}


def open_store(url: str) -> Store:
    """One Store per URL and process (objects that Ray pickles keep the URL, not the engine)."""
    if url not in _OPEN:
        _OPEN[url] = Store(url)
    return _OPEN[url]


def _sqlite_pragmas(dbapi_conn, _):
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA busy_timeout=60000")
    cur.close()
