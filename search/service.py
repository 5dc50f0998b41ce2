"""A search: Ray Tune schedules real trials, Optuna (TPE) chooses what to try next, ASHA stops what is
clearly slower, and the store answers every configuration that was already measured.

Each Tune trial runs one trainscout trial in a Ray actor that Tune reuses for the next (its ranks run in a warm
worker group of the driver's pool, trial.pool; a trial stopped early has its group killed), reports rank 0's
throughput after every timed step (ASHA's signal), stores the record the moment it exists, and reports infeasible outcomes (oom, invalid) as a value of 0 so the sampler learns to
avoid them (an exception would be a FAIL, which TPE ignores).
"""
from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import signal
import socket
import stat
import sys
import threading
import time
import warnings
from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING

from trainscout.spaces import ConfigError, fmt
from trainscout.store import Store, StoreError, StoreLost, check_folder, claims, default_url, guard, measurement_key, \
    one_line, open_store, storage_url
from trainscout.trial import execute, hardware, prepare
from trainscout.trial.memory import MARGIN as MEMORY_MARGIN  # predicted over the GPU's memory by more: not launched
from trainscout.trial.metrics import median
from trainscout.trial.runner import Cancelled, context
from trainscout.trial.status import DETERMINISTIC, Status

from . import cluster
from .space import Space, load_space_file

if TYPE_CHECKING:
    from trainscout.trial.records import TrialSpec

METRIC = "tokens_per_s"
# outcomes decided before a trial runs (refused by the rules, predicted not to fit): they cost no device time and do
# not count toward --trials; FREE_RUN of them in a row end the search's drawing (the space is mostly infeasible)
FREE = (Status.INVALID, Status.PRUNED)  # refused before running: no device time (an unscheduled trial waited its time limit: it counts)
FREE_RUN = 30
TRIAL_ACTOR = {"CPU": cluster.TRIAL_CPU}  # what a search's Tune trial actor holds beside its ranks (search/cluster.py)
LOCK_FILE = ".trainscout-search.lock"  # in --out: held (flock) by the driver of the search running there
TUNE_ID = "tune_trial_id"  # an Optuna trial's user attribute: the Tune trial it was drawn for
# Tune trial id -> its Optuna trial's number, for the live table: one numbering everywhere (the live table, the
# report, optuna-dashboard), Optuna's (the report said #4 for Optuna's number 3)
_NUMBERS: dict[str, int] = {}
RANDOM_TRIES = 200  # random draws tried for a configuration a search has not measured, in place of a repeat
SEED_RANGE = 2**32  # numpy's, which Optuna's samplers seed
QUALITY_MODES = ("mark", "strict")  # --quality: what the summary calls best (trial/quality.py)


@dataclass
class SearchArgs:
    """Everything a search is started with; saved in the store so --resume continues the same search."""

    model: str
    out: str
    device: str = "auto"
    gpus_per_trial: int = 1
    trials: int | None = None
    time_budget_s: float | None = None
    space: str | None = None
    sets: dict = field(default_factory=dict)
    storage: str | None = None
    address: str | None = None
    seed: int = 0
    steps: int = 5
    warmup: int = 2
    timeout: float | None = None
    recipe: dict = field(default_factory=dict)
    name: str | None = None
    max_failures: int = 0  # a crashed trial is measured again up to this many times (oom/invalid/timeout never)
    quality: str = "mark"  # mark: every best says whether it trains the same model; strict: only those are best
    max_concurrent: int | None = None  # trials at once (None: what the cluster holds, or has free when attached)
    one_node: bool = True  # each trial's ranks on one node (placement group STRICT_PACK); False: may be split
    space_content: dict | None = None  # the space file as read when the search started: a resume uses it

    def search_name(self) -> str:
        return self.name or os.path.basename(os.path.abspath(self.out))


def _trainable(config: dict, base: dict) -> None:
    """One Tune trial: measure (or look up) one configuration and report it. A store that failed (deleted, full,
    read-only) is reported as `store_failed`, which stops the search (its driver says what was kept)."""
    from ray import tune
    try:
        _measure(config, base)
    except Exception as e:  # noqa: BLE001 - only a storage failure is caught; anything else is Tune's error
        why = guard.failure_of(e)
        if why is None:
            raise
        tune.report({METRIC: 0.0, "status": str(Status.CRASH), "store_failed": why, "cached": False})


def _measure(config: dict, base: dict) -> None:
    from ray import tune
    ident = base.get("store_identity") if base.get("driver_host") == socket.gethostname() else None
    store = open_store(base["storage"], expect=ident)
    trial_id = tune.get_context().get_trial_id()
    settings = {k: v for k, v in config.items() if k in base["knob_names"]}
    fault = None
    if base.get("faults"):  # tests: the fault schedule, by the trial's number in the search
        fault = base["faults"].get(base["offset"] + int(tune.get_context().get_trial_name().split("_")[1]))
    try:
        spec = prepare(base["model"], settings, workers=base["workers"], steps=base["steps"], warmup=base["warmup"],
                       hw=base["hardware"], seed=base["seed"], fault=fault, **base["recipe"])
    except ConfigError as e:
        store.add_trial(base["search"], trial_id, None, Status.INVALID, False, 0.0, settings, error=str(e))
        tune.report({METRIC: 0.0, "status": str(Status.INVALID), "error": str(e), "cached": False})
        return
    host = base.get("host")  # predicted over the host's memory (offload states, CPU runs): not launched, why recorded
    if host and not spec.plan["micro_batch_probe"]:
        from trainscout.trial import memory
        why = memory.host_refusal(spec, host["capacity"], host["margin"])
        if why:
            store.add_trial(base["search"], trial_id, None, Status.PRUNED, False, 0.0, spec.config, error=why)
            tune.report({METRIC: 0.0, "status": str(Status.PRUNED), "cached": False, "error": why})
            return
    mem = base.get("memory")
    # predicted clearly over the GPU's memory: not launched, recorded with the prediction (max finds its own fit)
    if mem and not spec.plan["micro_batch_probe"]:
        from trainscout.trial import memory
        predicted = memory.predict(spec, mem["calibration"])
        if predicted > mem["capacity"] * (1 + mem["margin"]):
            gib = predicted / memory.GiB
            why = f"predicted {gib:.1f} GiB per rank > {mem['capacity'] / memory.GiB:.0f} GiB"
            store.add_trial(base["search"], trial_id, None, Status.PRUNED, False, 0.0,
                            dict(spec.config, predicted_gib=round(gib, 2)), error=why)
            tune.report({METRIC: 0.0, "status": str(Status.PRUNED), "cached": False, "predicted_gib": gib,
                         "error": why})
            return
    key = measurement_key(spec, base["hardware"], hardware.versions())
    record = store.get(key)
    cached = record is not None and record.status in DETERMINISTIC
    if not cached and (value := _stopped_before(store, base["search"], settings)) is not None:
        # ASHA ended this configuration earlier in the search: TPE proposed it again; it gets the same answer
        store.add_trial(base["search"], trial_id, None, Status.STOPPED, True, value, settings)
        tune.report({METRIC: value, "status": str(Status.STOPPED), "cached": True})
        return
    claim, note = None, None
    if not cached:  # measured by another search right now: wait for it and be served its record (store.claims)
        claim = store.claim(key, {"search": base["search"], "trial": trial_id})
        if claim.served is not None:
            record, cached = claim.served, True
            note = f"measured by another search ({claims.describe(claim.other or {})}) while this trial waited " \
                   f"{claim.waited_s:.0f} s"
    gate = None
    if not cached:
        if why := guard.lost(store.path, ident):  # no device time for a store that is gone
            raise StoreLost(f"the results store {why} while the search ran")
        try:  # the claim is released whatever happens here (a held one would keep other searches waiting)
            if spec.quality and "reference_plan" in spec.quality:  # one gate step per change, per search
                from trainscout.trial import quality
                gate = quality.gate_key(spec)
                known = store.quality(gate, "gate")
                if known is not None:
                    spec = spec.replace(quality=dict(spec.quality, known=dict(known, cached=True)))
            record = _run_trial(spec, base, trial_id)
        finally:
            claim.release()
        if record is None:  # ASHA stopped it: the driver recorded it as stopped
            return
        if record.status == Status.UNSCHEDULED:  # nothing ran: no measurement, and the sampler is told nothing
            store.add_trial(base["search"], trial_id, None, Status.UNSCHEDULED, False, 0.0, spec.config,
                            error=record.error)
            tune.report({METRIC: 0.0, "status": str(Status.UNSCHEDULED), "cached": False, "error": record.error})
            return
        if (record.placement or {}).get("split"):  # ranks on several nodes: not the one-node measurement's key
            key = measurement_key(spec, base["hardware"], hardware.versions(), placement=record.placement)
        store.add_measurement(key, record)  # a second measurement of a key is kept beside the first (store.samples)
        verdict = record.m.get("quality") or {}
        if gate and verdict.get("gate") and not verdict.get("cached"):
            store.put_quality(gate, "gate", verdict)
    m = record.m
    value = m.get(METRIC, 0.0) if record.ok else 0.0
    store.add_trial(base["search"], trial_id, key, record.status, cached, value, spec.config, error=record.error)
    tune.report({METRIC: value, "status": str(record.status), "cached": cached, "error": record.error,
                 "projected_days": m.get("projected_days"), "mfu": m.get("mfu"), "key": key,
                 "peak_memory_gib": m.get("peak_memory_gib"), "wall_s": 0.0 if cached else (record.wall_s or 0.0),
                 "note": note})


