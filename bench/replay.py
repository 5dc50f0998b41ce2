"""Replay trainscout's search against a recorded grid (bench/grid.py): the GPU-seconds it spends until a trial
within --tolerance of the grid's best has run in full, over many sampler seeds, as a fraction of the grid's total.

What runs is the search's own machinery, one trial at a time: a Ray Tune Tuner with the search's searcher
(search.service.make_searcher: a repeated draw replaced by an unmeasured one, the ranked proposals of make_ranker
first) over search.space.Space.sample (the space recorded in the CSV), make_sampler, make_scheduler (ASHA), the
start points (where they apply: a GPU grid; start_points as first_points orders them) and search.trainable.tune_trial
itself - invalid and pruned outcomes reported as 0, a configuration already measured answered from a results store
(a fresh one per seed), ASHA fed each timed step - with one substitution: trial.execute plays back the recorded
row (its timed steps' throughputs, then its record) instead of launching workers. Charges: a trial that ran in full
costs its recorded GPU-seconds; one ASHA stopped after k of n timed steps costs its start-up, build and warm-up in
full plus k/n of its timed steps; invalid, pruned and store-answered trials cost nothing, and so does a
configuration ASHA stopped when proposed again (the search answers it with the stopped value). "best stopped":
trials of a configuration within --tolerance that ASHA stopped.

    python bench/replay.py --csv bench/data/grid-cpu-tiny.csv --seeds 20
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import random
import statistics
import sys
import tempfile
import time

from trainscout.cli.flags import EXIT_BAD_INPUT, Parser, parse_sets, positive_int
from trainscout.search.driver import progress_callback
from trainscout.search.service import (METRIC, Printer, SearchArgs, first_points, make_ranker, make_sampler,
                                       make_scheduler, make_searcher, space_knobs, start_points)
from trainscout.search.trainable import tune_trial
from trainscout.search.space import Space
from trainscout.spaces import ConfigError, all_knobs, fmt, get
from trainscout.store import default_url
from trainscout.predictor import memory
from trainscout.trial import STATUSES, hardware, prepare
from trainscout.trial.records import Record
from trainscout.trial.status import Status

META = "# trainscout-grid "


LATE: set[str] = set()  # the knobs the last grid loaded predates (config_id leaves them out)


def load_grid(path: str) -> tuple[dict, list[dict], dict]:
    """(meta, rows, knobs registered since: held at their defaults) of a CSV written by bench/grid.py."""
    try:
        with open(path, encoding="utf-8", newline="") as f:
            first = f.readline()
            if not first.startswith(META):
                raise ConfigError("--csv", f"{path} does not start with '{META.strip()} {{...}}': give a CSV "
                                           "written by bench/grid.py")
            meta = json.loads(first[len(META):])
            rows = list(csv.DictReader(f))
    except OSError as e:
        raise ConfigError("--csv", f"cannot read {path}: {e.strerror}: give a CSV written by bench/grid.py")
    except (UnicodeDecodeError, ValueError, csv.Error) as e:
        raise ConfigError("--csv", f"{path} is not a grid CSV ({type(e).__name__}): give a CSV written by "
                                   "bench/grid.py")
    missing = [c for c in ("grid", "status", "tokens_per_s", "step_tokens_per_s", "wall_s", "timed_s", "gpu_s")
               if rows and c not in rows[0]]
    if missing or not isinstance(meta, dict) or not rows:
        raise ConfigError("--csv", f"{path} lacks {', '.join(missing) or 'rows'}: give a CSV written by bench/grid.py")
    # a knob registered after the recording: its trials ran what its default runs
    late = [k for k in all_knobs() if k.name not in rows[0]]
    try:
        for r in rows:
            r.update({k.name: fmt(k.default) for k in late})
            if r["status"] not in (*STATUSES, "valid"):  # valid: not measured yet
                raise ValueError(r["status"])
            r["grid"] = r["grid"] == "1"
            for c in ("tokens_per_s", "wall_s", "timed_s", "gpu_s"):
                r[c] = float(r[c]) if r[c] else 0.0
            r["steps"] = [float(v) for v in r["step_tokens_per_s"].split(";") if v]
    except ValueError as e:
        raise ConfigError("--csv", f"{path}: a row has a bad value ({e}): give a CSV written by bench/grid.py")
    if not any(r["status"] == Status.OK and r["grid"] for r in rows):
        raise ConfigError("--csv", f"{path} has no measured (ok) grid row: nothing to find")
    LATE.clear()
    LATE.update(k.name for k in late)
    return meta, rows, {k.name: k.default for k in late}


def shuffled_grid(grid: list[dict], target: float, seed: int) -> float:
    """No search, for comparison: the grid's rows measured in a random order until one reaches the target."""
    order = list(grid)
    random.Random(seed).shuffle(order)
    spent = 0.0
    for r in order:
        spent += r["gpu_s"]
        if r["status"] == Status.OK and r["tokens_per_s"] >= target:
            break
    return spent


