"""The results store: every measurement once, keyed by what it depends on; the trials of each search.

SQLite in the output folder by default, any SQLAlchemy URL (PostgreSQL for a cluster) otherwise. Rows hold
JSON text, never pickles. The Optuna study of a search lives in the same database (Optuna's own tables), so
optuna-dashboard can open it. A measurement is a trainscout.trial.records.Record; its to_dict() JSON is the row.

The contract of a store that many searches, processes and hosts use at once (as Optuna's storages/_base.py states
its own):

- Schema: created by whichever process opens a new database first (store.schema); on PostgreSQL under an advisory
  lock, so that processes opening it together wait instead of failing (store.shared), Optuna's tables likewise.
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
  gone); its Optuna trials left RUNNING are settled by the next --resume and after every run
  (search.searcher.recover_interrupted: COMPLETE or PRUNED from the store's rows, FAIL for one that never ran).
- Passwords: a URL's password is taken out where the URL is read and never stored or printed (store.secrets).

The modules, one job each: store (Store, open_store), schema (the tables, the measurement key, creation and the one
migration), repair (a damaged SQLite file salvaged on opening), urls (storage URLs, the output folder), shared (the
schema lock, the database's clock), samples, claims, guard, secrets, row_format and contrib (share files). What the
rest of trainscout imports from trainscout.store is re-exported here.
"""
from __future__ import annotations

from . import claims, guard, samples, schema, secrets, shared
from .guard import StoreError, StoreLost  # the store failed while in use: deleted, full, read-only
from .repair import repair_sqlite
from .schema import (JSON_COLUMNS, KEY_COLUMNS, MEASUREMENTS, META, QUALITY, SEARCH_TRIALS, SEARCHES, measurement_key,
                     now)
from .store import Store, one_line, open_store
from .urls import DRIVER_PACKAGES, check_folder, default_url, driver_missing, storage_url

__all__ = ["DRIVER_PACKAGES", "JSON_COLUMNS", "KEY_COLUMNS", "MEASUREMENTS", "META", "QUALITY", "SEARCHES",
           "SEARCH_TRIALS", "Store", "StoreError", "StoreLost", "check_folder", "claims", "default_url",
           "driver_missing", "guard", "measurement_key", "now", "one_line", "open_store", "repair_sqlite", "samples",
           "schema", "secrets", "shared", "storage_url"]

secrets.install()  # a stripped URL's password reaches every connection of this process, never the URL