def _run_trial(spec, base: dict, trial_id: str):
    """Measure a trial (a crash again, up to max_failures times), reporting each timed step to Tune; None when
    ASHA stopped it."""
    from ray import tune
    seen = []

    def on_step(m):  # the best step so far: one slow step (noise, a late allocation) does not end a trial
        seen.append(m["tokens_per_s"])
        tune.report({METRIC: max(seen), "step_s": m["step_s"], "status": str(Status.RUNNING), "cached": False})
    for attempt in range(1 + base.get("max_failures", 0)):  # only a crash is measured again
        try:
            record = execute(spec, timeout=base["timeout"], storage=base["trial_dir"], address=base["address"],
                             on_step=on_step, owner=trial_id, one_node=base.get("one_node", True))
        except Cancelled:
            return None
        record = record.replace(attempt=attempt + 1, fault=spec.fault or None)
        if record.status != Status.CRASH:
            break
    return record


def counted(rows: list[dict]) -> int:
    """The trials of a search that count toward --trials: all but those refused or pruned before running (FREE)."""
    return sum(1 for t in rows if t["status"] not in FREE)


def _stopped_before(store, search: str, settings: dict) -> float | None:
    """The best step of an earlier trial of this search that ASHA stopped with the same settings (None: none)."""
    same = json.loads(json.dumps(settings, sort_keys=True, default=str))
    for t in store.trials(search):
        if t["status"] == Status.STOPPED and {k: t["config"].get(k) for k in same} == same:
            return t["tokens_per_s"] or 0.0
    return None


def _cancel(tune_trial_id: str, stop: bool = False) -> None:
    """End the worker group of a Tune trial whose actor ended before its trial did; stop: ASHA stopped it, and its
    ranks leave at their next step boundary, keeping the group for the next trial (trial.pool.Pool.stop)."""
    from trainscout.trial import pool
    if stop:
        pool.pool().stop.remote(owner=tune_trial_id)
    else:
        pool.pool().cancel.remote(owner=tune_trial_id)


def _progress_callback(url: str, search: str, printer):
    from ray.tune import Callback

    class Progress(Callback):
        """Records trials ASHA stopped early, and prints a row per finished trial."""

        def on_trial_complete(self, iteration, trials, trial, **info):
            r = trial.last_result or {}
            if r.get("store_failed"):  # the trial could not write its outcome: the search stops (run_search says)
                store_failed(r["store_failed"])
                return
            if r.get("status") == Status.RUNNING:  # stopped by the scheduler before its last step
                _cancel(trial.trial_id, stop=True)  # its actor is gone: the ranks still run its steps
                if not _write(lambda: open_store(url).add_trial(search, trial.trial_id, None, Status.STOPPED, False,
                                                                r.get(METRIC), trial.config)):
                    return
                r = dict(r, status=str(Status.STOPPED))
            printer(trial, r)

        def on_trial_error(self, iteration, trials, trial, **info):
            _cancel(trial.trial_id)
            try:  # a Tune error holds the traceback: its last line says what failed
                lines = [ln.strip() for ln in str(trial.get_error() or "").splitlines() if ln.strip()]
            except Exception:  # the error file may be gone; the row is what matters
                lines = []
            why = lines[-1][:2000] if lines else "the trial's actor failed"
            if _write(lambda: open_store(url).add_trial(search, trial.trial_id, None, Status.CRASH, False, 0.0,
                                                        trial.config, error=why)):
                printer(trial, {"status": str(Status.CRASH), METRIC: 0.0, "error": why})

    return Progress()


class Printer:
    """The live table: one row per finished trial, with the best so far, and why a trial failed or did not run."""

    def __init__(self, space: Space, stream=None, *, total: int | None = None, budget_s: float | None = None,
                 ranks: int = 1, unit: str = "GPU"):
        self.space, self.stream, self.best, self.n = space, stream, None, 0
        self.counted = 0  # rows that count toward --trials (not refused or pruned before running)
        self.to_stderr = stream is sys.stderr  # --json: the table goes to stderr, stdout holds the JSON alone
        self.header = False
        # the progress line: trials to go (None: until the budget), the budget, the ranks each trial holds
        self.total, self.budget_s, self.ranks, self.unit = total, budget_s, ranks, unit
        self.t0, self.device_s = time.time(), 0.0

    def progress(self) -> str:
        """One line: trials done of the total, elapsed and ETA, best so far, device-seconds the trials held."""
        elapsed = time.time() - self.t0
        eta = []
        if self.total and self.counted:
            eta.append(elapsed / self.counted * max(0, self.total - self.counted))
        if self.budget_s:
            eta.append(max(0.0, self.budget_s - elapsed))
        left = f"ETA {_clock(min(eta))}" if eta else "ETA -"
        done = f"{self.counted}/{self.total}" if self.total else f"{self.counted}"
        done += " trials" + (f" (+{self.n - self.counted} refused or pruned before running, not counted)"
                             if self.n > self.counted else "")
        best = f"{self.best:,.0f} tok/s" if self.best else "-"
        return (f"    {done}, {_clock(elapsed)} elapsed, {left}, best {best}, "
                f"{self.device_s:,.0f} {self.unit}-s measured")

    def __getstate__(self):  # Ray Tune pickles its callbacks; an open stream is not picklable
        return dict(self.__dict__, stream=None)

    def __call__(self, trial, r: dict):
        out = self.stream or (sys.stderr if self.to_stderr else sys.stdout)
        if not self.header:
            print(f"{'#':>3} {'trial':10} {'status':8} {'tokens/s':>11} {'run':>11} {'best tok/s':>11}  config",
                  file=out)
            self.header = True
        self.n += 1
        self.counted += r.get("status") not in FREE
        v = r.get(METRIC) or 0.0
        if r.get("status") == Status.OK and (self.best is None or v > self.best):
            self.best = v
        days = r.get("projected_days")
        days = _days(days) if days else "-"
        searched = " ".join(f"{k}={fmt(trial.config[k])}" for k, vs in self.space.domains.items()
                            if len(vs) > 1 and k in trial.config)
        status = r.get("status", "?") + ("*" if r.get("cached") else "")
        why = f"  ({one_line(r['error'], 120)})" if r.get("error") and r.get("status") != Status.OK else ""
        why += f"  ({r['note']})" if r.get("note") else ""  # served from another search's measurement
        self.device_s += (r.get("wall_s") or 0.0) * self.ranks
        print(f"{_NUMBERS.get(trial.trial_id, self.n - 1):>3} {trial.trial_id[-10:]:10} {status:8} {v:>11,.0f} "
              f"{days:>11} {(self.best or 0):>11,.0f}  {searched}{why}", file=out, flush=True)
        print(self.progress(), file=out, flush=True)


def _clock(seconds: float) -> str:
    """4m12s, 1h05m, 37s."""
    s = int(round(seconds))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


def fault_schedule(text: str | None) -> dict[int, str]:
    """TRAINSCOUT_FAULT_SCHEDULE (tests): "N:KIND[@RANK],..." injects a fault into the search's trial number N
    (0-based, counted over the whole search, resumes included). Off when unset."""
    from trainscout.trial import faults
    out: dict[int, str] = {}
    for item in filter(None, (i.strip() for i in (text or "").split(","))):
        n, _, kind = item.partition(":")
        try:
            faults.parse(kind)
            if not n.strip().isdigit() or not kind:
                raise ValueError
        except ValueError:
            raise ConfigError("TRAINSCOUT_FAULT_SCHEDULE", f"TRAINSCOUT_FAULT_SCHEDULE item {item!r} is not "
                              f"N:KIND[@RANK] with KIND one of {'|'.join(faults.KINDS)}: e.g. 3:oom,5:crash@1")
        out[int(n)] = kind
    return out


def _numbered(trial) -> str:
    """Tune trial name "trial_N_ID", N counting the trials this driver created from 0 (the fault schedule's)."""
    return f"trial_{int(trial.experiment_tag.split('_', 1)[0]) - 1}_{trial.trial_id}"