def config_id(cfg: dict, skip=()) -> tuple:
    """A configuration's identity among a grid's rows; skip: knobs registered after the recording (held at their
    defaults there, and a default such as optimizer_impl=auto is concretised by prepare into what it runs)."""
    return tuple(fmt(cfg[k.name]) for k in all_knobs() if k.name not in skip)


def as_recorded(meta: dict) -> None:
    """Check configurations against the recorded box's optional packages (e.g. flash-attn), not this one's."""
    hardware.installed_optional = lambda: frozenset(meta.get("installed", ()))


def played(row: dict, spec, on_step) -> Record:
    """The recorded trial: each timed step's throughput reported as measured, then its record."""
    tokens = spec.tokens_per_step
    for i, v in enumerate(row["steps"], 1):
        on_step({"step": i, "step_s": tokens / v, "tokens_per_s": v})
    ok = row["status"] == Status.OK
    return Record(model=spec.model, config=spec.config, device=spec.device, world_size=spec.world_size,
                  hardware=spec.hardware, status=row["status"], error=row.get("error") or None,
                  wall_s=row["wall_s"], metrics={METRIC: row["tokens_per_s"]} if ok else None)


def _replay_trainable(config: dict, base: dict, meta: dict, rows: dict) -> None:
    """search.trainable.tune_trial with trial.execute replaced by the recorded row of the configuration."""
    from trainscout.search import trainable
    as_recorded(meta)

    def execute(spec, on_step=None, **_):
        row = rows.get(config_id(spec.config, LATE))
        if row is None:
            raise LookupError("not in the grid: " + " ".join(f"{k}={fmt(v)}" for k, v in spec.config.items()))
        return played(row, spec, on_step)
    trainable.execute = execute
    tune_trial(config, base)


def ledger_classes():
    from ray.tune import Callback
    from ray.tune.stopper import Stopper

    class Ledger(Callback):
        """Charges each finished trial (in the driver) until a near-best trial ran in full or the budget is spent."""

        def __init__(self, charge, target: float, budget: float, searched: list[str]):
            self.charge, self.target, self.budget, self.searched = charge, target, budget, searched
            self.spent, self.n, self.counts, self.done, self.found, self.error = 0.0, 0, {}, False, None, None
            self.stopped = set()  # configurations ASHA stopped: proposed again, the search answers them (0 s)
            self.near_best_stopped, self.log = 0, []

        def on_trial_complete(self, iteration, trials, trial, **info):
            if self.done:
                return
            r = trial.last_result or {}
            kind = (Status.STOPPED if r.get("status") == Status.RUNNING
                    else "stored" if r.get("cached") else r.get("status"))
            self.n += 1
            cost, row = self.charge(trial.config, r, kind)
            self.spent += cost
            if kind == Status.STOPPED:
                ident = tuple(sorted((k, fmt(v)) for k, v in trial.config.items()))
                kind = "stopped again" if ident in self.stopped else kind
                self.stopped.add(ident)
                self.near_best_stopped += row["tokens_per_s"] >= self.target  # ASHA ended what the replay looks for
            self.counts[kind] = self.counts.get(kind, 0) + 1
            self.log.append({"kind": kind, METRIC: r.get(METRIC), "steps": r.get("training_iteration"), "gpu_s": cost,
                             "config": " ".join(f"{k}={fmt(trial.config[k])}" for k in self.searched)})
            if kind == Status.OK and r[METRIC] >= self.target:
                self.found, self.done = r[METRIC], True
            self.done = self.done or self.spent >= self.budget

        def on_trial_error(self, iteration, trials, trial, **info):
            self.error, self.done = f"trial {trial.trial_id} failed ({trial.config})", True

    class Done(Stopper):
        def __init__(self, ledger):
            self.ledger = ledger

        def __call__(self, trial_id, result):
            return False

        def stop_all(self):
            return self.ledger.done

    return Ledger, Done


