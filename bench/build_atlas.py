"""Build the shipped atlas from every GPU measurement of the project's in bench/data (H200 and H100, dense models and
mixtures of experts; deterministic: the same bench/data and the same code give the same rows, and on one machine
byte-identical files; another machine's float sums may differ in their last digits, which --check allows).

    python bench/build_atlas.py            # writes atlas/records.jsonl.gz and atlas/model.json, prints what it did
    python bench/build_atlas.py --check    # rebuild in memory and fail if the shipped files differ (~30-70 s;
                                           # numbers to a relative 1e-9, everything else exactly)
    python bench/build_atlas.py --check --fast  # the records exactly, model.json by a fast path (tests/ runs it)
    python bench/build_atlas.py --table    # the leave-one-out table of the shipped files (docs/BENCHMARKS.md)

What is read: every results store (trainscout_measurements of each *.db under bench/data, opened read-only), and
every JSON line under bench/data that carries a whole trial record ("record": bench/trial_gpu.py's output; the
same trial in a store and a jsonl is kept once). What is kept: ok and oom measurements on a GPU, without an
injected fault (crash, timeout and invalid records are not measurements of the configuration). Each row's command
is the search's own (a store's trainscout_searches row: its saved arguments) or the bench command that
docs/BENCHMARKS.md gives for that folder (FOLDERS); a command not written down anywhere is "unknown". Records
measured with a method BENCHMARKS names as biased are labelled, not dropped (LABELS). Everything read and not
used is printed with the reason.

atlas/model.json holds what lookup and the atlas page need without building a model: per row the step-time
model's roofline step and the memory model's terms (predictor/steptime.py, predictor/memory.py, which build the model on
the meta device: ~1 s a row), the leave-one-out evaluation of the predictions, and the predictions for the named
models no row measured.
"""
from __future__ import annotations

import argparse
import glob
import gzip
import io
import json
import os
import sqlite3
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "bench", "data")
OUT = os.path.join(ROOT, "atlas")

