"""One row of the atlas and of a share file: a measurement record, where it came from, and what is known to be wrong
with it. Here, below the atlas, because the store reads and writes share files (store/contrib.py).

Schema version 1 (`SCHEMA`), one JSON object per line (the shipped `records.jsonl.gz`, a `--share` contribution
file, `trainscout lookup --db FILE`):

    schema        1
    key           the measurement key (trainscout.store.measurement_key: config, model, recipe, hardware, versions)
    record        the measurement as trainscout stores it (trial.records.Record.to_dict()), less what only its own
                  box knew: no stderr tail, no attempt, no source; a config.json model is named by its file's stem
                  (its shape is in record.model_config); paths and host names in its error are replaced
    provenance    gpu, gpu_count, gpu_memory_gib, capability, driver, cuda, python, torch, transformers, deepspeed,
                  torchao, liger_kernel, flash_attn, ray, optuna, trainscout: each as recorded, or "unknown";
                  date (when it was measured), command (the command or bench script that measured it, or
                  "unknown"), origin (trainscout: the project's own H200 records; contributed; local), source (the
                  file or store it was read from, relative), notes (where a value came from elsewhere, e.g. docs)
    labels        [{"name", "why"}]: a method known to bias the number (it is kept, and shown with the label)
    verified      optional: trainscout verify's full optimizer steps of this configuration against its projection
    derived       values recomputed, not measured: mfu under the honest FLOP count (mfu_convention names it);
                  mfu_recorded is the record's own figure
    content_hash  "sha256:" + the SHA-256 of the row's canonical JSON without this field

Nothing is invented: a field the record lacks is "unknown". A bare record (what `trainscout results --export`
wrote without a schema, and every row of a results store) is schema 0; `migrate` turns it into a version-1 row.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import socket

SCHEMA = 1
UNKNOWN = "unknown"
VERSION_FIELDS = ("python", "torch", "transformers", "deepspeed", "torchao", "liger_kernel", "flash_attn", "ray",
                  "optuna", "trainscout")
HARDWARE_FIELDS = ("gpu", "gpu_count", "gpu_memory_gib", "capability", "driver", "cuda")
# what a record carries only for its own box or its own search: never shipped or shared
LOCAL_FIELDS = ("stderr_tail", "attempt", "key", "source", "provenance", "labels", "verified", "derived",
                "content_hash", "schema")


class SchemaError(ValueError):
    """A row this trainscout cannot read (a newer schema, or not an atlas row at all)."""


def content_hash(row: dict) -> str:
    """The row's content hash: SHA-256 of its canonical JSON (sorted keys, no spaces), content_hash (and any
    "_" key a reader keeps beside the row) left out."""
    body = {k: v for k, v in row.items() if k != "content_hash" and not k.startswith("_")}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), default=str, allow_nan=False)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def model_name(name: str) -> str:
    """A model as a row names it: a built-in name as is, a config.json path by its file's stem (the directory's
    name for a file called config.json), so no path of the measuring box is kept."""
    if not name or not (name.endswith(".json") or "/" in name or os.sep in name):
        return name
    stem = os.path.splitext(os.path.basename(name))[0]
    return os.path.basename(os.path.dirname(name)) if stem == "config" and os.path.dirname(name) else stem


_PATH = re.compile(r"(?<![\w.])(?:/[\w.+@-]+){2,}/?")


def scrub(text: str | None) -> str | None:
    """An error message without absolute paths and this host's name (a contribution names neither)."""
    if text is None:
        return None
    out = _PATH.sub("<path>", str(text))
    host = socket.gethostname()
    if host and len(host) > 2 and host != "localhost":
        out = re.sub(rf"(?<![\w.-]){re.escape(host)}(?![\w-])", "<host>", out)
    return out