def replay_seed(seed: int, meta: dict, space: Space, rows: dict, a, tmp: str, target: float, budget_s: float) -> dict:
    from ray import tune
    hw, workers, steps = meta["hardware"], meta["workers"], meta["steps"]
    kw = dict(workers=workers, steps=steps, warmup=meta["warmup"], hw=hw, seed=meta["seed"], **meta["recipe"])
    base = {"model": meta["model"], "workers": workers, "steps": steps, "warmup": meta["warmup"], "hardware": hw,
            "seed": meta["seed"], "recipe": meta["recipe"], "storage": default_url(os.path.join(tmp, f"seed{seed}")),
            "search": f"replay-{seed}", "timeout": None, "address": None, "max_failures": 0, "faults": {}, "offset": 0,
            "trial_dir": tmp, "knob_names": list(space_knobs())}
    if hw["device"] == "cuda" and hw.get("gpu_memory_gib"):  # the search's pruning, uncalibrated as on an empty store
        base["memory"] = {"capacity": hw["gpu_memory_gib"] * memory.GiB, "calibration": None}
    os.makedirs(os.path.join(tmp, f"seed{seed}"), exist_ok=True)

    def charge(config: dict, r: dict, kind: str) -> tuple[float, dict | None]:
        """(GPU-seconds, recorded row) of a finished trial."""
        if kind in (Status.INVALID, Status.PRUNED, "stored"):
            return 0.0, None
        settings = {k: v for k, v in config.items() if k in base["knob_names"]}
        row = rows[config_id(prepare(meta["model"], settings, **kw).config, LATE)]
        if kind != Status.STOPPED or not row["wall_s"]:  # ran in full (ok, oom, crash, timeout)
            return row["gpu_s"], row
        ran = min(1.0, r.get("training_iteration", 0) / max(1, len(row["steps"])))
        return row["gpu_s"] * (1 - row["timed_s"] / row["wall_s"] * (1 - ran)), row

    args = SearchArgs(model=meta["model"], out=tmp, gpus_per_trial=workers, recipe=meta["recipe"])
    ranker = make_ranker(args, space, hw, None, seed=seed)  # as _search builds them, on an empty store
    start = first_points(start_points(args, space, hw, None), ranker)
    Ledger, Done = ledger_classes()
    ledger = Ledger(charge, target, budget_s, [k for k, vs in space.domains.items() if len(vs) > 1])
    import optuna
    searcher = make_searcher(space, f"replay-{seed}", optuna.storages.InMemoryStorage(), make_sampler(seed, a.trials),
                             start, seed=seed, ranker=ranker)
    # the search's own callback: it records the trials ASHA stopped, which a later proposal of theirs is answered from
    progress = progress_callback(base["storage"], base["search"], Printer(space, open(os.devnull, "w")))
    t0 = time.perf_counter()
    tune.Tuner(
        tune.with_resources(tune.with_parameters(_replay_trainable, base=base, meta=meta, rows=rows), {"CPU": 1}),
        tune_config=tune.TuneConfig(search_alg=searcher, scheduler=make_scheduler(steps), num_samples=a.max_trials,
                                    max_concurrent_trials=1, reuse_actors=True),  # as the search (driver.py)
        run_config=tune.RunConfig(name=f"replay-{seed}", storage_path=os.path.join(tmp, "tune"), verbose=0,
                                  stop=Done(ledger), callbacks=[progress, ledger],
                                  failure_config=tune.FailureConfig(max_failures=0))).fit()
    if ledger.error:
        raise ConfigError("--csv", f"replay seed {seed}: {ledger.error}: record the grid of this space with "
                                   "bench/grid.py")
    return {"seed": seed, "found": ledger.found is not None, "tokens_per_s": ledger.found, "trials": ledger.n,
            "counts": ledger.counts, "near_best_stopped": ledger.near_best_stopped, "gpu_s": ledger.spent,
            "wall_s": time.perf_counter() - t0, "trials_log": ledger.log}


