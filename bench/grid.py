"""Record the full grid of a space: every combination of its knobs' values, each measured as a real trainscout trial.

The grid is the Cartesian product of the space's values (the seed paper's search) plus every configuration the
define-by-run sampler can propose (ours: a knob whose requirements do not hold keeps its default), one row per
effective configuration. A combination trainscout refuses (trial.prepare raising ConfigError) is a row with status
invalid and 0 GPU-seconds. Every valid one is measured one at a time through trial.execute and kept in a results
store (--store) under the search's own measurement key, so a rerun answers what is already measured from the store:
the recording is resumable, and a search store can seed it. Crash and timeout are measured again, as in a search.

The CSV (--csv) starts with one comment line, "# trainscout-grid {JSON}": model, device, workers, steps, recipe,
hardware, optional packages installed and the space (bench/replay.py rebuilds the sampler's space from it). It is
rewritten after every trial (a row not measured yet has status "valid"). One row per configuration: every
knob, grid/sampler (which enumeration reached it), status, tokens_per_s, step_tokens_per_s (each timed step's
throughput, slowest rank, ";"-separated: what early stopping sees), wall_s, timed_s (the timed steps), gpu_s
(wall x GPUs per trial; on the CPU: x worker processes), peak_memory_gib, predicted_gib (predictor.memory.predict,
uncalibrated: what a search on an empty store prunes with), key, error.

    python bench/grid.py --model tiny --device cpu --workers 2 --steps 3 --warmup 1 \\
        --space bench/spaces/cpu-grid.yaml --store runs/grid-cpu --csv bench/data/grid-cpu-tiny.csv
    python bench/grid.py --model pythia-160m --space bench/spaces/h200-small.yaml --store /tmp/g160 \\
        --csv $OUT/grid-h200-160m.csv --dry-run      # count and check the combinations first
"""
from __future__ import annotations

import argparse
import csv
import itertools
import json
import os
import sys
import time

from trainscout.cli.flags import (EXIT_BAD_INPUT, Parser, add_recipe_flags, nonneg_float, parse_sets, positive_int,
                                 recipe_kwargs)
from trainscout.search.service import SearchArgs, validate
from trainscout.spaces import ConfigError, all_knobs, fmt
from trainscout.store import default_url, measurement_key, now, open_store
from trainscout.predictor import memory
from trainscout.trial import execute, hardware, prepare
from trainscout.trial.status import DETERMINISTIC, Status

META = "# trainscout-grid "
COLUMNS = ["grid", "sampler", "status", "tokens_per_s", "step_tokens_per_s", "wall_s", "timed_s", "gpu_s",
           "peak_memory_gib", "predicted_gib", "key", "error"]


def product(space) -> list[dict]:
    """The seed paper's grid: every combination of the knobs' values (a fixed knob has one)."""
    names = [k.name for k in all_knobs()]
    values = [(space.fixed[n],) if n in space.fixed else space.domains[n] for n in names]
    return [dict(zip(names, combo)) for combo in itertools.product(*values)]


class _Branch(Exception):
    def __init__(self, name, choices):
        self.name, self.choices = name, choices


class _Walk:
    """Stands in for an Optuna trial: answers the choices made so far, branches at the first knob not made."""

    def __init__(self, chosen: dict):
        self.chosen = chosen

    def suggest_categorical(self, name, choices):
        if name in self.chosen:
            return self.chosen[name]
        raise _Branch(name, choices)


def reachable(space) -> list[dict]:
    """Every configuration search.space.Space.sample can return."""
    out, todo = [], [{}]
    while todo:
        chosen = todo.pop(0)
        try:
            out.append(space.sample(_Walk(chosen)))
        except _Branch as b:
            todo += [dict(chosen, **{b.name: c}) for c in b.choices]
    return out


def enumerate_rows(space, model: str, hw: dict, kw: dict) -> list[dict]:
    """One row per effective configuration (valid: its measurement key; invalid: its combination), both sources."""
    versions, rows, index = hardware.versions(), [], {}
    for source, combos in (("grid", product(space)), ("sampler", reachable(space))):
        for combo in combos:
            try:
                spec = prepare(model, combo, **kw)
                ident = measurement_key(spec, hw, versions)
                row = {"config": spec.config, "spec": spec, "key": ident, "status": "valid",
                       "predicted_gib": memory.predict(spec) / memory.GiB}
            except ConfigError as e:
                ident = ("invalid", *map(fmt, combo.values()))
                row = {"config": combo, "status": Status.INVALID, "error": str(e), "gpu_s": 0.0}
            if ident not in index:
                index[ident] = dict(row, grid=0, sampler=0)
                rows.append(index[ident])
            index[ident][source] = 1
    return rows


