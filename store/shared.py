"""What many processes on many hosts need to share one database safely: the schema created once, under a lock
(trainscout's tables and Optuna's), and one clock (the database's) for leases.

Processes creating the schema of a new PostgreSQL database at once race in CREATE TYPE / CREATE TABLE and die
with UniqueViolation (Optuna's `studydirection` type; docs/store.md). On PostgreSQL the schema is therefore created
under a session advisory lock: the first process creates it, the others wait and then find it. SQLite serialises
writers itself; a table created between another process's check and its create is retried there (Store).
"""
from __future__ import annotations

import contextlib

import sqlalchemy as sa

SCHEMA_LOCK = 0x74736368656D61  # pg_advisory_lock key of schema creation ("tschema"): one for every database


@contextlib.contextmanager
def schema_lock(engine: sa.engine.Engine):
    """Hold the database's schema lock (PostgreSQL: a session advisory lock; others: nothing) while creating
    tables. The lock is released with the connection, even if this process dies."""
    if engine.dialect.name != "postgresql":
        yield
        return
    with engine.connect() as c:
        c.exec_driver_sql(f"SELECT pg_advisory_lock({SCHEMA_LOCK})")
        c.commit()
        try:
            yield
        finally:
            c.exec_driver_sql(f"SELECT pg_advisory_unlock({SCHEMA_LOCK})")
            c.commit()


_MADE: set[tuple] = set()  # (database URL, table) this process made or found


def ensure_table(engine: sa.engine.Engine, table: sa.Table) -> None:
    """Create `table` if the database lacks it, under the schema lock (a table of a feature, made by its first
    write: opening a store to read it changes nothing, e.g. bench/data's tracked results.db files)."""
    if (str(engine.url), table.name) in _MADE:
        return
    for attempt in range(5):
        try:
            with schema_lock(engine):
                table.create(engine, checkfirst=True)
            break
        except sa.exc.DBAPIError:  # SQLite: another process made it between the check and the create
            if attempt == 4:
                raise
    _MADE.add((str(engine.url), table.name))


def has_table(engine: sa.engine.Engine, table: sa.Table) -> bool:
    """Whether the database has `table` (a reader of a feature's table finds nothing when it has not)."""
    if (str(engine.url), table.name) in _MADE:
        return True
    if sa.inspect(engine).has_table(table.name):
        _MADE.add((str(engine.url), table.name))
        return True
    return False


def optuna_storage(url: str, engine_kwargs: dict | None = None):
    """Optuna's RDBStorage on url, its tables created under the schema lock (two searches starting together on a
    new database: the second waits for the first's CREATE TYPE instead of dying on it)."""
    import optuna
    engine = sa.create_engine(url, **(engine_kwargs or {}))
    try:
        with schema_lock(engine):
            return optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs)
    finally:
        engine.dispose()


def db_time(conn) -> float:
    """The database server's clock, seconds since the epoch: leases of processes on several hosts are measured on
    one clock, not on each host's."""
    if conn.dialect.name == "postgresql":
        return float(conn.exec_driver_sql("SELECT extract(epoch from clock_timestamp())").scalar())
    if conn.dialect.name == "sqlite":  # one host: its clock; julianday keeps the milliseconds
        return float(conn.exec_driver_sql("SELECT (julianday('now') - 2440587.5) * 86400.0").scalar())
    import time
    return time.time()
