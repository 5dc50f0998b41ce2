"""Contributions that can be trusted: what `trainscout results DIR --export FILE --share` writes, and what every
import checks before a record joins a store (or a lookup, `trainscout lookup --db FILE`).

A share file holds atlas rows (store/row_format.py, schema 1): only what a measurement needs (no stderr tail,
no attempt, no source), a config.json model named by its file, paths and this host's name out of the error, the
provenance (versions, GPU, date, the search command that measured it), and a content hash per row.

The rules of an import (`results DIR --import FILE`):
- A file that cannot be read, or a line that is not a trainscout measurement at all (not JSON, no key, no model, an
  ok line without its metrics, plan and recipe, a newer schema), is refused whole: nothing is written, exit 2.
- Otherwise every record is checked on its own (`refusal`): a content hash that does not match its content;
  missing provenance (date, GPU, torch, transformers, trainscout versions, DeepSpeed's where it ran DeepSpeed), or
  provenance that contradicts the record's own hardware and versions (a CPU record under a GPU's provenance);
  physically impossible numbers (`beyond_peak`: tokens/s x the FLOPs per token predictor/flops.py counts for its model
  at its sequence length above the peak of its GPUs, trial/gpus.gpu_peak_tflops x the ranks, or above
  HOST_PEAK_FLOPS for a CPU record); implausible ones (tokens/s other than global_batch x seq_len / step_s, MFU
  above 1 under the honest count, peak memory above the GPU's); a version set that cannot run the knobs it claims
  (the knobs' own rules run with the packages its versions name and its GPU's capability; a library older than
  trainscout supports).
- Duplicates are found by the key recomputed from each record's own fields (store.schema.measurement_key, on both
  the file's side and the store's), never by the key a line claims: a forged line with a fresh key is still the
  configuration it describes. A record of a configuration already stored (or earlier in the file) is merged when
  its numbers agree within NOISE; otherwise it is a conflict, kept apart (refused with both numbers, never
  averaged in with the stored one).
- Provenance names who contributed a row and from which store (`contributor`, `source`: a share file's, set by
  `--share` from TRAINSCOUT_CONTRIBUTOR and the store's folder) and the file it was imported from (`imported_from`).
- Each refused record is printed with its reason, the rest are imported (one transaction), and the command exits 1
  when any was refused.
"""
from __future__ import annotations

import json
import math
import os
from typing import NamedTuple

from trainscout.spaces import ConfigError
from trainscout.trial.records import TOKENS_PER_S
from trainscout.trial.status import MEASURED, Status

from . import row_format
from .record_checks import SHARED, conflict, record_key, refusal
from .schema import MEASUREMENTS, METRIC_COLUMNS


class ImportReport(NamedTuple):
    """What an import did: records added, records already there (merged), and those refused: (line, key, why)."""

    added: int
    present: int
    refused: list


