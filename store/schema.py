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
from trainscout.trial.records import TOKENS_PER_S, metric_columns

from . import shared

if TYPE_CHECKING:
    from trainscout.trial.records import TrialSpec

# a measurement's columns read from its record's metrics (Store's rows), to select and sort by without the JSON
METRIC_COLUMNS = metric_columns(TOKENS_PER_S, "step_s", "mfu", "peak_memory_gib", "projected_days")
META = sa.MetaData()
MEASUREMENTS = sa.Table(
    "trainscout_measurements", META,
    sa.Column("key", sa.String(64), primary_key=True),  # measurement_key
    sa.Column("model", sa.String(200), nullable=False),
    sa.Column("device", sa.String(16)),
    sa.Column("world_size", sa.Integer),
    sa.Column("gpu", sa.String(200)),
    sa.Column("status", sa.String(16), nullable=False),
    *(sa.Column(name, sa.Float) for name in METRIC_COLUMNS),
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
    # a Status: ok | oom | invalid | crash | timeout | stopped | pruned
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("cached", sa.Boolean, nullable=False, default=False),
    sa.Column(TOKENS_PER_S, sa.Float),
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


KEY_VERSION = 2  # measurement_key's scheme; 1: every knob hashed (legacy_key), 2: only the knobs set away from default


def _context(spec, hardware: dict):
    """The context of the spec's knobs from what the key holds: the model config, the recipe's batch and sequence,
    the device, the ranks and the GPU's capability. No optional package counts (Context.installed empty): a default
    that depends on one is not taken for the value, so the knob stays in the key (no key depends on what the box
    that computes it has installed)."""
    from trainscout.spaces import Context
    from trainscout.spaces.model_config import sizes
    recipe = spec.recipe or {}
    hw = dict(getattr(spec, "hardware", None) or {}, **{k: v for k, v in (hardware or {}).items() if v is not None})
    return Context(world_size=spec.world_size or 1, device=spec.device or hw.get("device") or "cpu",
                   num_layers=sizes(spec.model_config).layers if spec.model_config else 1,
                   global_batch=recipe.get("global_batch") or 1, installed=frozenset(),
                   capability=str(hw.get("capability") or ""), model_config=spec.model_config or {},
                   seq_len=recipe.get("seq_len") or 0)


def _same(a, b) -> bool:
    """Equal as stored (JSON): True is not 1, 2 is not "2"."""
    return json.dumps(a, sort_keys=True, default=str) == json.dumps(b, sort_keys=True, default=str)


def changed_knobs(spec, hardware: dict) -> dict:
    """The knobs of spec.config set away from their defaults: a knob is left out where its value is its default in
    the spec's context (Knob.default_for, what resolve() fills an unset knob with) or what that default concretises
    to in this config (Knob.concrete: optimizer_impl's auto is fused on CUDA; a config holds concretised values).
    A knob missing from the config (a record measured before it existed) counts as at its default; a setting of a
    knob not registered here (a plugin not installed, a knob since removed) is kept, its default not being known."""
    from trainscout.spaces import all_knobs
    cfg, ctx = dict(spec.config or {}), _context(spec, hardware)
    knobs = {k.name: k for k in all_knobs()}
    defaults = {name: k.default_for(ctx) for name, k in knobs.items()}
    full = {**defaults, **cfg}
    out = {}
    for name, value in cfg.items():
        if name not in knobs:
            out[name] = value
            continue
        d = defaults[name]
        if _same(value, d):
            continue
        try:
            concrete = knobs[name].concrete(d, dict(full, **{name: d}), ctx)
        except Exception:  # noqa: BLE001 - a default that does not concretise here: the value stays in the key
            concrete = d
        if not _same(value, concrete):
            out[name] = value
    return out


def _ident(spec, config: dict, hardware: dict, versions: dict, placement: dict | None) -> dict:
    ident = {
        "config": config, "model_config": spec.model_config, "recipe": spec.recipe,
        "device": spec.device, "world_size": spec.world_size,
        "hardware": {k: hardware.get(k) for k in ("gpu", "gpu_memory_gib", "cpu", "cpu_count")},
        "versions": {k: versions.get(k) for k in ("torch", "transformers", "deepspeed")},
    }
    if asked_dtype(spec.model_config):  # measured before plans named it, such a config trained its asked 16-bit weights
        ident["master_dtype"] = spec.plan.master_dtype  # under a mixed label: those records are never served for it
    if spec.fault:  # an injected failure is not a measurement of the configuration: never serve it for one
        ident["fault"] = spec.fault
    if placement and placement.get("split"):
        ident["ranks_per_node"] = placement["ranks_per_node"]
    return ident


def _hash(ident: dict) -> str:
    return hashlib.sha256(json.dumps(ident, sort_keys=True, default=str).encode()).hexdigest()[:32]


def measurement_key(spec: TrialSpec, hardware: dict, versions: dict, placement: dict | None = None) -> str:
    """What a measurement depends on: the knobs set away from their defaults (changed_knobs: a knob added by a
    release or a plugin, left at its default, changes no key), model, recipe, hardware fingerprint, library
    versions, the key's scheme (KEY_VERSION); and for ranks split over nodes (placement, trial.pool.placement_of) how
    they were split, as inter-node links change the speed: a split measurement never stands for a one-node one.
    spec: a trial.records.TrialSpec or a stored Record (record_key). A change of a knob's default (or default_for)
    changes what an unset knob runs: it must come with a new KEY_VERSION (tests/test_keys.py pins the defaults)."""
    ident = _ident(spec, changed_knobs(spec, hardware), hardware, versions, placement)
    ident["key_version"] = KEY_VERSION
    return _hash(ident)


def legacy_key(spec: TrialSpec, hardware: dict, versions: dict, placement: dict | None = None) -> str:
    """The key of scheme 1 (stores written before KEY_VERSION 2): the whole config hashed, defaults included."""
    return _hash(_ident(spec, spec.config, hardware, versions, placement))


def record_key(record) -> str:
    """The measurement key (today's scheme) of a stored record (a Record or its to_dict() JSON), computed from its
    own config, model config, recipe, device, ranks, hardware, versions, placement and fault: what a record stored
    under an older scheme is found by (store.Store.stored_key), and what an import can compare keys by. Raises
    ValueError where the record lacks what a key needs (no config, model config or recipe), and for the JSON of a
    record of a config asking for 16-bit weights whose plan has no master dtype: measured before plans named it, it
    trained the asked weights under a mixed label and is never served (measurement_key's master_dtype), so it is
    not re-keyed either (a Record read from it has its plan's default and cannot tell: give the JSON)."""
    from trainscout.trial.records import Record
    if not isinstance(record, Record) and asked_dtype(record.get("model_config") or {}) and "master_dtype" not in (
            record.get("plan") or {}):
        raise ValueError("a config asking for 16-bit weights measured before its master dtype was recorded (it "
                         "trained those weights under a mixed label): never served")
    rec = record if isinstance(record, Record) else Record.from_dict(
        {k: v for k, v in record.items() if k not in ("key", "source")})
    if not isinstance(rec.config, dict) or not rec.model_config or not rec.recipe:
        raise ValueError("the record has no config, model config or recipe")
    if asked_dtype(rec.model_config) and rec.plan is None:
        raise ValueError("the record asks for 16-bit weights and has no plan (its master dtype)")
    return measurement_key(rec, rec.hardware or {}, rec.versions or {}, placement=rec.placement)


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