def validate(args: SearchArgs) -> tuple[Space, TrialSpec, dict]:
    """Check everything before anything is started or written: (space, base spec, hardware). Paths are made
    absolute here (the model's config.json, the store, the space file), as the trials run in Ray's working
    directories, and the space file is read once: args.space_content is what the search (and a resume) uses."""
    if args.trials is None and args.time_budget_s is None:
        raise ConfigError("--trials", "give --trials N or --time-budget (e.g. 30m)")
    if args.trials is not None and (not isinstance(args.trials, int) or args.trials < 1):
        raise ConfigError("--trials", f"--trials {args.trials} is not allowed: give a positive integer")
    if args.time_budget_s is not None and not (0 < args.time_budget_s < math.inf):
        raise ConfigError("--time-budget", f"--time-budget {args.time_budget_s} is not allowed: "
                                           "write e.g. 90s, 30m or 2h")
    if args.quality not in QUALITY_MODES:
        raise ConfigError("--quality", f"--quality {args.quality} is not allowed: use mark (every best says whether it "
                                       "trains the same model) or strict (only those are called best)")
    if not isinstance(args.max_failures, int) or args.max_failures < 0:
        raise ConfigError("--max-failures", f"--max-failures {args.max_failures} is not allowed: give an integer >= 0")
    if not isinstance(args.seed, int) or isinstance(args.seed, bool) or not 0 <= args.seed < SEED_RANGE:
        raise ConfigError("--seed", f"--seed {args.seed} is not allowed: give an integer from 0 to {SEED_RANGE - 1}")
    if args.timeout is not None and not (0 < args.timeout < math.inf):
        raise ConfigError("--timeout", f"--timeout {args.timeout} is not allowed: give a positive number of seconds "
                                       "(leave it out for the default: 300 s on the CPU, 900 s on a GPU)")
    check_folder(args.out, "--out")
    if args.storage:
        args.storage = storage_url(args.storage)
    fault_schedule(os.environ.get("TRAINSCOUT_FAULT_SCHEDULE"))
    from trainscout.trial.models import absolute
    args.model = absolute(args.model)  # a relative config.json path would not resolve in the trials' directories
    if args.max_concurrent is not None and (not isinstance(args.max_concurrent, int) or args.max_concurrent < 1):
        raise ConfigError("--max-concurrent", f"--max-concurrent {args.max_concurrent} is not allowed: give a positive "
                                              "integer, or leave it out for what the cluster holds")
    address = args.address or os.environ.get("RAY_ADDRESS")
    if address:  # the hardware of the nodes that run the trials, read on them (attaching; nothing is written)
        from .cluster import cluster_hardware
        hw = cluster_hardware(address, args.device, args.gpus_per_trial, args.one_node,
                              "--address" if args.address else "RAY_ADDRESS")
    else:
        from trainscout.trial.runner import detect_device
        hw = hardware.fingerprint(detect_device(args.device), args.gpus_per_trial)
    workers = args.gpus_per_trial
    # a trial of the defaults validates the model, recipe and worker count
    base = prepare(args.model, {}, workers=workers, steps=args.steps, warmup=args.warmup, hw=hw, **args.recipe)
    ctx = context(base.model_config, base.recipe["global_batch"], workers, hw)
    if args.space_content is None:
        args.space_content = read_space(args.space) if args.space else {}
        args.space = os.path.abspath(args.space) if args.space else None
    return Space.build(args.space_content, args.sets, ctx), base, hw


def read_space(path: str) -> dict:
    """A space file's mapping; a FIFO, a device or a socket is refused (reading one blocked forever)."""
    try:
        mode = os.stat(path).st_mode
    except OSError as e:
        raise ConfigError("--space", f"cannot read {path}: {e.strerror}: give a readable YAML file")
    if not stat.S_ISREG(mode):
        what = "a folder" if stat.S_ISDIR(mode) else "not a regular file (a pipe, a device or a socket)"
        raise ConfigError("--space", f"--space {path} is {what}: give a YAML file")
    return load_space_file(path)


# --- resume: what may change ----------------------------------------------------------------------------------
FIXED_ON_RESUME = {"model": "--model", "device": "--device", "gpus_per_trial": "--gpus-per-trial", "space": "--space",
                   "sets": "--set", "seed": "--seed", "steps": "--steps", "warmup": "--warmup", "timeout": "--timeout",
                   "max_failures": "--max-failures", "one_node": "--one-node"}
RECIPE_FLAGS = {"global_batch": "--global-batch", "seq_len": "--seq-len", "total_steps": "--train-steps",
                "total_tokens": "--train-tokens", "grad_clip": "--grad-clip"}


def resumed(saved: dict, out: str, given: dict, done: int) -> tuple[SearchArgs, list[str]]:
    """The search saved in a store, continued from `out`, with the flags given on the command line (None: not
    given). A resume may take more --trials, a --time-budget for this run, --storage and --address; a setting that
    defines the search (model, space, knobs, steps, recipe, seed, ...) given with another value is refused, naming
    it: the trials would not be comparable, and an Optuna study cannot change its space. Returns (args, notes)."""
    known = {f.name for f in fields(SearchArgs)}
    args = SearchArgs(**{k: v for k, v in saved.items() if k in known})
    args.out = out  # the folder may have moved since (another machine, a copy)

    def refuse(flag, value, before):
        raise ConfigError(flag, f"{flag} {value} differs from the search in {out} ({flag} {before}): a resumed search "
                                f"keeps its settings: leave {flag} out, or start a new search with another --out")
    for name, flag in FIXED_ON_RESUME.items():
        value = given.get(name)
        if value is None:
            continue
        before = getattr(args, name)
        if name == "model":
            from trainscout.trial.models import absolute
            same = absolute(value) == before
        elif name == "space":
            content = read_space(value)
            same = (content == args.space_content if args.space_content is not None
                    else before is not None and os.path.abspath(value) == os.path.abspath(before))
        elif name == "seed" and not (isinstance(before, int) and 0 <= before < SEED_RANGE):
            same = True  # a store an older version left with an unusable seed: the resume gives one
            args.seed = value
        elif name == "sets":
            same = {k: str(v) for k, v in value.items()} == {k: str(v) for k, v in (before or {}).items()}
            value = " --set ".join(f"{k}={v}" for k, v in value.items())
            before = " --set ".join(f"{k}={v}" for k, v in (before or {}).items()) or "(none)"
        else:
            same = value == before
        if not same:
            refuse(flag, value, before)
    for name, flag in RECIPE_FLAGS.items():
        value = (given.get("recipe") or {}).get(name)
        if value is not None and value != args.recipe.get(name):
            refuse(flag, value, args.recipe.get(name, "(the model's)"))
    notes = []
    trials = given.get("trials")
    if trials is not None and trials != args.trials:
        if (args.trials is not None and trials < args.trials) or trials < done:
            raise ConfigError("--trials", f"--trials {trials} is fewer than the search's {args.trials or done}: a "
                                          "resume may only add trials: give a larger --trials or leave it out")
        before = args.trials if args.trials is not None else "(none: a time budget)"
        notes.append(f"--trials {before} -> {trials}: {trials - done} to go")
        args.trials = trials
    if given.get("time_budget_s") is not None:
        args.time_budget_s = given["time_budget_s"]
        notes.append(f"a time budget of {given['time_budget_s']:g} s for this run")
    args.quality = given.get("quality") or args.quality  # a rule of the summary: it may change on a resume
    args.storage = given.get("storage") or args.storage  # None: OUT/results.db
    args.address = given.get("address") or args.address
    args.max_concurrent = given.get("max_concurrent") or args.max_concurrent  # where it runs may change
    return args, notes