def malformed(rec) -> str | None:
    """What makes an imported line unusable as a measurement (None: nothing). An ok measurement must carry what
    results, export and report read from it: finite positive tokens/s and step time, the plan and the recipe."""
    if not isinstance(rec, dict):
        return "not a JSON object"
    if not isinstance(rec.get("key"), str) or not 0 < len(rec["key"]) <= 64:
        return "no key"
    if not isinstance(rec.get("source", "local"), str):
        return "source is not text"
    if not isinstance(rec.get("model"), str) or not rec["model"]:
        return "no model"
    if not isinstance(rec.get("config"), dict):
        return "config is not an object"
    if rec.get("status") not in [str(s) for s in MEASURED]:
        return f"status {rec.get('status')!r} is not one of {'|'.join(MEASURED)}"
    for name, kind in (("device", str), ("error", str), ("started_at", str), ("hardware", dict), ("plan", dict),
                       ("recipe", dict), ("metrics", dict), ("model_config", dict), ("versions", dict)):
        if rec.get(name) is not None and not isinstance(rec[name], kind):
            return f"{name} is not {'text' if kind is str else 'an object'}"
    for name in ("world_size", "grad_accum", "measured_accum", "timed_steps"):
        v = rec.get(name)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
            return f"{name} is not a positive integer"
    for name, v in (rec.get("metrics") or {}).items():
        if name in METRIC_COLUMNS and v is not None and (
                not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v < 0):
            return f"metrics.{name} is not a finite number >= 0"
    if rec["status"] == Status.OK:
        m = rec.get("metrics") or {}
        for name in (TOKENS_PER_S, "step_s"):
            if not isinstance(m.get(name), (int, float)) or isinstance(m[name], bool) or not m[name] > 0:
                return f"status ok without metrics.{name}"
        if not rec.get("plan") or not rec.get("recipe"):
            return "status ok without its plan and recipe"
        for name in ("global_batch", "seq_len", "total_steps"):
            v = rec["recipe"].get(name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                return f"recipe.{name} is not a positive integer"
    return None


def row_of_line(d) -> tuple[dict | None, str | None]:
    """(an atlas row, None) of one line of an export or share file, or (None, what is malformed). A bare record
    (schema 0, a plain --export) becomes a row by row_format.migrate; the row keeps the line as "_line"."""
    if isinstance(d, dict) and "schema" in d:
        try:
            row = row_format.migrate(d)
        except row_format.SchemaError as e:
            return None, str(e)
        problem = malformed(dict(row["record"], key=row.get("key")))
        return (None, problem) if problem else (row, None)
    problem = malformed(d)
    if problem:
        return None, problem
    try:
        return dict(row_format.migrate(d), _line=d), None
    except (row_format.SchemaError, TypeError, ValueError) as e:
        return None, str(e)


# --- reading a file, line by line ------------------------------------------------------------------------------
# A file is streamed (a small gzip can hold gigabytes of lines: docs/store.md): a line longer than MAX_LINE_BYTES,
# more than MAX_LINES lines or more than MAX_BYTES (uncompressed) are refused, far above a real export's.
MAX_LINE_BYTES = 1 << 20
MAX_LINES = 100_000
MAX_BYTES = 256 << 20


def _lines(path: str, flag: str = "--import"):
    """(line number, text) of each non-blank line of an export or share file (.gz: gzip), read one at a time;
    ConfigError (flag) for a file that cannot be read or is beyond the limits above."""
    import gzip
    import zlib
    opener = gzip.open if path.endswith(".gz") else open
    total = 0
    try:
        with opener(path, "rb") as f:
            for n in range(1, MAX_LINES + 2):
                raw = f.readline(MAX_LINE_BYTES + 1)
                if not raw:
                    return
                if n > MAX_LINES:
                    raise ConfigError(flag, f"{path} has more than {MAX_LINES:,} lines: split it (one --import per "
                                            "part) or give a file written by --export")
                if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
                    raise ConfigError(flag, f"{path} line {n} is longer than {MAX_LINE_BYTES >> 20} MiB: not a "
                                            "trainscout measurement; give a file written by --export")
                total += len(raw)
                if total > MAX_BYTES:
                    raise ConfigError(flag, f"{path} holds more than {MAX_BYTES >> 20} MiB (uncompressed) by line "
                                            f"{n}: split it (one --import per part)")
                line = raw.decode("utf-8")
                if line.strip():
                    yield n, line
    except (OSError, UnicodeDecodeError, EOFError, zlib.error) as e:
        raise ConfigError(flag, f"cannot read {path}: {e}: give a file written by --export") from None


# --- files ----------------------------------------------------------------------------------------------------
def read_rows(path: str, flag: str = "--import") -> list[tuple[int, dict]]:
    """Every line of an export or share file as an atlas row: [(line number, row)]. ConfigError (the whole file)
    for a file that cannot be read or a line that is not a measurement."""
    out = []
    for n, line in _lines(path, flag):
        try:
            d = json.loads(line)
        except ValueError:
            d = None
        row, problem = row_of_line(d) if d is not None else (None, "not JSON")
        if problem is not None:
            raise ConfigError(flag, f"{path} line {n} is not a trainscout measurement ({problem}): "
                                    "give a file written by `trainscout results DIR --export FILE`")
        out.append((n, row))
    return out


def checked(rows: list[tuple[int, dict]], known: dict[str, dict] | None = None) -> tuple[list, int, list]:
    """(accepted [(line, row)], merged, refused [(line, key, why)]) of a file's rows: each row's refusal, then
    duplicates of a key in `known` (records by key, e.g. a store's) or earlier in the file, every key recomputed from
    its record's fields (record_key) on both sides; a row keeps the key its line claims (what its own store and
    searches know it by), the recomputed one is its identity here."""
    known = {record_key(rec) or k: rec for k, rec in (known or {}).items()}  # by the recomputed key, not the stored
    accepted, refused, merged, first = [], [], 0, {}
    for n, row in rows:
        why = refusal(row)
        key = row["key"]
        ident = record_key(row["record"]) or key  # what the row is, whatever key it claims
        if why is None and ident in known:
            clash = conflict(row["record"], known[ident])
            if clash is None:
                merged += 1
                continue
            where = f"line {first[ident]} of this file" if ident in first else "the record already stored"
            why = (f"conflicting duplicate of {where} (the same configuration: the key recomputed from its fields): "
                   f"{clash}; a conflict, kept apart and never averaged in")
        if why is not None:
            refused.append((n, key, why))
            continue
        known[ident], first[ident] = row["record"], n
        accepted.append((n, row))
    return accepted, merged, refused


def apart(rows: list[dict], known: dict[str, dict]) -> tuple[list[dict], list]:
    """Rows of another layer (a store's contributed or imported records) against the records below them (known:
    by key): (the rows that agree with or are new to them, [(None, key, why)] the conflicts, kept apart). The same
    rule as an import's: the key recomputed from the records' own fields, NOISE."""
    below = {record_key(rec) or k: rec for k, rec in known.items()}
    kept, out = [], []
    for row in rows:
        ident = record_key(row["record"]) or row["key"]
        clash = conflict(row["record"], below[ident]) if ident in below else None
        if clash is None:
            kept.append(row)
        else:
            out.append(("-", row["key"], f"conflicting duplicate of a record below it (the same configuration: the key "
                                          f"recomputed from its fields): {clash}; a conflict, kept apart and never "
                                          "averaged in"))
    return kept, out


def stored_record(row: dict, path: str | None = None) -> dict:
    """The record a store keeps of a row: a plain export's line as it was (less its key and source), a share
    file's measurement with its provenance (the file it was imported from added: imported_from), labels and hash
    alongside (the record's extra keys, so a later --share passes them on)."""
    if "_line" in row:
        return {k: v for k, v in row["_line"].items() if k not in ("key", "source")}
    prov = dict(row["provenance"], imported_from=os.path.basename(path)) if path else row["provenance"]
    rec = dict(row["record"], provenance=prov, content_hash=row["content_hash"])
    if row.get("labels"):
        rec["labels"] = row["labels"]
    return rec


def origin_of(row: dict, path: str) -> str:
    """The source a store records for an imported row: contributed:FILE for a share file's, imported:FILE for a
    plain export's (or the imported:... origin it already had)."""
    name = os.path.basename(path)
    if "_line" not in row:
        return f"contributed:{name}"
    source = row["_line"].get("source") or ""
    return source if source.startswith(("imported:", "contributed:")) else f"imported:{name}"


def import_file(store, path: str) -> ImportReport:
    """Add an export or share file's records to a store under the rules of this module's docstring, the accepted
    ones in one transaction."""
    rows = read_rows(path)
    present = {r.key: r.to_dict() for r in store.measurements()}
    accepted, merged, refused = checked(rows, present)
    new = []
    for n, row in accepted:
        try:
            new.append(store._row(row["key"], stored_record(row, path), origin_of(row, path)))
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise ConfigError("--import", f"{path} line {n} is not a trainscout measurement ({type(e).__name__}: "
                                          f"{str(e)[:80]}): give a file written by `trainscout results DIR --export "
                                          "FILE`")
    if new:
        with store.engine.begin() as c:
            c.execute(MEASUREMENTS.insert(), new)
    return ImportReport(len(new), merged, refused)


# --- sharing ----------------------------------------------------------------------------------------------------
def share_rows(store) -> tuple[list[dict], dict[str, int]]:
    """The store's measurements as share rows (SHARED outcomes without an injected fault), and what was left out
    ({why: count}). A record that came with provenance (a contribution) keeps it; another gets it from its record
    and its search's saved arguments (the command)."""
    commands: dict[str, str] = {}
    for name in store.searches():
        args = store.search_args(name) or {}
        for t in store.trials(name):
            if t["key"] and t["key"] not in commands and not t["cached"]:
                commands[t["key"]] = row_format.search_command(args)
    rows, left = [], {}
    store_name = _store_name(store)
    for rec in store.measurements():
        if rec.status not in SHARED or rec.fault:
            why = "an injected fault" if rec.fault else f"status {rec.status}"
            left[why] = left.get(why, 0) + 1
            continue
        d = rec.to_dict()
        carried = d.get("provenance") if isinstance(d.get("provenance"), dict) else None
        prov = dict(carried) if carried else row_format.provenance_of(d, command=commands.get(rec.key))
        prov["origin"] = prov.get("origin") if carried else "contributed"
        prov["source"] = row_format.scrub(prov.get("source") if carried else store_name)
        if not carried:  # who contributed it: TRAINSCOUT_CONTRIBUTOR (nothing of this box is read without asking)
            prov["contributor"] = os.environ.get("TRAINSCOUT_CONTRIBUTOR") or row_format.UNKNOWN
        labels = d.get("labels") if isinstance(d.get("labels"), list) else None
        rows.append(row_format.make_row(d, rec.key, prov, labels))
    rows.sort(key=lambda r: (r["record"]["model"], r["provenance"]["date"], r["key"]))
    return rows, left


def _store_name(store) -> str:
    """The store a share row comes from, without this box's paths: a SQLite store by its folder's name (a search's
    --out), a server's by its database name."""
    url = str(getattr(store, "url", "") or "")
    if url.startswith("sqlite:"):
        path = url.split(":///", 1)[-1]
        folder = os.path.basename(os.path.dirname(path))
        return f"store {folder}/{os.path.basename(path)}" if folder else f"store {os.path.basename(path)}"
    return f"store {url.rsplit('/', 1)[-1]}" if url else row_format.UNKNOWN


def export_share(store, path: str) -> tuple[int, dict[str, int]]:
    """Write the store's share rows to path (JSON lines); (rows written, left out by why)."""
    rows, left = share_rows(store)
    try:
        with open(path, "w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, sort_keys=True, allow_nan=False) + "\n")
    except OSError as e:
        raise ConfigError("--export", f"cannot write {path}: {e.strerror}: give a writable file path")
    return len(rows), left
