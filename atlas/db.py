"""The atlas's rows in layers: the shipped set (records.jsonl.gz, read-only), then each store or file a user names.

A layer is a results store (a search's --out folder, a results.db file or a storage URL: the user's own
measurements, taken as they are) or an export/share file (JSON lines, optionally gzipped: every row checked as an
import checks it, store/contrib.py; what is refused is kept with its reason, never used, never silently dropped).
A row of an upper layer with the identity (key and trial) of a lower one replaces it; rows of one key from
different trials are repeated measurements of one configuration, and lookup shows their median.
"""
from __future__ import annotations

import functools
import gzip
import json
import os
from dataclasses import dataclass, field

HERE = os.path.dirname(os.path.abspath(__file__))
SHIPPED = os.path.join(HERE, "records.jsonl.gz")
MODEL = os.path.join(HERE, "model.json")
USED = ("ok", "oom")  # what a layer contributes: measurements of a configuration (crash, timeout: not)


@dataclass
class Layer:
    """One layer: where it came from, its rows, and what was refused ((line, key, why))."""

    name: str
    kind: str               # shipped | store | file
    rows: list[dict]
    refused: list = field(default_factory=list)
    contributed: set = field(default_factory=set)  # a store's rows (indexes) that came by import or contribution


@dataclass
class Atlas:
    """Every layer's rows, merged (upper layers win for the same row identity), and the shipped model.json."""

    layers: list[Layer]
    rows: list[dict]
    model: dict

    @property
    def extra(self) -> bool:
        """Whether any layer is on top of the shipped set."""
        return any(layer.kind != "shipped" for layer in self.layers)


@functools.lru_cache(maxsize=1)
def shipped_rows() -> tuple[dict, ...]:
    """The shipped rows (schema 1), as bench/build_atlas.py wrote them."""
    with gzip.open(SHIPPED, "rt", encoding="utf-8") as f:
        return tuple(json.loads(line) for line in f if line.strip())


@functools.lru_cache(maxsize=1)
def shipped_model() -> dict:
    """atlas/model.json: features, leave-one-out, precomputed predictions."""
    with open(MODEL, encoding="utf-8") as f:
        return json.load(f)


def _store_layer(source: str) -> Layer:
    from trainscout.store import row_format
    from trainscout.spaces import ConfigError
    from trainscout.store import Store, default_url
    if "://" in source:
        url = source
    elif os.path.isdir(source):
        if not os.path.isfile(os.path.join(source, "results.db")):
            raise ConfigError("--db", f"--db {source} holds no results.db: give a search's --out folder, a results "
                                      "store file or URL, or a file written by `trainscout results DIR --export`")
        url = default_url(source)
    else:
        url = "sqlite:///" + os.path.abspath(source)
    rows, contributed = [], set()
    for rec in Store(url).measurements():
        if str(rec.status) not in USED or rec.fault:
            continue
        d = rec.to_dict()
        carried = d.get("provenance") if isinstance(d.get("provenance"), dict) else None
        prov = dict(carried) if carried else row_format.provenance_of(d, origin="local", source=source)
        if carried:
            prov["origin"] = "contributed" if str(rec.source or "").startswith("contributed:") else prov.get("origin")
        labels = d.get("labels") if isinstance(d.get("labels"), list) else None
        rows.append(row_format.make_row(d, rec.key, prov, labels))
        if str(rec.source or "").startswith(("contributed:", "imported:")):
            contributed.add(len(rows) - 1)
    return Layer(source, "store", rows, contributed=contributed)


def layer_of(source: str, below: dict[str, dict]) -> Layer:
    """A user's layer: a store (folder, .db file, URL) as it is, or an export/share file checked row by row
    against the rows below it (below: records by key)."""
    from trainscout.spaces import ConfigError
    from trainscout.store import contrib
    if "://" in source or os.path.isdir(source) or source.endswith(".db"):
        return _store_layer(source)
    if not os.path.isfile(source):
        raise ConfigError("--db", f"--db {source}: no such file or folder: give a results store or a file written "
                                  "by `trainscout results DIR --export FILE [--share]`")
    rows = contrib.read_rows(source, "--db")
    accepted, _, refused = contrib.checked(rows, below)
    out = []
    for _, row in accepted:
        row = {k: v for k, v in row.items() if k != "_line"}
        row["provenance"] = dict(row["provenance"], origin="contributed" if row["provenance"].get("origin") !=
                                 "trainscout" else "trainscout", source=os.path.basename(source))
        out.append(row)
    return Layer(source, "file", out, refused)


def load(sources: list[str] | None = None, shipped: bool = True) -> Atlas:
    """The atlas: the shipped set (unless shipped=False) with each source layered on top, in order."""
    from .samples import row_id
    layers = [Layer("shipped", "shipped", list(shipped_rows()))] if shipped else []
    merged: dict[str, dict] = {row_id(r): r for r in layers[0].rows} if layers else {}
    from trainscout.store import contrib
    for source in sources or []:
        below = {r["key"]: r["record"] for r in merged.values()}
        layer = layer_of(source, below)
        theirs = layer.contributed
        if theirs:  # a store's imported rows meet the rows below them as an import would: a conflict kept apart
            kept, conflicts = contrib.apart([r for i, r in enumerate(layer.rows) if i in theirs], below)
            layer.rows = [r for i, r in enumerate(layer.rows) if i not in theirs] + kept
            layer.refused.extend(conflicts)
        layers.append(layer)
        for r in layer.rows:
            merged[row_id(r)] = r
    return Atlas(layers, list(merged.values()), shipped_model())


def with_shipped(records: list) -> list:
    """A store's records with the shipped ones beneath: every shipped ok or oom record whose key the store lacks,
    as a Record (source "atlas"), its metrics' mfu the recomputed one (the recorded one kept as mfu_recorded).
    What a search's start points read (search.service.store_points)."""
    from trainscout.trial.records import Record
    have = {r.key for r in records}
    out = list(records)
    for row in shipped_rows():
        if row["key"] in have:
            continue
        rec = dict(row["record"], key=row["key"], source="atlas")
        derived = row.get("derived") or {}
        if rec.get("metrics") and "mfu" in derived:
            rec["metrics"] = dict(rec["metrics"], mfu=derived["mfu"], mfu_recorded=derived.get("mfu_recorded"))
        out.append(Record.from_dict(rec))
    return out
