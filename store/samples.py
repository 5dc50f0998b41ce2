"""Every measurement of a key is kept: the first that counts is the key's measurement, the others its samples.

A second search's records of a configuration must not replace the first's (docs/store.md), so a write never
replaces a measurement that counts: the row in trainscout_measurements is the key's first ok, oom or invalid record
(before one exists, its latest crash or timeout, which the next measurement of the key replaces; an ok taken with
other trials sharing its CPU or GPU, trial.contention, gives way to the first clean one likewise), and every other
record of the key is a row here, never changed or deleted. A second ok measurement of a key is thus a second
sample, and the spread between them is real (`results`: samples, tokens_per_s_spread). The same record written
twice (its trial id) is stored once.
"""
from __future__ import annotations

import json

import sqlalchemy as sa

from trainscout.trial.contention import contended
from trainscout.trial.records import TOKENS_PER_S
from trainscout.trial.status import served

META = sa.MetaData()
SAMPLES = sa.Table(
    "trainscout_samples", META,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("key", sa.String(64), nullable=False, index=True),
    sa.Column("trial_id", sa.String(64)),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column(TOKENS_PER_S, sa.Float),
    sa.Column("record", sa.Text, nullable=False),   # JSON: the whole trial record
    sa.Column("source", sa.String(200), nullable=False),
    sa.Column("created_at", sa.String(32), nullable=False),
)
REPLACEABLE = ("crash", "timeout")  # a key's measurement with this status gives way to the next one (kept here)


def insert_ignore(c, table: sa.Table, row: dict) -> bool:
    """INSERT that does nothing where the key exists (one statement, no aborted transaction); True if inserted."""
    name = c.dialect.name
    if name in ("sqlite", "postgresql"):  # RETURNING: psycopg reports no rowcount for it (-1)
        mod = sa.dialects.sqlite if name == "sqlite" else sa.dialects.postgresql
        pk = list(table.primary_key.columns)
        return c.execute(mod.insert(table).values(**row).on_conflict_do_nothing().returning(*pk)).first() is not None
    pk = [col == row[col.name] for col in table.primary_key.columns]
    if c.execute(sa.select(sa.literal(1)).select_from(table).where(*pk)).first():
        return False
    c.execute(table.insert().values(**row))  # another dialect: a racing writer's IntegrityError is raised
    return True


def add(engine: sa.engine.Engine, measurements: sa.Table, row: dict) -> str:
    """Store a measurement row (Store._row) under the contract above, in one transaction. Returns what it became:
    "first" (the key's measurement), "replaced" (it took the place of a crash or timeout, which is kept as a
    sample), "sample" (the key had its measurement), or "duplicate" (this record was stored already)."""
    # insert_ignore reads sa.dialects.sqlite and .postgresql: importing them here loads those submodules
    import sqlalchemy.dialects.postgresql
    import sqlalchemy.dialects.sqlite  # noqa: F401 - loaded for sa.dialects, the name unused
    from .shared import ensure_table, has_table
    if not has_table(engine, SAMPLES):  # made by the first second measurement (reading a store changes nothing)
        with engine.connect() as c:
            if c.execute(sa.select(measurements.c.key).where(measurements.c.key == row["key"])).first():
                ensure_table(engine, SAMPLES)
    try:
        return _add(engine, measurements, row)
    except sa.exc.DBAPIError:
        if has_table(engine, SAMPLES):
            raise
        ensure_table(engine, SAMPLES)  # the key was written meanwhile, by another process
        return _add(engine, measurements, row)


def _add(engine: sa.engine.Engine, measurements: sa.Table, row: dict) -> str:
    trial_id = json.loads(row["record"]).get("trial_id")
    with engine.begin() as c:
        if insert_ignore(c, measurements, row):  # the write lock of this key (SQLite: of the file) from here
            return "first"
        query = sa.select(measurements).where(measurements.c.key == row["key"])
        if c.dialect.name == "postgresql":
            query = query.with_for_update()  # writers of one key take turns
        current = c.execute(query).mappings().first()
        if trial_id is not None and (
                json.loads(current["record"]).get("trial_id") == trial_id
                or c.execute(sa.select(SAMPLES.c.id).where(SAMPLES.c.key == row["key"],
                                                           SAMPLES.c.trial_id == trial_id)).first()):
            return "duplicate"
        # a crash or timeout, an oom that was the host's memory monitor (trial.status.served), or a measurement other
        # trials shared the device of, which a clean one replaces (trial.contention), gives way
        held, new = json.loads(current["record"]), json.loads(row["record"])
        if current["status"] in REPLACEABLE or (current["status"] == "oom" and not served("oom", held.get("error"))) \
                or (contended(held) and served(row["status"], new.get("error"), new.get("metrics"))):
            c.execute(SAMPLES.insert().values(**_sample(dict(current))))
            c.execute(measurements.update().where(measurements.c.key == row["key"]).values(**row))
            return "replaced"
        c.execute(SAMPLES.insert().values(**_sample(row)))
        return "sample"


def _sample(row: dict) -> dict:
    return {"key": row["key"], "trial_id": json.loads(row["record"]).get("trial_id"), "status": row["status"],
            TOKENS_PER_S: row[TOKENS_PER_S], "record": row["record"], "source": row["source"],
            "created_at": row["created_at"]}


def of(engine: sa.engine.Engine, key: str) -> list[dict]:
    """The other samples of a key, oldest first: [{trial_id, status, tokens_per_s, record (JSON), source}]."""
    from .shared import has_table
    if not has_table(engine, SAMPLES):
        return []
    with engine.connect() as c:
        return [dict(r) for r in c.execute(sa.select(SAMPLES).where(SAMPLES.c.key == key)
                                           .order_by(SAMPLES.c.id)).mappings()]


def summary(engine: sa.engine.Engine) -> dict[str, list]:
    """Every key's other samples as (status, tokens_per_s), oldest first (one query, for results and report)."""
    from .shared import has_table
    out: dict[str, list] = {}
    if not has_table(engine, SAMPLES):
        return out
    with engine.connect() as c:
        for r in c.execute(sa.select(SAMPLES.c.key, SAMPLES.c.status, SAMPLES.c.tokens_per_s).order_by(SAMPLES.c.id)):
            out.setdefault(r.key, []).append((r.status, r.tokens_per_s))
    return out