def run(a) -> int:
    if not 0 <= a.tolerance < 1:
        raise ConfigError("--tolerance", f"--tolerance {a.tolerance} is not allowed: give a fraction in [0, 1), e.g. "
                                         "0.03")
    if not a.budget > 0:
        raise ConfigError("--budget", f"--budget {a.budget} is not allowed: give a multiple of the grid's total "
                                      "GPU-seconds > 0 (1 = the grid's)")
    if a.json and not os.path.isdir(os.path.dirname(os.path.abspath(a.json))):
        raise ConfigError("--json", f"--json {a.json}: its folder does not exist: give a path in an existing folder")
    meta, table, late = load_grid(a.csv)
    as_recorded(meta)
    missing = [k for k in ("model", "hardware", "workers", "steps", "warmup", "seed", "recipe", "space")
               if k not in meta]
    if missing:
        raise ConfigError("--csv", f"{a.csv}: its '{META.strip()}' line lacks {', '.join(missing)}: "
                                   "record it with bench/grid.py")
    try:  # the space the grid was recorded over, as the search built it
        fixed = {**late, **{k: get(k).parse(v) for k, v in meta["space"]["fixed"].items()}}
        searched = {k: tuple(get(k).parse(v) for v in vs) for k, vs in meta["space"]["searched"].items()}
    except (KeyError, TypeError, AttributeError, ConfigError) as e:
        raise ConfigError("--csv", f"{a.csv}: cannot rebuild its space here ({e}): record the grid again with "
                                   "bench/grid.py")
    for name, value in parse_sets(a.set).items():  # --set: the part of the grid where a searched knob has one value
        if name not in searched:
            raise ConfigError("--set", f"--set {name}: not a searched knob of this grid: choose one of "
                                       f"{', '.join(searched) or '(none)'}")
        value = get(name).parse(value)
        if value not in searched[name]:
            raise ConfigError("--set", f"--set {name}={fmt(value)}: the grid has {name} in "
                                       f"{'|'.join(map(fmt, searched[name]))}: choose one of those")
        fixed[name] = value
        del searched[name]
        table = [r for r in table if r[name] == fmt(value)]
    pending = sum(r["status"] == "valid" for r in table)
    if pending:
        raise ConfigError("--csv", f"{a.csv}: {pending} rows are not measured yet: finish the recording (run "
                                   "bench/grid.py again with the same --store) or replay a measured part with --set")
    if not any(r["status"] == Status.OK and r["grid"] for r in table):
        raise ConfigError("--set", f"{a.csv}: no measured (ok) grid row has {' and '.join(a.set)}: nothing to find")
    space = Space(fixed, searched)
    rows = {config_id(r, LATE): r for r in table if r["status"] != Status.INVALID}
    grid = [r for r in table if r["grid"]]
    total = sum(r["gpu_s"] for r in grid)
    best = max(r["tokens_per_s"] for r in grid if r["status"] == Status.OK)
    target = (1 - a.tolerance) * best
    near = sum(r["status"] == Status.OK and r["tokens_per_s"] >= target for r in grid)
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    import optuna

    from trainscout.trial.ray_cluster import ensure_ray
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    ensure_ray()
    t0 = time.perf_counter()
    results = []
    print(f"replay of {a.csv}: {meta['model']} on {meta['hardware'].get('gpu') or meta['hardware']['cpu']} "
          f"x{meta['workers']}, {len(grid)} grid rows ({sum(r['status'] != 'invalid' for r in grid)} valid), "
          f"grid total {total:,.1f} GPU-s, best {best:,.0f} tokens/s, {near} row(s) within {a.tolerance:.0%}" +
          (f"; knobs registered since the recording, held at their defaults: {', '.join(late)}" if late else ""))
    print(f"{'seed':>4} {'found':>5} {'trials':>6} {'GPU-s':>9} {'of grid':>8} {'wall s':>7} {'best stopped':>12}  "
          "trials by outcome", flush=True)
    with tempfile.TemporaryDirectory(prefix="trainscout-replay-") as tmp:
        for seed in range(a.seeds):
            r = replay_seed(seed, meta, space, rows, a, tmp, target, a.budget * total)
            r["fraction"] = r["gpu_s"] / total
            results.append(r)
            print(f"{seed:>4} {'yes' if r['found'] else 'NO':>5} {r['trials']:>6} {r['gpu_s']:>9,.1f} "
                  f"{r['fraction']:>8.1%} {r['wall_s']:>7.1f} {r['near_best_stopped']:>12}  " +
                  ", ".join(f"{n} {k}" for k, n in sorted(r["counts"].items())), flush=True)
    wall = time.perf_counter() - t0
    shuffled = [shuffled_grid(grid, target, seed) / total for seed in range(a.seeds)]
    if a.json:
        try:
            with open(a.json, "w", encoding="utf-8") as f:
                json.dump({"csv": a.csv, "tolerance": a.tolerance, "grid_gpu_s": total, "best_tokens_per_s": best,
                           "seeds": results, "shuffled_grid_fractions": shuffled, "wall_s": wall}, f, indent=1)
        except OSError as e:
            raise ConfigError("--json", f"cannot write {a.json}: {e.strerror}: give a writable file path")
    fr = [r["fraction"] if r["found"] else float("inf") for r in results]  # a seed that never got there: worst

    def pct(f):
        return f"{f:.1%}" if f != float("inf") else "not found"
    print(f"\n| grid | valid configs | grid GPU-s | seeds | found within {a.tolerance:.0%} | median of grid | "
          f"worst | median trials | seeds where ASHA stopped a near-best trial | grid in random order: median, worst | "
          "replay wall |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    print(f"| {os.path.basename(a.csv)} | {len(rows)} | {total:,.0f} | {a.seeds} | {sum(r['found'] for r in results)}/"
          f"{a.seeds} | {pct(statistics.median(fr))} | {pct(max(fr))} | "
          f"{statistics.median(r['trials'] for r in results):g} | {sum(r['near_best_stopped'] > 0 for r in results)} | "
          f"{pct(statistics.median(shuffled))}, "
          f"{pct(max(shuffled))} | {wall:.0f} s |")
    return 0