def _scrubbed(v):
    if isinstance(v, str):
        return scrub(v)
    if isinstance(v, dict):
        return {k: _scrubbed(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_scrubbed(x) for x in v]
    return v


def shareable_record(record: dict) -> dict:
    """A record as a row carries it: without LOCAL_FIELDS, the model named without a path, every text in it without
    absolute paths and this host's name (an error, a config's _name_or_path)."""
    out = {k: _scrubbed(v) for k, v in record.items() if k not in LOCAL_FIELDS}
    out["model"] = model_name(record.get("model") or "")
    return out


def provenance_of(record: dict, *, command: str | None = None, origin: str = "local", source: str | None = None,
                  notes: list[str] | None = None, known: dict | None = None) -> dict:
    """The provenance of a record: every VERSION_FIELDS and HARDWARE_FIELDS value as recorded, "unknown" where the
    record has none (known: values documented elsewhere, named in notes); its date, command, origin and source."""
    versions, hw = record.get("versions") or {}, record.get("hardware") or {}
    known = known or {}
    prov = {}
    for f in HARDWARE_FIELDS:
        v = hw.get(f, known.get(f))
        prov[f] = v if v not in (None, "") else UNKNOWN
    if prov["gpu"] == UNKNOWN and record.get("device") == "cpu":
        prov["gpu"] = "CPU"
    for f in VERSION_FIELDS:
        v = versions.get(f, known.get(f))
        prov[f] = v if v not in (None, "") else (UNKNOWN if f not in versions else None)
    prov.update(date=record.get("started_at") or UNKNOWN, command=command or UNKNOWN, origin=origin,
                source=source or UNKNOWN, notes=list(notes or []))
    return prov


def search_command(args: dict, models_dir: str | None = None) -> str:
    """The `trainscout search` command a store's saved search arguments (trainscout_searches.args) stand for,
    without the measuring box's paths: a config.json model by its file name (under models_dir where given),
    --out by its last folder."""
    model = args.get("model") or UNKNOWN
    if model.endswith(".json"):
        model = os.path.basename(model)
        model = f"{models_dir}/{model}" if models_dir else model
    parts = ["trainscout search", f"--model {model}"]
    if args.get("gpus_per_trial", 1) != 1:
        parts.append(f"--gpus-per-trial {args['gpus_per_trial']}")
    if args.get("trials"):
        parts.append(f"--trials {args['trials']}")
    if args.get("time_budget_s"):
        parts.append(f"--time-budget {args['time_budget_s']:g}s")
    if args.get("space"):
        space = args["space"] if not os.path.isabs(args["space"]) else os.path.basename(args["space"])
        parts.append(f"--space {space}")
    for k, v in sorted((args.get("sets") or {}).items()):
        parts.append(f"--set {k}={v}")
    for k, v in sorted((args.get("recipe") or {}).items()):
        parts.append(f"--{k.replace('_', '-')} {v}")
    for flag in ("steps", "warmup", "seed"):
        if args.get(flag) is not None:
            parts.append(f"--{flag} {args[flag]}")
    if args.get("out"):
        parts.append(f"--out {os.path.basename(os.path.normpath(args['out']))}")
    return " ".join(parts)


def make_row(record: dict, key: str, provenance: dict, labels: list[dict] | None = None,
             verified: dict | None = None, derived: dict | None = None) -> dict:
    """A version-1 row (content hash included) of a stored record (a Record.to_dict())."""
    row = {"schema": SCHEMA, "key": key, "record": shareable_record(record), "provenance": provenance,
           "labels": list(labels or [])}
    if verified:
        row["verified"] = verified
    if derived:
        row["derived"] = derived
    row["content_hash"] = content_hash(row)
    return row


def migrate(d: dict, *, origin: str = "local", source: str | None = None) -> dict:
    """A row at the current schema from any older one. Schema 0 (no "schema" field: a bare record as a results
    store or an older `--export` holds it, with its key) becomes a version-1 row: provenance read from the record
    (what it lacks is "unknown"; a contributed record keeps the provenance it came with), no labels; its content
    hash is computed here. SchemaError for a row of a newer schema or one that is not an object."""
    if not isinstance(d, dict):
        raise SchemaError("not a JSON object")
    version = d.get("schema", 0)
    if not isinstance(version, int) or isinstance(version, bool) or version < 0:
        raise SchemaError(f"schema {version!r} is not a version number")
    if version > SCHEMA:
        raise SchemaError(f"schema {version} is newer than this trainscout reads ({SCHEMA}): upgrade trainscout")
    if version == 0:
        carried = d.get("provenance") if isinstance(d.get("provenance"), dict) else None
        prov = dict(carried) if carried else provenance_of(d, origin=origin, source=source)
        if carried:
            prov.setdefault("origin", origin)
        return make_row(d, d.get("key"), prov, labels=d.get("labels") if isinstance(d.get("labels"), list) else None)
    if not isinstance(d.get("record"), dict):
        raise SchemaError("no record")
    return d