# --- one search per folder ----------------------------------------------------------------------------------
def hold_folder(out: str) -> int:
    """Take the folder's lock for this driver (flock: the kernel drops it when the process ends, SIGKILL included);
    a folder whose lock a running search holds is refused with its PID. Returns the lock's descriptor."""
    import fcntl
    fd = os.open(os.path.join(out, LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        pid = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise ConfigError("--out", f"--out {out} is in use by a running search (pid {pid}): wait for it to end, "
                                   "or give another --out")
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def folder_free(out: str) -> None:
    """Refuse a folder whose lock a running search holds, without writing anything (hold_folder takes it later)."""
    import fcntl
    try:
        fd = os.open(os.path.join(out, LOCK_FILE), os.O_RDONLY)
    except OSError:
        return  # no lock file: no search ran there
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
    except BlockingIOError:
        pid = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        raise ConfigError("--out", f"--out {out} is in use by a running search (pid {pid}): wait for it to end, "
                                   "or give another --out")
    finally:
        os.close(fd)


def _refuse_existing(store: Store, name: str, out: str, resume: bool) -> dict | None:
    """The saved settings of the search `name`; a new search (not resume) of a name the store holds is refused."""
    saved = store.search_args(name)
    if saved is not None and not resume:
        n = len(store.trials(name))
        raise ConfigError("--out", f"--out {out} already holds the search {name} ({n} trial{'s' if n != 1 else ''}): "
                                   f"use --resume {out} to continue it (a larger --trials runs more), or another --out")
    return saved


# --- a store that fails while the search runs ----------------------------------------------------------------
_STORE_FAILED: list[str] = []  # why the store failed in this process's running search (the first reason)


def store_failed(why: str) -> None:
    """Record that the store failed (the search's stopper then ends the run; run_search says what was kept)."""
    if not _STORE_FAILED:
        _STORE_FAILED.append(why)


def store_failure() -> str | None:
    """Why the store of the search running in this process failed, or None."""
    return _STORE_FAILED[0] if _STORE_FAILED else None


def _write(fn) -> bool:
    """Run a store write of the driver inside Tune's loop; a storage failure is recorded, not raised into Tune
    (which would print its traceback). False when it failed."""
    try:
        fn()
        return True
    except Exception as e:  # noqa: BLE001 - only a storage failure is caught
        why = guard.failure_of(e)
        if why is None:
            raise
        store_failed(why)
        return False


# --- Ctrl-C -------------------------------------------------------------------------------------------------
_INTERRUPTED = threading.Event()


@contextlib.contextmanager
def _catch_interrupt():
    """Ctrl-C (SIGINT) while Tune runs: no trial is started, the running ones are stopped (a Tune stopper), what the
    store holds is kept, and run_search says so. Tune's own handler stops the same way but tells nobody (the search
    exited 0 with a normal summary), so it is switched off. A second Ctrl-C quits at once."""
    _INTERRUPTED.clear()

    def on_sigint(sig, frame):
        _INTERRUPTED.set()
        print("trainscout: interrupted: stopping the running trials (Ctrl-C again to quit at once)",
              file=sys.stderr, flush=True)
        signal.signal(signal.SIGINT, previous)
    try:
        previous = signal.signal(signal.SIGINT, on_sigint)
    except ValueError:  # not the main thread: no handler of ours (nor Tune's)
        previous = None
    env = os.environ.get("TUNE_DISABLE_SIGINT_HANDLER")
    os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = "1"
    try:
        yield
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
        if env is None:
            os.environ.pop("TUNE_DISABLE_SIGINT_HANDLER", None)
        else:
            os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = env


@contextlib.contextmanager
def _one_line_logs(*names: str):
    """Records of these loggers as one line each, their traceback's last line kept: Tune's saving of its own
    experiment state (OUT/tune) to a full disk logged a traceback beside the line that says what the store kept."""
    class OneLine(logging.Filter):
        def filter(self, record):
            if record.exc_info:
                last = next((ln for ln in reversed(logging.Formatter().formatException(record.exc_info).splitlines())
                             if ln.strip()), "")
                record.msg, record.args = f"{record.getMessage().strip()} {last.strip()}", ()
                record.exc_info, record.exc_text = None, None
            return True
    loggers, f = [logging.getLogger(n) for n in names], OneLine()
    for lg in loggers:
        lg.addFilter(f)
    try:
        yield
    finally:
        for lg in loggers:
            lg.removeFilter(f)


def interrupted() -> bool:
    """Whether Ctrl-C ended the search running (or last run) in this process."""
    return _INTERRUPTED.is_set()


def _interrupt_stopper(path: str | None = None, ident=None):
    from ray.tune import Stopper

    class StopOnInterrupt(Stopper):
        """Ends the whole experiment once Ctrl-C was pressed, or the store failed or is not the file the search
        opened (path, ident: a SQLite store's; one stat per step) (Tune asks on every step of its loop)."""

        def __call__(self, trial_id, result):
            return False

        def stop_all(self):
            if (why := guard.lost(path, ident)) is not None:
                store_failed(why)
            # module functions: a pickled copy of the stopper reads the same flags
            return interrupted() or store_failure() is not None
    return StopOnInterrupt()


def run_search(args: SearchArgs, stream=None, resume: bool = False) -> dict:
    """Run (or, resume=True, continue) a search; returns a summary with the best configurations ("interrupted":
    True when Ctrl-C ended it). A new search into a store that holds a search of its name (the --out folder's) is
    refused, and so is a second search on a folder while one runs there."""
    stream = stream or sys.stdout
    space, _, hw = validate(args)
    name = args.search_name()
    path = guard.sqlite_path(args.storage) if args.storage else os.path.join(args.out, "results.db")
    # an existing store (or a server's) is opened and read first, so that a bad URL or a search already there is
    # refused before anything is written; a new SQLite file is made only after Ray is reached (a file in a folder
    # that does not exist cannot be made: opening it refuses the URL and writes nothing)
    store = None
    if args.storage and (path is None or os.path.isfile(path) or not os.path.isdir(os.path.dirname(path))):
        store = open_store(args.storage)
    elif not args.storage and os.path.isfile(path):
        store = open_store(default_url(args.out))
    if store is not None:  # refused before the folder is touched
        _refuse_existing(store, name, args.out, resume)
    folder_free(args.out)
    if not (resume and store is not None and args.trials is not None and counted(store.trials(name)) >= args.trials):
        # Ray reached (or started) before anything is written: an address where nothing listens is refused here,
        # not after the store, its log and the folder's lock were made (a rerun in that folder was then refused)
        from trainscout.trial.runner import check_resources, ensure_ray
        ensure_ray(args.address)
        check_resources(args.gpus_per_trial, hw["device"], "--gpus-per-trial", per_trial=TRIAL_ACTOR)
    os.makedirs(args.out, exist_ok=True)
    lock = hold_folder(args.out)
    lease = None
    try:
        store = store or open_store(args.storage or default_url(args.out))
        # one driver per search name across hosts: a lease with a heartbeat in the store (the folder's lock: this host)
        lease = store.hold_search(name, "--resume" if resume else "--out")
        saved = _refuse_existing(store, name, args.out, resume)  # again, now that no other driver can start here
        if saved is None:
            store.add_search(name, asdict(args))
        elif asdict(args) != saved:
            store.update_search(name, asdict(args))  # more --trials: the next resume starts from them
        return _search(args, store, name, space, hw, stream)
    finally:
        if lease is not None:
            lease.release()
        os.close(lock)


def _search(args: SearchArgs, store: Store, name: str, space: Space, hw: dict, stream) -> dict:
    _STORE_FAILED.clear()
    keeper = guard.Keeper(store.path)  # reads the store after a deletion, for the rescue (store.guard)
    try:
        summary = _run(args, store, name, space, hw, stream, keeper)
    except Exception as e:  # noqa: BLE001 - a storage failure ends in one line; anything else is raised as it is
        why = guard.failure_of(e)
        if why is None and keeper.lost() is None:
            raise
        store_failed(why or keeper.lost())
        summary = None
    try:
        if keeper.lost() or store_failure():
            raise StoreError(_store_stop_line(args, store, name, keeper))
    finally:
        keeper.close()
    return summary


def _store_stop_line(args: SearchArgs, store: Store, name: str, keeper) -> str:
    """The one line a search stopped by its store ends with: what failed, and what was kept where."""
    resume = f"trainscout search --resume {args.out}"
    if why := keeper.lost():
        dest = keeper.rescue()
        got = guard.counts(f"sqlite:///{dest}", name) if dest else None
        if got is None:
            return f"the results store {why} while the search ran: the search stopped; nothing could be rescued"
        where = dest if dest == keeper.path else f"{dest} (the path now holds another file)"
        return (f"the results store {why} while the search ran: the search stopped; its {_n(got[0], 'trial')} and "
                f"{_n(got[1], 'measurement')} are rescued into {where}; continue with: {resume}")
    got = guard.counts(store.url, name, store)
    kept = (f"the {_n(got[0], 'trial')} and {_n(got[1], 'measurement')} recorded before are kept in {store.url}"
            if got else f"what was recorded before is in {store.url}")
    return (f"the results store failed ({store_failure()}): the search stopped; {kept} (the trials running then "
            f"were not recorded); make room or make it writable, then continue with: {resume}")


def _n(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def _run(args: SearchArgs, store: Store, name: str, space: Space, hw: dict, stream, keeper) -> dict:
    url = store.url
    rows = store.trials(name)
    done = [t for t in rows if t["status"] != Status.UNSCHEDULED]  # an unscheduled trial ran nothing: run it again
    remaining = None if args.trials is None else args.trials - counted(done)
    if remaining is not None and remaining <= 0:
        print(f"search {name}: all {args.trials} trials done; give a larger --trials with --resume to run more",
              file=stream)
        return summarize(store, name, stream, out=args.out)

    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # Tune's verbose=0 then prints nothing of its own
    import optuna
    from ray import tune

    from trainscout.trial import pool
    from trainscout.trial.runner import ensure_ray
    ensure_ray(args.address)
    pool.pool()  # the worker groups' pool, owned by this driver, so that it outlives the trials that use it
    from trainscout.store import secrets, shared
    secrets.publish(url)  # the storage's password, for the trials' processes wherever they run (in memory only)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    ostorage = shared.optuna_storage(url, engine_kwargs=Store._engine_kwargs(url))  # its schema made once
    guard.pin(ostorage.engine, store.path, store.identity)  # no new, empty database where the store was
    drawn = recover_interrupted(ostorage, name, store)
    # a resumed search's sampler would replay its seed's draws from the first: it continues from another seed
    sampler = make_sampler((args.seed + drawn) % SEED_RANGE, args.trials)
    calibration = None  # the memory model fitted once on this GPU's stored peaks: pruning and the start point use it
    if hw["device"] == "cuda" and hw.get("gpu_memory_gib"):
        from trainscout.trial import memory
        calibration = memory.fit(memory.calibration_pairs(store.measurements(), hw.get("gpu")))
    notes: list[str] = []
    ranker = make_ranker(args, space, hw, calibration, seed=(args.seed + drawn) % SEED_RANGE)
    start = [] if done else first_points(start_points(args, space, hw, calibration, notes), ranker)
    from trainscout.atlas.db import with_shipped  # the shipped H200 measurements beneath the store's
    known = [] if done else store_points(args, space, hw, with_shipped(store.measurements()), start)
    start += [p for p, _ in known]
    searcher = make_searcher(space, name, ostorage, sampler, start, seed=(args.seed + drawn) % SEED_RANGE,
                             ranker=ranker, target=remaining)
    scheduler = make_scheduler(args.steps)
    attached = bool(args.address or os.environ.get("RAY_ADDRESS"))
    concurrent, why_concurrent = cluster.concurrency(hw, args.gpus_per_trial, args.max_concurrent, attached)
    base = {"model": args.model, "workers": args.gpus_per_trial, "steps": args.steps, "warmup": args.warmup,
            "hardware": hw, "seed": args.seed, "recipe": args.recipe, "storage": url, "search": name,
            "timeout": args.timeout, "address": args.address, "max_failures": args.max_failures,
            "faults": fault_schedule(os.environ.get("TRAINSCOUT_FAULT_SCHEDULE")), "offset": len(rows),
            "trial_dir": os.path.abspath(os.path.join(args.out, "trials")), "knob_names": list(space_knobs()),
            "one_node": args.one_node,
            # the SQLite file's (device, inode) as the driver opened it; a trial on another host (a shared
            # filesystem numbers devices per host) does not compare it
            "store_identity": store.identity, "driver_host": socket.gethostname()}
    import psutil  # the driver's host: on one box (the common case) the trials' host too; on a cluster the nodes'
    host = hw["host_memory_gib"] * 2**30 if hw.get("host_memory_gib") else psutil.virtual_memory().total
    base["host"] = {"capacity": host, "margin": MEMORY_MARGIN}
    if hw["device"] == "cuda" and hw.get("gpu_memory_gib"):
        base["memory"] = {"capacity": hw["gpu_memory_gib"] * memory.GiB, "margin": MEMORY_MARGIN,
                          "calibration": calibration}
    printer = Printer(space, None if stream in (sys.stdout, sys.stderr) else stream, total=remaining,
                      budget_s=args.time_budget_s, ranks=args.gpus_per_trial,
                      unit="GPU" if hw["device"] == "cuda" else "worker")
    printer.to_stderr = stream is sys.stderr
    tuner = tune.Tuner(
        tune.with_resources(tune.with_parameters(_trainable, base=base), TRIAL_ACTOR),
        tune_config=tune.TuneConfig(search_alg=searcher, scheduler=scheduler,
                                    num_samples=-1,  # the searcher ends at --trials counted (FREE ones not)
                                    max_concurrent_trials=concurrent, time_budget_s=args.time_budget_s,
                                    trial_name_creator=_numbered if base["faults"] else None,
                                    reuse_actors=True),  # one trial after another in the same actor process
        run_config=tune.RunConfig(name=f"{name}-{int(time.time())}", storage_path=os.path.abspath(os.path.join(args.out, "tune")),
                                  verbose=0, callbacks=[_progress_callback(url, name, printer)],
                                  stop=_interrupt_stopper(keeper.path, keeper.ident),
                                  failure_config=tune.FailureConfig(max_failures=0)))
    nodes = f" on {hw['nodes']} node{'s' if hw['nodes'] != 1 else ''}" if hw.get("nodes") else ""
    print(f"search {name}: model {args.model} on {hw.get('gpu') or hw['cpu']} ({hw['device']}){nodes}, "
          f"{args.gpus_per_trial} {'GPU' if hw['device'] == 'cuda' else 'worker'}(s) per trial"
          f"{'' if args.one_node else ' (may be split over nodes)'}, {concurrent} at once ({why_concurrent}); "
          f"{counted(done)} trials done, {remaining if remaining is not None else 'until the time budget'} to go; "
          f"store {secrets.masked(url)}", file=stream, flush=True)
    for note in notes:
        print(f"  {note}", file=stream, flush=True)
    for p, why in known:
        print(f"  start point from the store ({why}): " + " ".join(f"{k}={fmt(v)}" for k, v in sorted(p.items())),
              file=stream, flush=True)
    with _catch_interrupt(), _one_line_logs("ray.tune.execution.experiment_state"):
        tuner.fit()
    if keeper.lost() or store_failure():  # stopped by its store: no summary (the caller says what was kept)
        return {}
    recover_interrupted(ostorage, name, store)  # Ctrl-C or the time budget ended a trial Tune did not report
    if searcher.stopped_why:
        print(f"  {searcher.stopped_why}", file=stream, flush=True)
    summary = summarize(store, name, stream, out=args.out)
    if interrupted():
        summary["interrupted"] = True
    summary["ran"] = len(store.trials(name)) - len(done)  # trials this run ended (a resume's included)
    if summary["ran"] == 0 and not interrupted():
        summary["none_why"] = (f"the time budget ({_clock(args.time_budget_s)}) ran out before a trial ended (the "
                               "first trial of a run starts its worker processes): give a longer --time-budget"
                               if args.time_budget_s else searcher.stopped_why or "the searcher proposed no trial")
    return summary


def start_points(args: SearchArgs, space: Space, hw: dict, calibration: dict | None,
                 notes: list[str] | None = None) -> list[dict]:
    """The first trials, on every device, are the strong defaults a person would set by hand: every searched knob at
    its default (the fixed ones as fixed), with the largest micro-batch that fits where it is searched - on a GPU
    probed (micro_batch_size=max) or else the largest the memory model predicts to fit in 85 % of its memory; on the
    CPU the knob's default (auto) or the largest below it that fits the host's memory (a CPU step of a larger one
    ran past the trial's time limit). On a GPU, where compile is searched, the same with compile on follows (the
    yardstick's own best rows are compiled), the loss compiled too where loss_kernel is searched, and that again
    with FP8 matmuls (fp8=tensorwise) where fp8 is searched and the GPU has FP8 tensor cores (the Llama-1B shape on
    an H200: +17.5 % over compiled alone). With two or more trials at once they run side by side. Where the defaults
    do not fit even at the smallest micro-batch, the cheapest memory saver of the space that makes them fit is added
    first (fits), and `notes` says which and why. A CPU search of a real model (pythia-14m, 3 trials) drew 1 invalid
    and 2 pruned configurations and measured nothing; `--trials 1 --set micro_batch_size=...` drew random values for
    the knobs left (eager attention, full checkpointing, FSDP on one GPU)."""
    if not space.domains:
        return []
    from trainscout.spaces import get
    gpu = hw["device"] == "cuda" and bool(hw.get("gpu_memory_gib"))
    defaults = fits(args, space, hw, calibration, space_defaults(space), notes)
    if defaults is None:
        return []
    sizes = space.domains.get("micro_batch_size")
    if sizes is None:  # fixed: the defaults as they are
        point = defaults if _spec_at(args, space, hw, defaults) is not None else None
    elif gpu and "max" in sizes:  # probed in the trial, from the memory model's estimate up
        point = dict(defaults, micro_batch_size="max")
    else:
        point = _largest_fit(args, space, hw, calibration, defaults)
    if point is None:
        return []

    def applicable(p):  # a knob whose requirements do not hold keeps its default (compile_scope without compile)
        return {k: v for k, v in p.items() if get(k).applies(p)}
    compiled = []
    if gpu and True in space.domains.get("compile", ()) and not point.get("compile"):
        on = dict(point, compile=True)
        if "compiled" in space.domains.get("loss_kernel", ()):  # the loss too, which per-layer compile leaves out
            on["loss_kernel"] = "compiled"
        compiled = [applicable(on)]
        if "tensorwise" in space.domains.get("fp8", ()):  # FP8 matmuls on top, where the GPU and torchao have them
            fp8 = applicable(dict(on, fp8="tensorwise"))  # (the knob's own check refuses other GPUs)
            if _spec_at(args, space, hw, fp8) is not None:
                compiled.append(fp8)
    return [applicable(point), *compiled]


def space_defaults(space: Space) -> dict:
    """Every searched knob at its default (its first value where the default is not in the domain)."""
    from trainscout.spaces import get
    return {k: get(k).default if get(k).default in dom else dom[0] for k, dom in space.domains.items()}


# memory savers, cheapest first (what each costs in speed): checkpoint every 4th .. every layer, then ZeRO offload of
# the optimizer (its step on the CPU), then of the parameters too; a saver is tried only where the space has it
SAVERS = ({"activation_checkpointing": 4}, {"activation_checkpointing": 3}, {"activation_checkpointing": 2},
          {"activation_checkpointing": "full"},
          {"zero_stage": 2, "offload_optimizer": True, "activation_checkpointing": "full"},
          {"zero_stage": 3, "offload_optimizer": True, "offload_params": True, "activation_checkpointing": "full"})
FIT_SHARE = 0.85  # a start point must be predicted to fit in this share of the GPU's memory


def fits(args: SearchArgs, space: Space, hw: dict, calibration: dict | None, point: dict,
         notes: list[str] | None = None, host: float | None = None) -> dict | None:
    """point if the memory model predicts it to fit at the space's smallest micro-batch; else point with the
    cheapest memory saver (SAVERS) that fits the GPU and the host (host: its bytes; default this machine's);
    None where none does (notes: why)."""
    import psutil

    from trainscout.trial import memory
    searched = "micro_batch_size" in space.domains
    sizes = [m for m in space.domains.get("micro_batch_size", ()) if m != "max"] or [1]
    # fixed: as fixed, but max (probed from the largest candidate down) at micro-batch 1: predicted at its largest
    # candidate, 128, Pythia-410M's defaults "needed" 385 GiB and had no start point
    probed = space.fixed.get("micro_batch_size") == "max"
    smallest = {"micro_batch_size": min(sizes)} if searched or probed else {}
    gpu = hw["device"] == "cuda" and bool(hw.get("gpu_memory_gib"))
    cap = FIT_SHARE * hw["gpu_memory_gib"] * memory.GiB if gpu else math.inf  # the CPU: the host's memory alone
    host = host or psutil.virtual_memory().total

    def need(p: dict) -> tuple[float, str | None] | None:
        spec = _spec_at(args, space, hw, p, **smallest)
        if spec is None:
            return None
        return (memory.predict(spec, calibration) if gpu else 0.0), memory.host_refusal(spec, host, MEMORY_MARGIN)
    first = need(point)
    if first is None or (first[0] <= cap and first[1] is None):
        return point
    tried = []
    for saver in SAVERS:
        if any(v not in space.domains.get(k, ()) for k, v in saver.items()):
            continue
        got = need(dict(point, **saver))
        if got is None:
            continue
        tried.append(f"{' '.join(f'{k}={fmt(v)}' for k, v in saver.items())}: {got[0] / memory.GiB:.1f} GiB"
                     + (f" (host: {got[1].split(' (')[0]})" if got[1] else ""))
        if got[0] <= cap and got[1] is None:
            if notes is not None:
                over = (f"predicted {first[0] / memory.GiB:.1f} GiB > {FIT_SHARE:.0%} of "
                        f"{hw['gpu_memory_gib']:.0f} GiB" + (f"; {first[1]}" if first[1] else "")) if gpu else first[1]
                notes.append(f"the defaults do not fit at micro-batch {min(sizes)} ({over}): the start point adds "
                             + " ".join(f"{k}={fmt(v)}" for k, v in saver.items()))
            return dict(point, **saver)
    if notes is not None:
        need_text = f"{first[0] / memory.GiB:.1f} GiB" if gpu else f"more than the host has ({first[1]})"
        notes.append(f"no start point: the defaults need {need_text} at micro-batch {min(sizes)} "
                     f"and no memory saver of the space fits ({'; '.join(tried) or 'the space has none'})")
    return None


STORE_POINTS = 2  # start points taken from the store: the best MFU measured on this GPU kind, other models


def store_points(args: SearchArgs, space: Space, hw: dict, records: list, have: list[dict]) -> list[tuple[dict, str]]:
    """Start points from what the store knows: the configurations with the highest MFU measured on the same GPU
    kind and rank count for other models (MFU, not tokens/s, carries across model sizes), put into this search's
    space (a knob outside its domain keeps the start point's value; the micro-batch is probed again where the space
    has max, as it is this model's) and checked against this model (an invalid one is left out). [(point, why)]."""
    if hw["device"] != "cuda" or not have:
        return []
    from trainscout.spaces import get
    base = have[0]
    me = _spec_at(args, space, hw, base)
    if me is None:
        return []
    same = [r for r in records if r.ok and r.m.get("mfu") and r.world_size == args.gpus_per_trial
            and (r.hardware or {}).get("gpu") == hw.get("gpu") and r.model != me.model and r.device == "cuda"]
    out, seen = [], [json.dumps(p, sort_keys=True, default=str) for p in have]
    for r in sorted(same, key=lambda r: -r.m["mfu"]):
        point = dict(base)
        for k, dom in space.domains.items():
            v = r.config.get(k)
            if k != "micro_batch_size" and v in dom:
                point[k] = v
        point = {k: v for k, v in point.items() if k in space.domains and get(k).applies(point)}
        sizes = space.domains.get("micro_batch_size", ())
        if "max" not in sizes and r.config.get("micro_batch_size") in sizes:
            point["micro_batch_size"] = r.config["micro_batch_size"]  # no probe in this space: the measured one
        k = json.dumps(point, sort_keys=True, default=str)
        if k in seen or _spec_at(args, space, hw, point) is None:
            continue
        seen.append(k)
        out.append((point, f"{r.model}'s MFU {r.m['mfu']:.3f} on {hw.get('gpu')}"))
        if len(out) == STORE_POINTS:
            break
    return out


def _spec_at(args: SearchArgs, space: Space, hw: dict, point: dict, **override) -> TrialSpec | None:
    """The trial a start point means, as the sampler would build it, with `override` set over it (None: this model
    refuses it)."""
    import optuna
    try:
        settings = dict(space.sample(optuna.trial.FixedTrial(point)), **override)
        return prepare(args.model, settings, workers=args.gpus_per_trial, hw=hw, **args.recipe)
    except ConfigError:
        return None


def _largest_fit(args: SearchArgs, space: Space, hw: dict, calibration: dict | None, defaults: dict) -> dict | None:
    """The defaults at the largest micro-batch the memory model predicts to fit in FIT_SHARE of the GPU; on the CPU,
    at the largest no larger than the knob's default (auto) that fits the host's memory (None: none)."""
    import psutil

    from trainscout.trial import memory
    gpu = hw["device"] == "cuda" and bool(hw.get("gpu_memory_gib"))
    sizes = sorted((m for m in space.domains["micro_batch_size"] if m != "max"), reverse=True)
    if not gpu:
        auto = _spec_at(args, space, hw, dict(defaults, micro_batch_size=min(sizes)), micro_batch_size="auto")
        sizes = [m for m in sizes if auto is None or m <= auto.plan["micro_batch_size"]]
    for mbs in sizes:
        point = dict(defaults, micro_batch_size=mbs)
        spec = _spec_at(args, space, hw, point)
        if spec is None:
            continue
        if gpu and memory.predict(spec, calibration) <= FIT_SHARE * hw["gpu_memory_gib"] * memory.GiB:
            return point
        if not gpu and memory.host_refusal(spec, psutil.virtual_memory().total, MEMORY_MARGIN) is None:
            return point
    return None


def make_ranker(args: SearchArgs, space: Space, hw: dict, calibration: dict | None, seed: int = 0):
    """On a GPU, the ranker of the proposals after the start points (search/ranked.py): a configuration's step
    time predicted by trial/steptime.py, None where this model refuses it or the memory model predicts it over the
    GPU's memory by more than MEMORY_MARGIN (the trial would be pruned). None on a CPU: the sampler alone."""
    if hw["device"] != "cuda" or not hw.get("gpu_memory_gib"):
        return None
    from trainscout.trial import memory, steptime

    from .ranked import Ranker
    capacity = hw["gpu_memory_gib"] * memory.GiB * (1 + MEMORY_MARGIN)

    def predict_s(params: dict) -> float | None:
        spec = _spec_at(args, space, hw, params)
        if spec is None or (not spec.plan["micro_batch_probe"] and memory.predict(spec, calibration) > capacity):
            return None
        return steptime.step_s(spec)
    return Ranker(space, predict_s, seed)


def first_points(points: list[dict], ranker) -> list[dict]:
    """The start points the search runs first: the fastest predicted first, less those predicted more than
    ranked.MARGIN slower than it. On the H200 Pythia-160M grid the defaults (loss and layers eager) cost 2.4 % of
    the grid's GPU-seconds before their compiled twin, which the step-time model ranks 37 % faster and the grid
    measured 55 % faster; the ranked neighbours of the fastest come next (docs/BENCHMARKS.md). All of them where no
    ranker or no prediction is at hand."""
    if ranker is None or len(points) < 2:
        return points
    params = [ranker.params(p) for p in points]
    predicted = [None if q is None else ranker.step_s(q) for q in params]
    if None in predicted:
        return points
    fastest = min(predicted)
    order = sorted(range(len(points)), key=lambda i: predicted[i])
    from .ranked import MARGIN
    return [points[i] for i in order if fastest / predicted[i] >= 1 - MARGIN]


FEASIBLE = (Status.OK, Status.STOPPED, Status.RUNNING)  # RUNNING: the last step ASHA saw of a stopped trial


def outcome_attrs(result: dict) -> dict:
    """What an Optuna trial carries of its outcome (user attributes, for optuna-dashboard and any tool reading the
    study): status and reason, the measurement's key, the metrics, and `constraint` (> 0: infeasible). The value
    stays the tokens/s, 0 for an infeasible outcome, so TPE learns that region is bad; set_constraint gives TPE
    `constraint`, so it also knows why."""
    status = str(Status.STOPPED if result.get("status") == Status.RUNNING else result.get("status", Status.CRASH))
    attrs = {"status": status, "constraint": [0.0 if status in FEASIBLE else 1.0]}
    if result.get("error"):
        attrs["error"] = one_line(str(result["error"]), 500)
    for k in ("key", "cached", "mfu", "peak_memory_gib", "projected_days", "predicted_gib", "wall_s"):
        if result.get(k) is not None:
            attrs[k] = result[k]
    attrs[METRIC] = result.get(METRIC) or 0.0
    return attrs


def set_constraint(trial, attrs: dict) -> None:
    """Tell the sampler whether an outcome was feasible (Optuna's Trial.set_constraint, read by TPE, before the
    trial is told its value): outcome_attrs' `constraint`."""
    trial.set_constraint("infeasible", attrs["constraint"][0])


def make_sampler(seed: int, trials: int | None):
    """TPE made for conditional spaces (multivariate, grouped), seeded; a few random trials first; infeasible
    outcomes (oom, invalid, pruned, crash, timeout) are constraint violations (set_constraint) as well as value 0."""
    import optuna
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    return optuna.samplers.TPESampler(multivariate=True, group=True, seed=seed, constant_liar=True,
                                      n_startup_trials=min(10, max(3, (trials or 30) // 3)))


def make_scheduler(steps: int):
    """ASHA on the per-step throughput (a trial reports the best of its timed steps so far after each, then the
    record at steps + 1). The first rung is after two steps: replayed on a recorded grid, a rung after one step
    ended the grid's best configuration on its slow first step in 5 of 20 seeds (docs/BENCHMARKS.md)."""
    from ray.tune.schedulers import ASHAScheduler
    return ASHAScheduler(time_attr="training_iteration", metric=METRIC, mode="max", max_t=steps + 1,
                         grace_period=min(2, steps), reduction_factor=2)


def space_knobs():
    """The names of all registered knobs, in all_knobs() order (a generator)."""
    from trainscout.spaces import all_knobs
    return (k.name for k in all_knobs())


def make_searcher(space: Space, name: str, ostorage, sampler, start: list[dict] | None = None, seed: int = 0,
                  ranker=None, target: int | None = None):
    """Ray Tune's OptunaSearch on the study `name`, handing Tune only configurations the study has not measured nor
    is measuring. A resumed sampler starts its seed's draws again (a 4-trial search, killed and resumed, ended with
    2 distinct configurations), and TPE proposes its best again and again (skipping such a draw does not move it:
    the samplers ignore FAIL trials). So a draw equal to such a configuration is marked FAIL, with the user
    attribute "skipped", and replaced by a random configuration the study has not measured (enqueued, user
    attribute "explore"); where none is found (a space measured in full) the repeat runs, and the store answers it.
    Each Optuna trial carries its Tune trial's id (TUNE_ID): a resume matches one left RUNNING to the store's row.
    With a ranker (make_ranker), once the start points are drawn its proposal comes before the sampler's (enqueued,
    user attribute "ranked" saying why) while it has one.

    target: the trials this run adds toward --trials (None: until the time budget). Tune asks for trials without a
    count (num_samples=-1) and the searcher ends the run once `target` trials that count have ended: a draw refused
    or pruned before it runs (FREE) costs no device time and is replaced; FREE_RUN of them in a row end the drawing
    (stopped_why says so)."""
    import optuna
    from ray.tune.search import Searcher
    from ray.tune.search.optuna import OptunaSearch
    states = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED, optuna.trial.TrialState.RUNNING)
    size = math.prod(len(v) for v in space.domains.values())  # at least the number of distinct configurations
    scratch = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))  # in memory: random draws

    def key(params: dict) -> str:
        return json.dumps(params, sort_keys=True, default=str)

    def unmeasured(measured: set[str]) -> dict | None:
        for _ in range(RANDOM_TRIES):
            t = scratch.ask()
            space.sample(t)
            if key(t.params) not in measured:
                return t.params
        return None

    class DistinctOptunaSearch(OptunaSearch):
        counted, free_run, in_flight, stopped_why = 0, 0, set(), None
        reported: dict  # Tune trial id -> the last step told to Optuna as an intermediate value

        def on_trial_result(self, trial_id, result):
            if store_failure() is not None:
                return
            try:
                super().on_trial_result(trial_id, result)
                self.reported = getattr(self, "reported", None) or {}
                self.reported[trial_id] = result.get("training_iteration")
            except Exception as e:  # noqa: BLE001
                if (why := guard.failure_of(e)) is None:
                    raise
                store_failed(why)

        def suggest(self, trial_id):
            if store_failure() is not None:
                return None  # the store failed: nothing more is drawn (the stopper ends the run)
            if target is not None and (self.counted >= target or self.free_run >= FREE_RUN):
                return Searcher.FINISHED
            if target is not None and self.counted + len(self.in_flight) >= target:
                return None  # the running trials may end the search; ask again when one ends
            if self.free_run >= FREE_RUN:
                return Searcher.FINISHED
            try:
                config = self._suggest(trial_id)
                if isinstance(config, dict):
                    self.in_flight.add(trial_id)
                return config
            except Exception as e:  # noqa: BLE001 - a storage failure stops the search, in one line (run_search)
                if (why := guard.failure_of(e)) is None:
                    raise
                store_failed(why)
                return None

        def _suggest(self, trial_id):
            if ranker is not None:
                trials = self._ot_study.get_trials(deepcopy=False)
                if not any(t.state == optuna.trial.TrialState.WAITING for t in trials):  # start points first
                    proposal = ranker.propose(trials)
                    if proposal is not None:
                        self._ot_study.enqueue_trial(proposal[0], user_attrs={"ranked": proposal[1]})
            config = super().suggest(trial_id)
            drawn = self._ot_trials[trial_id]
            drawn.set_user_attr(TUNE_ID, trial_id)
            _NUMBERS[trial_id] = drawn.number
            others = [t for t in self._ot_study.get_trials(deepcopy=False, states=states) if t.number != drawn.number]
            twin = next((t for t in others if t.params == drawn.params), None)
            measured = {key(t.params) for t in others}
            fresh = unmeasured(measured) if twin is not None and len(measured) < size else None
            if fresh is None:
                return config
            # PRUNED, not FAIL: nothing failed (the dashboard showed a failure), and TPE, which ignores a FAIL and so
            # proposed the same configuration again, counts a pruned trial among the worse ones
            drawn.set_user_attr("skipped", f"a draw of trial {twin.number}'s configuration again")
            drawn.set_user_attr("status", "skipped")
            self._ot_study.tell(drawn, state=optuna.trial.TrialState.PRUNED)
            del self._ot_trials[trial_id]
            self._ot_study.enqueue_trial(fresh, user_attrs={"explore": f"instead of trial {drawn.number}'s draw"})
            config = super().suggest(trial_id)
            self._ot_trials[trial_id].set_user_attr(TUNE_ID, trial_id)
            _NUMBERS[trial_id] = self._ot_trials[trial_id].number
            return config

        def on_trial_complete(self, trial_id, result=None, error=False):
            if (result or {}).get("store_failed") or store_failure() is not None:
                return  # left RUNNING in the study: a resume settles it from the store's rows
            if trial_id in self.in_flight:
                self.in_flight.discard(trial_id)
                if not error and (result or {}).get("status") in FREE:
                    self.free_run += 1
                    if self.free_run == FREE_RUN:
                        self.stopped_why = (f"stopped drawing: the last {FREE_RUN} draws were refused or pruned before "
                                            "running (see their reasons in the table): narrow the space with --set "
                                            "or --space")
                else:
                    self.counted, self.free_run = self.counted + 1, 0
            try:
                self._complete(trial_id, result, error)
            except Exception as e:  # noqa: BLE001
                if (why := guard.failure_of(e)) is None:
                    raise
                store_failed(why)

        def _complete(self, trial_id, result=None, error=False):
            drawn = self._ot_trials.get(trial_id)
            if drawn is not None and result and trial_id not in self._completed_trials:
                attrs = outcome_attrs(result)
                for k, v in attrs.items():
                    drawn.set_user_attr(k, v)
                set_constraint(drawn, attrs)
                if attrs["status"] == Status.UNSCHEDULED:  # nothing ran: FAIL, which the samplers ignore
                    result, error = None, True
                if attrs["status"] == Status.STOPPED:  # ASHA stopped it (or stopped it before): PRUNED, with each
                    # reported step as an intermediate value (OptunaSearch.on_trial_result), the last its value;
                    # Tune hands the step ASHA stopped it at to on_trial_complete alone
                    step = result.get("training_iteration")
                    if step is not None and (getattr(self, "reported", None) or {}).get(trial_id) != step:
                        drawn.report(result.get(METRIC) or 0.0, step)
                    self._ot_study.tell(drawn, state=optuna.trial.TrialState.PRUNED)
                    self._completed_trials.add(trial_id)
                    return
            super().on_trial_complete(trial_id, result, error)

    searcher = DistinctOptunaSearch(space=space.sample, metric=METRIC, mode="max", sampler=sampler, study_name=name,
                                    storage=ostorage, points_to_evaluate=start or None)
    # the objective's name, for optuna-dashboard ("Objective 0" before) and any tool reading the study
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        searcher._ot_study.set_metric_names([METRIC])
    return searcher


def recover_interrupted(ostorage, name: str, store: Store) -> int:
    """Optuna trials left RUNNING (a driver killed, interrupted, or ended by its time budget while a trial ran or
    was about to): one whose Tune trial the store holds (it finished; only the report to Optuna was lost) is told
    its stored outcome (COMPLETE with its value; PRUNED where ASHA or the stop ended it), so the sampler knows it
    was measured; one with reported steps and no row was stopped mid-run: PRUNED at its last step; any other never
    ran, or its measurement was lost: FAIL, with the user attribute status "not run". Run on every resume and after
    every run, so no trial stays RUNNING. Returns the study's trial count."""
    import optuna
    try:
        study = optuna.load_study(study_name=name, storage=ostorage)
    except KeyError:
        return 0
    rows = {t["trial"]: t for t in store.trials(name)}
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        row = rows.get(t.user_attrs.get(TUNE_ID))
        if row is not None:
            attrs = outcome_attrs({**row, METRIC: row["tokens_per_s"]})
            for k, v in attrs.items():
                ostorage.set_trial_user_attr(t._trial_id, k, v)
            set_constraint(optuna.trial.Trial(study, t._trial_id), attrs)
            if attrs["status"] == Status.STOPPED:
                if not t.intermediate_values:
                    ostorage.set_trial_intermediate_value(t._trial_id, 1, row["tokens_per_s"] or 0.0)
                ostorage.set_trial_state_values(t._trial_id, optuna.trial.TrialState.PRUNED,
                                                [row["tokens_per_s"] or 0.0])
            else:
                ostorage.set_trial_state_values(t._trial_id, optuna.trial.TrialState.COMPLETE,
                                                [row["tokens_per_s"] or 0.0])
        elif t.intermediate_values:
            ostorage.set_trial_user_attr(t._trial_id, "status", str(Status.STOPPED))
            ostorage.set_trial_state_values(t._trial_id, optuna.trial.TrialState.PRUNED,
                                            [t.intermediate_values[max(t.intermediate_values)]])
        else:
            ostorage.set_trial_user_attr(t._trial_id, "status", "not run")
            ostorage.set_trial_state_values(t._trial_id, optuna.trial.TrialState.FAIL)
    return len(study.trials)


def _verify_hint(b: dict, out: str) -> str:
    """What to run where a best's numerics differ and no training run has compared it with its reference."""
    if b["quality"] in ("same", "verified"):
        return ""
    return f"; train both to compare: trainscout verify {out} --trial {b['key'][:12]} --quality 500"


def _days(d: float) -> str:
    return f"{d:.1f} days" if d >= 1 else f"{d * 24:.2f} hours"


def summarize(store: Store, name: str, stream=sys.stdout, top: int = 3, out: str = "OUT") -> dict:
    """Print a search's outcome to stream: trials by status, per-trial overhead, the `top` fastest distinct
    configurations, each with its quality status (trial/quality.py: the same model as its reference, or not, or
    not known); a search run with --quality strict calls best only those that train the same model (same, passed,
    verified) and names the faster ones it passed over. Returns the same as a dict."""
    from trainscout.trial import quality
    store.checkpoint()
    strict = (store.search_args(name) or {}).get("quality") == "strict"
    verified = store.verified()
    trials = store.trials(name)
    by_status: dict[str, int] = {}
    for t in trials:
        by_status[t["status"]] = by_status.get(t["status"], 0) + 1
    best = []
    seen, records = set(), []
    for t in sorted((t for t in trials if t["status"] == Status.OK and t["key"]), key=lambda t: -(t["tokens_per_s"] or 0)):
        if t["key"] in seen:
            continue
        seen.add(t["key"])
        rec = store.get(t["key"])
        rec.key = t["key"]
        records.append(rec)
        status, why = quality.status(rec.metrics, verified.get(t["key"]), rec.config, rec.device)
        best.append({"key": t["key"], "config": rec.config, **{k: rec.metrics.get(k) for k in
                     ("tokens_per_s", "step_s", "mfu", "peak_memory_gib", "projected_days", "gpu_hours")},
                     "quality": status, "quality_why": why, "notes": (rec.plan or {}).get("notes", [])})
    passed_over = []
    if strict:  # the faster configurations not shown to train the same model are named, not called best
        good = [b for b in best if b["quality"] in quality.GOOD]
        line = good[0]["tokens_per_s"] if good else 0.0
        passed_over = [b for b in best if b["quality"] not in quality.GOOD and b["tokens_per_s"] > line][:top]
        best = good
    # the best of those: the fastest, or the simplest within its measured noise (analysis.ties; rule: README)
    from trainscout.analysis.ties import choose
    called = {b["key"] for b in best}
    choice = choose([r for r in records if r.key in called])
    if choice is not None and choice.is_tie:
        best.sort(key=lambda b: b["key"] != choice.best.key)  # the chosen first, the others fastest first
    tie = None if choice is None or len(choice.tied) < 2 else {
        "best": choice.best.key, "fastest": choice.fastest.key, "tied": [r.key for r in choice.tied],
        "noise": choice.noise, "why": choice.line()}
    # orchestration overhead, in the order the trials ran: a measured trial's wall time less its timed steps (those
    # of micro_batch_size=max's compared micro-batch too): start-up, build, probe, compile, warm-up, teardown
    overhead = [r.wall_s - r.metrics["timed_s"] - r.metrics.get("compared_timed_s", 0.0)
                for r in (store.get(t["key"]) for t in trials
                          if t["status"] == Status.OK and t["key"] and not t["cached"]) if r and r.wall_s]
    summary = {"search": name, "trials": len(trials), "by_status": by_status, "best": best[:top],
               "overhead_s": overhead, "tie": tie, "quality": "strict" if strict else "mark",
               "passed_over": passed_over}
    free = len(trials) - counted(trials)
    print(f"\n{len(trials)} trials: " + ", ".join(f"{v} {k}" for k, v in sorted(by_status.items()))
          + (f" ({counted(trials)} toward --trials; {free} refused or pruned before running)" if free else ""),
          file=stream)
    summary["unscheduled"] = by_status.get(Status.UNSCHEDULED, 0)
    if summary["unscheduled"]:
        print(f"{summary['unscheduled']} trial{'s were' if summary['unscheduled'] != 1 else ' was'} unscheduled: the "
              "cluster gave their ranks no room within the time limit (other searches or jobs held it; nothing ran "
              f"and the sampler learnt nothing): `trainscout search --resume {out}` runs them again; a smaller "
              "--max-concurrent leaves room", file=stream)
    if overhead:
        later = f"; after the first: median {median(overhead[1:]):.1f} s" if len(overhead) > 1 else ""
        print(f"per-trial overhead (wall − timed steps): median {median(overhead):.1f} s, range "
              f"{min(overhead):.1f}–{max(overhead):.1f} s over {len(overhead)} measured trials{later}", file=stream)
    tied = set(tie["tied"]) if tie else set()
    for i, b in enumerate(best[:top], 1):
        mfu = f", MFU {b['mfu']:.3f}" if b["mfu"] else ""
        cfg = " ".join(f"{k}={fmt(v)}" for k, v in b["config"].items())
        mark = " (tie)" if b["key"] in tied else ""
        print(f"best #{i}{mark}: {b['tokens_per_s']:,.0f} tokens/s{mfu}, {b['peak_memory_gib']:.1f} GiB, "
              f"{_days(b['projected_days'])} for the recipe\n         {cfg}\n         quality: {b['quality']}: "
              f"{b['quality_why']}{_verify_hint(b, out)}", file=stream)
        for note in b["notes"]:
            print(f"         note: {note}", file=stream)
    if tie:
        why = tie["why"] or (f"the fastest is also the simplest of the {len(tied)} configurations within the measured "
                             f"noise ({tie['noise']:.1%}) of it, marked (tie): it is the best (rule: README, ties)")
        print(f"  {why}", file=stream)
    for b in passed_over:  # --quality strict: faster, but not shown to train the same model
        print(f"not best (--quality strict): {b['tokens_per_s']:,.0f} tokens/s, quality {b['quality']}: "
              f"{b['quality_why']}{_verify_hint(b, out)}", file=stream)
    if strict and not best and trials:
        print("no configuration shown to train the same model as its reference: none is called best", file=stream)
    print(f"results: trainscout results {out}   export: trainscout export {out} --best --format all", file=stream)
    return summary