# bench command per folder, from docs/BENCHMARKS.md (search stores carry their own command: their saved arguments)
FOLDERS = {
    "gpu-2026-11-30/call1": {"command": "python bench/trial_gpu.py --group memory (its flags were not kept)"},
    "gpu-2026-11-30/call2/multi": {"command": "python bench/trial_gpu.py --group multi --steps 3 --store OUT/multi"},
    "gpu-2026-11-30/call3/mem": {
        "command": "python bench/trial_gpu.py --group memory --steps 3 --parallel 2 --store OUT/mem"},
    "gpu-2026-11-30/call3/pipe": {"command": "python bench/trial_gpu.py --group pipeline --steps 3 --store OUT/pipe"},
    "gpu-2026-11-30-s4/kernels": {"command": "python bench/trial_gpu.py --group kernels --steps 3"},
    "gpu-2026-11-30-s4/layers": {"command": "python bench/trial_gpu.py --group kernels --steps 3 (session 4's "
                                            "per-layer cases; BENCHMARKS 'Compile scope')"},
    "gpu-2026-11-30-s4/multi": {
        "command": "python bench/trial_gpu.py --group multi --case zero3+ --steps 3 --store OUT/multi"},
    "gpu-2026-11-30-s5/loss": {
        "command": "python bench/trial_gpu.py --group loss --steps 3 --parallel 2 --store OUT/loss"},
    "gpu-2026-12-01-s6": {"command": "python bench/trial_gpu.py --group fp8_lce --case pythia-1b --steps 5 "
                                     "(and --case llama-1b)",
                          "known": {"torchao": "0.18.0", "liger_kernel": "0.8.5"},
                          "notes": ["torchao 0.18.0 and liger-kernel 0.8.5 from docs/BENCHMARKS.md (session 6); the "
                                    "record did not carry them"]},
    "gpu-2026-12-02-s10/search-llama-1b/handset.jsonl": {
        "command": "bash bench/search_vs_handset_gpu.sh 6m /tmp/sl (the hand-set trials after the search)"},
    "grid-h200": {"command": "bash bench/grid_gpu.sh pythia-160m bench/spaces/h200-small.yaml bench/data/grid-h200 "
                             "bench/data/grid-h200-160m.csv"},
    "gpu-2026-12-06-s25/gaps_h100.jsonl": {
        "command": "python bench/atlas_gaps_gpu.py --parts ACB --out gaps_h100.jsonl"},
    "gpu-2026-12-06-s26/gaps_h100.jsonl": {
        "command": "python bench/atlas_gaps_gpu.py --parts DC --c-models pythia-410m --out gaps_h100.jsonl"},
    "gpu-2026-12-06-s26/l3b/lookup_trials.jsonl": {
        "command": "trainscout trial --model bench/models/hub/llama-3.2-3b.json --set compile=true --set "
                   "loss_kernel=LK --set tf32=false --set compile_scope=layers --set fp8=tensorwise --set "
                   "optimizer_impl=fused --set micro_batch_size=2 --steps 3 --warmup 2 --json (LK: fused_linear, then "
                   "compiled)"},
    "gpu-2026-12-06-s26/lookup_first/trials.jsonl": {
        "command": "trainscout trial --model bench/models/hub/MODEL.json --set compile=true --set loss_kernel=compiled "
                   "--set precision=bf16 --set compile_scope=layers --set fp8=tensorwise --set micro_batch_size=MB "
                   "--steps 3 --warmup 2 --json (MODEL:MB smollm2-1.7b:16, qwen2.5-1.5b:8: lookup's first answers)"},
    "gpu-2026-12-01-s9/seed": {"notes": ["run by python bench/seed_table.py --out runs/seed-table"]},
    "gpu-2026-11-30-s4/gpus": {"notes": ["run by bench/search_scaling.sh (GPUS=1 and GPUS=2)"]},
    "gpu-2026-12-01-s7": {"notes": ["run by bench/hf_verify_gpu.sh"]},
    "gpu-2026-12-02-s10/overhead": {"notes": ["run by bench/overhead_gpu.sh"]},
}
# files under bench/data that are not records, and why they are left out
NOT_RECORDS = {
    "grid-h200-160m.csv": "the grid's table, derived from grid-h200/results.db (its rows are read there)",
    "grid-cpu-tiny.csv": "CPU measurements of the tiny test model, not an H200's",
}
PROBE_FIX = "2026-12-02"  # probe.forget_graphs (session 10): before it a probed record could run dynamic shapes


def folder_of(rel: str) -> dict:
    """FOLDERS' entry for a path under bench/data: the longest prefix that matches."""
    best = ""
    for prefix in FOLDERS:
        if rel.startswith(prefix) and len(prefix) > len(best):
            best = prefix
    return FOLDERS.get(best, {})


def _models_dir(args: dict) -> str:
    """Where bench/ keeps a searched config.json of that file name: bench/models, or its hub/ folder (the Hub's files
    as published)."""
    name = os.path.basename(str(args.get("model") or ""))
    return "bench/models/hub" if os.path.exists(os.path.join(ROOT, "bench", "models", "hub", name)) and not \
        os.path.exists(os.path.join(ROOT, "bench", "models", name)) else "bench/models"


def read_store(path: str) -> tuple[list[tuple[dict, str]], dict[str, str]]:
    """[(record dict with key, its search's command or None)] of a results store, opened read-only and immutable
    (the tracked file is never touched)."""
    from trainscout.store.row_format import search_command
    con = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
    try:
        rows = con.execute("SELECT key, record FROM trainscout_measurements ORDER BY key").fetchall()
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        by_key: dict[str, str] = {}
        if {"trainscout_searches", "trainscout_search_trials"} <= tables:
            args = {n: json.loads(a) for n, a in con.execute("SELECT name, args FROM trainscout_searches")}
            for search, key, cached in con.execute(
                    "SELECT search, key, cached FROM trainscout_search_trials WHERE key IS NOT NULL "
                    "ORDER BY cached, created_at"):
                if key not in by_key and search in args:
                    by_key[key] = search_command(args[search], models_dir=_models_dir(args[search]))
    finally:
        con.close()
    return [(dict(json.loads(r), key=k), by_key.get(k)) for k, r in rows], by_key


