"""The results store's own tables: measurements, search trials, searches, quality verdicts; the key a measurement is
stored under; the tables' creation (every process may try it at once) and their one migration.

The tables of a feature live with it and are made by its first write (store.samples: samples, store.claims:
leases, QUALITY here: verdicts), so that opening a store to read it changes nothing (bench/data's tracked
results.db files); the three below META holds are made when a store is opened (create).
"""
from __future__ import annotations

import hashlib
import json
from datetime import datetime, timezone
from typing import TYPE_CHECKING

import sqlalchemy as sa

from trainscout.spaces.model_config import asked_dtype

from . import shared

if TYPE_CHECKING:
    from trainscout.trial.records import TrialSpec

META = sa.MetaData()
MEASUREMENTS = sa.Table(
    "trainscout_measurements", META,
    sa.Column("key", sa.String(64), primary_key=True),  # measurement_key
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
# what a readable row of each table holds (store.repair drops a row whose JSON does not parse or whose key has a
# zero byte): a table added here names its columns here too
JSON_COLUMNS = {MEASUREMENTS.name: ("config", "record"), SEARCH_TRIALS.name: ("config",), SEARCHES.name: ("args",),
                QUALITY.name: ("result",)}
KEY_COLUMNS = {MEASUREMENTS.name: ("key",), SEARCH_TRIALS.name: ("search", "trial"), SEARCHES.name: ("name",),
               QUALITY.name: ("key", "kind")}


def now() -> str:
    """The current UTC time, ISO 8601 to the second (the tables' created_at)."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


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
    if asked_dtype(spec.model_config):  # measured before 2026-12-06, such a config trained its asked 16-bit weights
        ident["master_dtype"] = spec.plan.master_dtype  # under a mixed label: those records are never served for it
    if spec.fault:  # an injected failure is not a measurement of the configuration: never serve it for one
        ident["fault"] = spec.fault
    if placement and placement.get("split"):
        ident["ranks_per_node"] = placement["ranks_per_node"]
    return hashlib.sha256(json.dumps(ident, sort_keys=True, default=str).encode()).hexdigest()[:32]


def create(engine: sa.engine.Engine) -> None:
    """Create META's tables where the database lacks them, under the schema lock (store.shared). Two SQLite
    processes opening a new store at once: a table made between one's check and its create is tried again."""
    for attempt in range(5):
        try:
            with shared.schema_lock(engine), engine.begin() as c:
                META.create_all(c)
            return
        except sa.exc.OperationalError as e:  # another process created a table between check and create
            if "already exists" not in str(e) or attempt == 4:
                raise


def has_error_column(engine: sa.engine.Engine) -> bool:
    """Whether trainscout_search_trials has its "error" column (a store older than it has not)."""
    return any(c["name"] == "error" for c in sa.inspect(engine).get_columns(SEARCH_TRIALS.name))


def add_error_column(engine: sa.engine.Engine) -> None:
    """The one migration: an older store gets trainscout_search_trials.error when a search writes to it (reading
    one changes nothing). Another process adding it first is no error."""
    if has_error_column(engine):
        return
    try:
        with engine.begin() as c:
            c.exec_driver_sql(f"ALTER TABLE {SEARCH_TRIALS.name} ADD COLUMN error TEXT")
    except sa.exc.DBAPIError:  # another process added it first
        if not has_error_column(engine):
            raise