def measure(row: dict, store, a, trials_dir: str) -> str:
    """Fill a valid row from the store or a new trial; returns how ("stored" or "measured")."""
    record, how = store.get(row["key"]), "stored"
    if record is None or record.status not in DETERMINISTIC:
        record, how = execute(row["spec"], timeout=a.timeout, storage=trials_dir, address=a.address), "measured"
        store.add_measurement(row["key"], record)
    fill(row, record, a)
    return how


def fill(row: dict, record, a) -> None:
    m, tokens = record.m, row["spec"].tokens_per_step
    row.update(status=record.status, error=record.error, tokens_per_s=m.get("tokens_per_s"),
               step_tokens_per_s=";".join(f"{tokens / s:.1f}" for s in m.get("steps_s", [])),
               wall_s=record.wall_s, timed_s=m.get("timed_s"), peak_memory_gib=m.get("peak_memory_gib"),
               gpu_s=(record.wall_s or 0.0) * a.gpus_per_trial)


def write_csv(path: str, meta: dict, rows: list[dict]) -> None:
    names = [k.name for k in all_knobs()]
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w", newline="", encoding="utf-8") as f:
            f.write(META + json.dumps(meta, sort_keys=True) + "\n")
            w = csv.writer(f)
            w.writerow(names + COLUMNS)
            for r in rows:
                cells = [fmt(r["config"][n]) for n in names] + [_cell(r.get(c)) for c in COLUMNS]
                w.writerow(cells)
    except OSError as e:
        raise ConfigError("--csv", f"cannot write {path}: {e.strerror}: give a writable file path")


def _cell(v) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.6g}" if abs(v) < 1e6 else f"{v:.1f}"
    return (str(v).splitlines() or [""])[0][:300] if isinstance(v, str) else str(v)


def record_grid(a) -> int:
    t0 = time.perf_counter()
    recipe = {k: v for k, v in recipe_kwargs(a).items() if v is not None}
    args = SearchArgs(model=a.model, out=a.store, device=a.device, gpus_per_trial=a.gpus_per_trial, trials=1,
                      space=a.space, sets=parse_sets(a.set), steps=a.steps, warmup=a.warmup, recipe=recipe)
    space, _, hw = validate(args)  # the search's own checks and space (space file, --set, what can run here)
    size = 1
    for vals in space.domains.values():
        size *= len(vals)
    if size > a.max_combinations:
        raise ConfigError("--space", f"the grid has {size:,} combinations (more than --max-combinations "
                                     f"{a.max_combinations:,}): narrow it with --space or --set")
    kw = dict(workers=a.gpus_per_trial, steps=a.steps, warmup=a.warmup, hw=hw, seed=a.seed, **recipe)
    rows = enumerate_rows(space, a.model, hw, kw)
    valid = [r for r in rows if r["status"] != Status.INVALID]
    searched = [k for k, vs in space.domains.items() if len(vs) > 1]
    print(f"grid of {a.model} on {hw.get('gpu') or hw['cpu']} ({hw['device']}) x{a.gpus_per_trial}: "
          f"{sum(r['grid'] for r in rows)} combinations + {sum(not r['grid'] for r in rows)} more the sampler can "
          f"propose; {len(valid)} valid, {len(rows) - len(valid)} invalid; searched: {', '.join(searched)}", flush=True)
    measured = 0
    if not a.dry_run:
        os.makedirs(a.store, exist_ok=True)
        store = open_store(default_url(a.store))
        trials_dir = os.path.abspath(os.path.join(a.store, "trials"))
        meta = {"model": a.model, "device": hw["device"], "workers": a.gpus_per_trial, "steps": a.steps,
                "warmup": a.warmup, "seed": a.seed, "recipe": recipe, "hardware": hw, "space": space.describe(),
                "installed": sorted(hardware.installed_optional()), "versions": hardware.versions(),
                "recorded_at": now()}
        for i, r in enumerate(valid, 1):
            if a.stored_only or (i - 1) % a.shard[1] != a.shard[0]:  # another shard's row: shown once stored
                record = store.get(r["key"])
                if record is not None:
                    fill(r, record, a)
                continue
            how = measure(r, store, a, trials_dir)
            measured += how == "measured"
            write_csv(a.csv, meta, rows)  # after every row: a recording cut short leaves what it measured
            print(f"[{i}/{len(valid)}] {how:8} {r['status']:7} {r.get('tokens_per_s') or 0:>12,.0f} tok/s "
                  f"{r['gpu_s']:7.1f} GPU-s  " + " ".join(f"{k}={fmt(r['config'][k])}" for k in searched), flush=True)
        store.checkpoint()
        write_csv(a.csv, meta, rows)
    print_table(rows, searched, measured, time.perf_counter() - t0, None if a.dry_run else a.csv)
    return 0