def verifies() -> dict[str, list[dict]]:
    """trainscout verify's results by measurement key (bench/data/**/verify*.json)."""
    out: dict[str, list[dict]] = {}
    for f in sorted(glob.glob(os.path.join(DATA, "**", "verify*.json"), recursive=True)):
        with open(f, encoding="utf-8") as fh:
            v = json.load(fh)
        if v.get("status") != "ok" or not v.get("key"):
            continue
        out.setdefault(v["key"], []).append({
            "runner": v.get("runner") or "trainscout", "steps": v.get("steps"), "ratio": v.get("ratio"),
            "global_batch": v.get("global_batch"), "file": os.path.relpath(f, ROOT)})
    return out


def labels_of(rec) -> list[dict]:
    """What docs/BENCHMARKS.md says biases a record (kept, labelled)."""
    out = []
    probe = rec.probe or []
    if rec.plan is not None and rec.plan.micro_batch_probe and rec.config.get("compile") and \
            any(s == "oom" for _, s in probe) and (rec.started_at or "") < PROBE_FIX:
        out.append({"name": "probe-dynamic-shapes",
                    "why": "micro_batch_size=max stepped down after an out-of-memory candidate before 2026-12-02: "
                           "dynamo recompiled with a symbolic batch dimension, kernels no run at that micro-batch "
                           "executes; up to ~4-6 % slow (docs/BENCHMARKS.md, session 10)"})
    return out


def collect(log) -> list[tuple[dict, dict]]:
    """Every kept record of bench/data with its folder's provenance parts: [(record dict, parts)]."""
    from trainscout.trial.records import Record
    from trainscout.trial.status import Status
    kept: dict[str, tuple[dict, dict]] = {}  # trial id -> (record, parts)
    skipped: dict[str, int] = {}

    def skip(why: str):
        skipped[why] = skipped.get(why, 0) + 1

    def consider(d: dict, rel: str, command: str | None):
        rec = Record.from_dict(d)
        if rec.status not in (Status.OK, Status.OOM):
            return skip(f"status {rec.status} (not a measurement of the configuration)")
        if rec.fault:
            return skip("an injected fault")
        if rec.device != "cuda" or not (rec.hardware or {}).get("gpu"):
            return skip("not measured on a GPU")
        if rec.trial_id in kept:
            return skip("the same trial again (a store and a bench jsonl)")
        f = folder_of(rel)
        kept[rec.trial_id] = (d, {"command": command or f.get("command"), "source": rel,
                                  "known": f.get("known", {}), "notes": f.get("notes", [])})
    for path in sorted(glob.glob(os.path.join(DATA, "**", "*.db"), recursive=True)):
        rel = os.path.relpath(path, DATA)
        rows, _ = read_store(path)
        for d, command in rows:
            consider(d, rel, command)
    from trainscout.store import measurement_key
    for path in sorted(glob.glob(os.path.join(DATA, "**", "*.jsonl"), recursive=True)):
        rel = os.path.relpath(path, DATA)
        with open(path, encoding="utf-8") as f:
            lines = [json.loads(line) for line in f if line.strip()]
        records = [x["record"] for x in lines if isinstance(x.get("record"), dict)]
        if not records:
            log(f"  not records: {rel} ({len(lines)} lines without a trial record: a bench summary)")
            continue
        for d in records:
            if "model" not in d:  # a case that never ran (its record is the error alone)
                skip("a bench case that never ran (no model, no config)")
                continue
            rec = Record.from_dict(d)
            consider(dict(d, key=measurement_key(rec, rec.hardware or {}, rec.versions or {})), rel, None)
    for name, why in NOT_RECORDS.items():
        log(f"  not records: {name} ({why})")
    for why, n in sorted(skipped.items()):
        log(f"  left out: {n} x {why}")
    return list(kept.values())