def build_parser() -> Parser:
    p = Parser(prog="bench/replay.py", description=__doc__.split("\n\n")[0],
               formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--csv", required=True, help="a grid recorded by bench/grid.py")
    p.add_argument("--seeds", type=positive_int("--seeds"), default=20, help="sampler seeds 0..N-1")
    p.add_argument("--tolerance", type=float, default=0.03, help="within this fraction of the grid's best tokens/s")
    p.add_argument("--budget", type=float, default=1.0,
                   help="give up a seed once it has spent this multiple of the grid's total GPU-seconds")
    p.add_argument("--max-trials", type=positive_int("--max-trials"), default=200,
                   help="give up a seed after this many trials (store answers cost nothing but still count)")
    p.add_argument("--trials", type=positive_int("--trials"), default=None,
                   help="build the sampler as a search with --trials N does (N/3 random trials first, 3..10); "
                        "default: as a --time-budget search (10)")
    p.add_argument("--set", action="append", default=[], metavar="KNOB=VALUE",
                   help="replay only the part of the grid where this searched knob has this value (repeatable)")
    p.add_argument("--json", default=None, metavar="FILE", help="also write every seed's result as JSON")
    return p


def main(argv: list[str] | None = None) -> int:
    try:
        return run(build_parser().parse_args(argv))
    except ConfigError as e:
        print(f"replay: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