def print_table(rows: list[dict], searched: list[str], measured: int, wall: float, csv_path: str | None) -> None:
    ok = [r for r in rows if r["status"] == Status.OK]
    total = sum(r.get("gpu_s") or 0.0 for r in rows if r["grid"])
    best = max(ok, key=lambda r: r["tokens_per_s"], default=None)
    by_status = {s: sum(r["status"] == s for r in rows) for s in dict.fromkeys(r["status"] for r in rows)}
    print(f"\n{len(rows)} configurations: " + ", ".join(f"{n} {s}" for s, n in by_status.items()) +
          f"; {measured} measured now; grid total {total:,.1f} GPU-seconds (CPU: worker-seconds); "
          f"best {best['tokens_per_s'] if best else 0:,.0f} tokens/s; wall {wall:.0f} s" +
          (f"; CSV {csv_path}" if csv_path else " (dry run: nothing measured)"))
    order = sorted(rows, key=lambda r: (r["status"] != Status.OK, -(r.get("tokens_per_s") or 0)))
    print(f"{'status':8} {'tokens/s':>10} {'GPU-s':>7} {'peak GiB':>8} {'pred GiB':>8}  " + "  ".join(searched))
    for r in order:
        pred = r.get("predicted_gib")
        print(f"{r['status']:8} {r.get('tokens_per_s') or 0:>10,.0f} {r.get('gpu_s') or 0:>7.1f} "
              f"{r.get('peak_memory_gib') or 0:>8.2f} {pred if pred is not None else 0:>8.2f}  " +
              "  ".join(fmt(r["config"][k]) for k in searched))


def shard(text: str) -> tuple[int, int]:
    k, _, n = text.partition("/")
    if not (k.isdigit() and n.isdigit() and 0 <= int(k) < int(n)):
        raise argparse.ArgumentTypeError(f"--shard {text}: write K/N with 0 <= K < N, e.g. 0/2 and 1/2")
    return int(k), int(n)


def build_parser() -> Parser:
    p = Parser(prog="bench/grid.py", description=__doc__.split("\n\n")[0],
               formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--model", required=True, help="pythia-14m ... pythia-12b, tiny, or a config.json path")
    p.add_argument("--space", default=None, help="YAML space file (as for trainscout search)")
    p.add_argument("--set", action="append", metavar="KNOB=VALUE", help="fix a knob (repeatable)")
    p.add_argument("--device", default="auto", help="auto, cpu or cuda")
    p.add_argument("--gpus-per-trial", "--workers", dest="gpus_per_trial", type=positive_int("--gpus-per-trial"),
                   default=1, help="ranks per trial: GPUs (on the CPU: worker processes)")
    p.add_argument("--steps", type=positive_int("--steps"), default=5, help="timed optimizer steps per trial")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps per trial")
    p.add_argument("--timeout", type=nonneg_float("--timeout"), default=None, help="hard limit per trial in seconds")
    p.add_argument("--seed", type=int, default=0, help="seed of the trials (as a search's --seed)")
    p.add_argument("--address", default=None, help="Ray cluster address (default: start Ray on 127.0.0.1)")
    p.add_argument("--store", default="runs/grid", help="results store folder (results.db): a rerun resumes from it")
    p.add_argument("--csv", required=True, help="the CSV to write")
    p.add_argument("--max-combinations", type=positive_int("--max-combinations"), default=2000,
                   help="refuse a larger grid (narrow the space instead)")
    p.add_argument("--shard", type=shard, default=(0, 1), metavar="K/N",
                   help="measure only every N-th valid row from the K-th (0-based): N processes with one --store "
                        "(each its own local Ray and GPU, as bench/grid_gpu.sh runs them) fill a grid N trials at a "
                        "time, each writing its own --csv; --stored-only then writes the whole CSV from the store")
    p.add_argument("--stored-only", action="store_true",
                   help="measure nothing: write the CSV from what --store holds (rows not in it stay \"valid\")")
    p.add_argument("--dry-run", action="store_true", help="enumerate and check the combinations, measure nothing")
    add_recipe_flags(p)
    return p


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    try:
        return record_grid(build_parser().parse_args(argv))
    except ConfigError as e:
        print(f"grid: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