def build_rows(log) -> list[dict]:
    """The shipped rows, sorted (model, GPU, GPU count, date, key, trial)."""
    from trainscout.store import row_format
    from trainscout.trial.mfu import CONVENTION, mfu
    from trainscout.trial.records import Record
    checked = verifies()
    rows = []
    for d, parts in collect(log):
        rec = Record.from_dict(d)
        notes = list(parts["notes"])
        prov = row_format.provenance_of(d, command=parts["command"], origin="trainscout",
                                        source=f"bench/data/{parts['source']}", notes=notes, known=parts["known"])
        derived = None
        if rec.ok:
            value = mfu(rec)
            derived = {"mfu": value, "mfu_convention": CONVENTION, "mfu_recorded": rec.m.get("mfu")}
        rows.append(row_format.make_row(d, d["key"], prov, labels_of(rec), verified=checked.get(d["key"]) or None,
                                        derived=derived))
    rows.sort(key=lambda r: (r["record"]["model"], r["provenance"]["gpu"], r["record"].get("world_size") or 0,
                             r["provenance"]["date"], r["key"], r["record"]["trial_id"]))
    return rows


def gz_bytes(text: str) -> bytes:
    """gzip of text with no name and no timestamp in its header (the same input, the same bytes)."""
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0, compresslevel=9) as f:
        f.write(text.encode())
    return buf.getvalue()


SAMPLE_EVERY = 10  # --check --fast recomputes the features of every 10th ok row (the model built on the meta device)


REL = 1e-9  # numbers of a rebuild against the shipped ones: another machine sums in another order (last digits)


def difference(a, b, rel: float = REL, path: str = "") -> str | None:
    """Where two JSON values differ (a path like features/<id>/acts, "" for the top) and how; None where they are
    equal: numbers within rel of each other (an int and a float alike), everything else (keys, list lengths,
    strings, booleans, null) exactly."""
    def number(x):
        return isinstance(x, (int, float)) and not isinstance(x, bool)
    if number(a) and number(b):
        if abs(a - b) <= rel * max(abs(a), abs(b)):
            return None
        return f"{path or 'the top'}: {a!r} against {b!r}"
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return f"{path or 'the top'}: keys {sorted(set(a) ^ set(b))[:5]} in one only"
        return next((d for k in a if (d := difference(a[k], b[k], rel, f"{path}/{k}" if path else k))), None)
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return f"{path or 'the top'}: {len(a)} items against {len(b)}"
        return next((d for i, (x, y) in enumerate(zip(a, b)) if (d := difference(x, y, rel, f"{path}[{i}]"))), None)
    if type(a) is not type(b) or a != b:
        return f"{path or 'the top'}: {a!r} against {b!r}"
    return None


def _same(a, b, rel: float = REL) -> bool:
    """JSON values equal: numbers to rel, everything else exactly (difference)."""
    return difference(a, b, rel) is None


def records_differ(path: str, records: bytes) -> bool:
    """Whether the shipped records file's rows are not the rebuild's, line for line and byte for byte (its gzip
    container is not compared: another zlib compresses the same text to other bytes)."""
    if not os.path.exists(path):
        return True
    with gzip.open(path, "rb") as f:
        return f.read() != gzip.decompress(records)


def shipped_differences(out: str, records: bytes, model_text: str) -> list[str]:
    """What differs between the files in out and a rebuild (--check): the records' rows exactly (records_differ);
    model.json's values by difference (numbers to REL: its floats are sums whose last digits depend on the order
    the machine added them in, everything else exactly). Empty where they agree."""
    problems = []
    path = os.path.join(out, "records.jsonl.gz")
    if records_differ(path, records):
        problems.append(f"{path} is not a rebuild of bench/data")
    path = os.path.join(out, "model.json")
    if not os.path.exists(path):
        problems.append(f"{path} is missing")
    else:
        with open(path, encoding="utf-8") as f:
            where = difference(json.load(f), json.loads(model_text))
        if where:
            problems.append(f"{path} differs from a rebuild at {where}")
    return problems


def check_fast(rows: list[dict], records: bytes, out: str, log) -> int:
    """--check --fast (what the test suite runs, ~10 s): the records file exactly; of model.json, that its
    features cover exactly the ok rows, every SAMPLE_EVERY-th row's features recomputed equal to the shipped ones,
    and the leave-one-out (results, summaries, per GPU kind and family) recomputed from the shipped features equal
    to the shipped ones. Not checked here: the other rows' features and the predictions (the full --check does)."""
    from trainscout.atlas import predict
    from trainscout.atlas.samples import features, row_id
    from trainscout.trial.records import Record
    problems = []
    path = os.path.join(out, "records.jsonl.gz")
    if records_differ(path, records):
        problems.append(f"{path} is not a rebuild of bench/data")
    with open(os.path.join(out, "model.json"), encoding="utf-8") as f:
        shipped = json.load(f)
    feats = shipped.get("features", {})
    ok = [r for r in rows if r["record"].get("status") == "ok"]
    if set(feats) != {row_id(r) for r in ok}:
        problems.append("model.json's features are not those of the shipped ok rows")
    for row in ok[::SAMPLE_EVERY]:
        fresh = json.loads(json.dumps(features(Record.from_dict(row["record"]))))
        if not _same(fresh, feats.get(row_id(row))):
            problems.append(f"model.json's features of {row_id(row)} ({row['record']['model']}) differ from "
                            f"a recount: {fresh} against {feats.get(row_id(row))}")
            break
    model = json.loads(json.dumps(predict.build_model(rows, log=log, feats=feats, predict=False)))
    for part in ("loo", "loo_summary", "loo_by"):
        if not _same(model[part], shipped.get(part)):
            problems.append(f"model.json's {part} is not what the shipped features give")
    print("; ".join(problems) if problems else "the shipped atlas is up to date (records exactly; model.json's "
          f"features sampled 1 in {SAMPLE_EVERY} and its leave-one-out recomputed)")
    return 1 if problems else 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true",
                   help="rebuild and compare with the shipped files; exit 1 if they differ")
    p.add_argument("--out", default=OUT, help="folder to write records.jsonl.gz and model.json into")
    p.add_argument("--table", action="store_true", help="print the shipped model.json's leave-one-out table only")
    p.add_argument("--fast", action="store_true",
                   help="with --check: the records exactly; model.json by a fast path (check_fast)")
    a = p.parse_args(argv)
    if a.table:
        from trainscout.atlas import db
        from trainscout.atlas.loo import loo_table, loo_table_by
        print(loo_table(db.shipped_model()))
        print()
        print(loo_table_by(db.shipped_model()))
        return 0
    from trainscout.atlas import predict
    from trainscout.atlas.loo import loo_table, loo_table_by
    t0 = time.time()

    def log(s):
        print(s, file=sys.stderr)
    rows = build_rows(log)
    records = gz_bytes("".join(json.dumps(r, sort_keys=True, allow_nan=False) + "\n" for r in rows))
    if a.check and a.fast:
        return check_fast(rows, records, a.out, log)
    model = predict.build_model(rows, log=log)
    model_text = json.dumps(model, sort_keys=True, indent=1, allow_nan=False) + "\n"
    paths = {os.path.join(a.out, "records.jsonl.gz"): records, os.path.join(a.out, "model.json"): model_text.encode()}
    if a.check:
        differ = shipped_differences(a.out, records, model_text)
        print("differ: " + "; ".join(differ) if differ else "the shipped atlas is up to date (records exactly; "
              f"model.json's numbers to a relative {REL:g}, the rest exactly)")
        return 1 if differ else 0
    os.makedirs(a.out, exist_ok=True)
    for path, data in paths.items():
        with open(path, "wb") as f:
            f.write(data)
    n_ok = sum(1 for r in rows if r["record"]["status"] == "ok")
    print(f"atlas: {len(rows)} rows ({n_ok} ok, {len(rows) - n_ok} oom) from bench/data, "
          f"{sum(1 for r in rows if r['labels'])} labelled; {len(records):,} bytes; model.json {len(model_text):,} "
          f"bytes; {time.time() - t0:.0f} s")
    print(loo_table(model))
    print()
    print(loo_table_by(model))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, ROOT) if ROOT not in sys.path else None
    sys.exit(main())
