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
import math
import os
import signal
import stat
import sys
import threading
import time
import warnings
from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING

from trainscout.spaces import ConfigError, fmt
from trainscout.store import Store, check_folder, claims, default_url, measurement_key, one_line, open_store, \
    storage_url
from trainscout.trial import execute, hardware, prepare
from trainscout.trial.memory import MARGIN as MEMORY_MARGIN  # predicted over the GPU's memory by more: not launched
from trainscout.trial.metrics import median
from trainscout.trial.runner import Cancelled, context
from trainscout.trial.status import DETERMINISTIC, Status

from .space import Space, load_space_file

if TYPE_CHECKING:
    from trainscout.trial.records import TrialSpec

METRIC = "tokens_per_s"
LOCK_FILE = ".trainscout-search.lock"  # in --out: held (flock) by the driver of the search running there
TUNE_ID = "tune_trial_id"  # an Optuna trial's user attribute: the Tune trial it was drawn for
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
    """One Tune trial: measure (or look up) one configuration and report it."""
    from ray import tune
    store = open_store(base["storage"])
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
        try:  # the claim is released whatever happens here (a held one would keep other searches waiting)
            if spec.quality and "reference_plan" in spec.quality:  # one gate step per change, per search
                from trainscout.trial import quality
                gate = quality.gate_key(spec)
                known = store.quality(gate, "gate")
                if known is not None:
                    spec = spec.replace(quality=dict(spec.quality, known=dict(known, cached=True)))
            record = _run(spec, base, trial_id)
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


def _run(spec, base: dict, trial_id: str):
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
            if r.get("status") == Status.RUNNING:  # stopped by the scheduler before its last step
                _cancel(trial.trial_id, stop=True)  # its actor is gone: the ranks still run its steps
                open_store(url).add_trial(search, trial.trial_id, None, Status.STOPPED, False, r.get(METRIC),
                                          trial.config)
                r = dict(r, status=str(Status.STOPPED))
            printer(trial, r)

        def on_trial_error(self, iteration, trials, trial, **info):
            _cancel(trial.trial_id)
            try:  # a Tune error holds the traceback: its last line says what failed
                lines = [ln.strip() for ln in str(trial.get_error() or "").splitlines() if ln.strip()]
            except Exception:  # the error file may be gone; the row is what matters
                lines = []
            why = lines[-1][:2000] if lines else "the trial's actor failed"
            open_store(url).add_trial(search, trial.trial_id, None, Status.CRASH, False, 0.0, trial.config, error=why)
            printer(trial, {"status": str(Status.CRASH), METRIC: 0.0, "error": why})

    return Progress()


class Printer:
    """The live table: one row per finished trial, with the best so far, and why a trial failed or did not run."""

    def __init__(self, space: Space, stream=None, *, total: int | None = None, budget_s: float | None = None,
                 ranks: int = 1, unit: str = "GPU"):
        self.space, self.stream, self.best, self.n = space, stream, None, 0
        self.to_stderr = stream is sys.stderr  # --json: the table goes to stderr, stdout holds the JSON alone
        self.header = False
        # the progress line: trials to go (None: until the budget), the budget, the ranks each trial holds
        self.total, self.budget_s, self.ranks, self.unit = total, budget_s, ranks, unit
        self.t0, self.device_s = time.time(), 0.0

    def progress(self) -> str:
        """One line: trials done of the total, elapsed and ETA, best so far, device-seconds the trials held."""
        elapsed = time.time() - self.t0
        eta = []
        if self.total:
            eta.append(elapsed / self.n * max(0, self.total - self.n))
        if self.budget_s:
            eta.append(max(0.0, self.budget_s - elapsed))
        left = f"ETA {_clock(min(eta))}" if eta else "ETA -"
        done = f"{self.n}/{self.total}" if self.total else f"{self.n}"
        best = f"{self.best:,.0f} tok/s" if self.best else "-"
        return (f"    {done} trials, {_clock(elapsed)} elapsed, {left}, best {best}, "
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
        print(f"{self.n:>3} {trial.trial_id[-10:]:10} {status:8} {v:>11,.0f} "
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


def _refuse_existing(store: Store, name: str, out: str, resume: bool) -> dict | None:
    """The saved settings of the search `name`; a new search (not resume) of a name the store holds is refused."""
    saved = store.search_args(name)
    if saved is not None and not resume:
        n = len(store.trials(name))
        raise ConfigError("--out", f"--out {out} already holds the search {name} ({n} trial{'s' if n != 1 else ''}): "
                                   f"use --resume {out} to continue it (a larger --trials runs more), or another --out")
    return saved


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


def interrupted() -> bool:
    """Whether Ctrl-C ended the search running (or last run) in this process."""
    return _INTERRUPTED.is_set()


def _interrupt_stopper():
    from ray.tune import Stopper

    class StopOnInterrupt(Stopper):
        """Ends the whole experiment once Ctrl-C was pressed (Tune asks on every step of its loop)."""

        def __call__(self, trial_id, result):
            return False

        def stop_all(self):
            return interrupted()  # a module function: a pickled copy of the stopper reads the same flag
    return StopOnInterrupt()


def run_search(args: SearchArgs, stream=None, resume: bool = False) -> dict:
    """Run (or, resume=True, continue) a search; returns a summary with the best configurations ("interrupted":
    True when Ctrl-C ended it). A new search into a store that holds a search of its name (the --out folder's) is
    refused, and so is a second search on a folder while one runs there."""
    stream = stream or sys.stdout
    space, _, hw = validate(args)
    name = args.search_name()
    store = open_store(args.storage) if args.storage else None  # a bad URL is refused before anything is written
    if store is None and os.path.exists(os.path.join(args.out, "results.db")):
        store = open_store(default_url(args.out))
    if store is not None:  # refused before the folder is touched
        _refuse_existing(store, name, args.out, resume)
    os.makedirs(args.out, exist_ok=True)
    lock = hold_folder(args.out)
    lease = None
    try:
        store = store or open_store(default_url(args.out))
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
    url = store.url
    rows = store.trials(name)
    done = [t for t in rows if t["status"] != Status.UNSCHEDULED]  # an unscheduled trial ran nothing: run it again
    remaining = None if args.trials is None else args.trials - len(done)
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
                             ranker=ranker)
    scheduler = make_scheduler(args.steps)
    from . import cluster
    attached = bool(args.address or os.environ.get("RAY_ADDRESS"))
    concurrent, why_concurrent = cluster.concurrency(hw, args.gpus_per_trial, args.max_concurrent, attached)
    base = {"model": args.model, "workers": args.gpus_per_trial, "steps": args.steps, "warmup": args.warmup,
            "hardware": hw, "seed": args.seed, "recipe": args.recipe, "storage": url, "search": name,
            "timeout": args.timeout, "address": args.address, "max_failures": args.max_failures,
            "faults": fault_schedule(os.environ.get("TRAINSCOUT_FAULT_SCHEDULE")), "offset": len(rows),
            "trial_dir": os.path.abspath(os.path.join(args.out, "trials")), "knob_names": list(space_knobs()),
            "one_node": args.one_node}
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
        tune.with_resources(tune.with_parameters(_trainable, base=base), {"CPU": cluster.TRIAL_CPU}),
        tune_config=tune.TuneConfig(search_alg=searcher, scheduler=scheduler,
                                    num_samples=remaining if remaining is not None else -1,
                                    max_concurrent_trials=concurrent, time_budget_s=args.time_budget_s,
                                    trial_name_creator=_numbered if base["faults"] else None,
                                    reuse_actors=True),  # one trial after another in the same actor process
        run_config=tune.RunConfig(name=f"{name}-{int(time.time())}", storage_path=os.path.abspath(os.path.join(args.out, "tune")),
                                  verbose=0, callbacks=[_progress_callback(url, name, printer)],
                                  stop=_interrupt_stopper(), failure_config=tune.FailureConfig(max_failures=0)))
    nodes = f" on {hw['nodes']} node{'s' if hw['nodes'] != 1 else ''}" if hw.get("nodes") else ""
    print(f"search {name}: model {args.model} on {hw.get('gpu') or hw['cpu']} ({hw['device']}){nodes}, "
          f"{args.gpus_per_trial} {'GPU' if hw['device'] == 'cuda' else 'worker'}(s) per trial"
          f"{'' if args.one_node else ' (may be split over nodes)'}, {concurrent} at once ({why_concurrent}); "
          f"{len(done)} trials done, {remaining if remaining is not None else 'until the time budget'} to go; "
          f"store {secrets.masked(url)}", file=stream, flush=True)
    for note in notes:
        print(f"  {note}", file=stream, flush=True)
    for p, why in known:
        print(f"  start point from the store ({why}): " + " ".join(f"{k}={fmt(v)}" for k, v in sorted(p.items())),
              file=stream, flush=True)
    with _catch_interrupt():
        tuner.fit()
    summary = summarize(store, name, stream, out=args.out)
    if interrupted():
        summary["interrupted"] = True
    return summary


def start_points(args: SearchArgs, space: Space, hw: dict, calibration: dict | None,
                 notes: list[str] | None = None) -> list[dict]:
    """On a GPU, the first trials are the strong defaults a person would set by hand: every searched knob at its
    default, with the largest micro-batch that fits (probed: micro_batch_size=max; else the largest the memory
    model predicts to fit in 85 % of the GPU's memory) - and, where compile is searched, the same with compile on
    (the yardstick's own best rows are compiled), the loss compiled too where loss_kernel is searched, and that
    again with FP8 matmuls (fp8=tensorwise) where fp8 is searched and the GPU has FP8 tensor cores (the Llama-1B
    shape on an H200: +17.5 % over compiled alone). With two or more trials at once they run side by side. Where the defaults do not fit even at the smallest micro-batch, the
    cheapest memory saver of the space that makes them fit is added first (fits), and `notes` says which and why."""
    if hw["device"] != "cuda" or not hw.get("gpu_memory_gib") or "micro_batch_size" not in space.domains:
        return []
    from trainscout.spaces import get
    defaults = fits(args, space, hw, calibration, space_defaults(space), notes)
    if defaults is None:
        return []
    if "max" in space.domains["micro_batch_size"]:  # probed in the trial, from the memory model's estimate up
        point = dict(defaults, micro_batch_size="max")
    else:
        point = _largest_fit(args, space, hw, calibration, defaults)
    if point is None:
        return []
    def applicable(p):  # a knob whose requirements do not hold keeps its default (compile_scope without compile)
        return {k: v for k, v in p.items() if get(k).applies(p)}
    compiled = []
    if True in space.domains.get("compile", ()) and not point["compile"]:
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
    sizes = [m for m in space.domains["micro_batch_size"] if m != "max"] or [1]
    cap, host = FIT_SHARE * hw["gpu_memory_gib"] * memory.GiB, host or psutil.virtual_memory().total

    def need(p: dict) -> tuple[float, str | None] | None:
        spec = _spec_at(args, space, hw, dict(p, micro_batch_size=min(sizes)))
        if spec is None:
            return None
        return memory.predict(spec, calibration), memory.host_refusal(spec, host, MEMORY_MARGIN)
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
                notes.append(f"the defaults do not fit at micro-batch {min(sizes)} (predicted "
                             f"{first[0] / memory.GiB:.1f} GiB > {FIT_SHARE:.0%} of {hw['gpu_memory_gib']:.0f} GiB"
                             f"{'; ' + first[1] if first[1] else ''}): the start point adds "
                             + " ".join(f"{k}={fmt(v)}" for k, v in saver.items()))
            return dict(point, **saver)
    if notes is not None:
        notes.append(f"no start point: the defaults need {first[0] / memory.GiB:.1f} GiB at micro-batch {min(sizes)} "
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


def _spec_at(args: SearchArgs, space: Space, hw: dict, point: dict) -> TrialSpec | None:
    """The trial a start point means, as the sampler would build it (None: this model refuses it)."""
    import optuna
    try:
        return prepare(args.model, space.sample(optuna.trial.FixedTrial(point)), workers=args.gpus_per_trial,
                       hw=hw, **args.recipe)
    except ConfigError:
        return None


def _largest_fit(args: SearchArgs, space: Space, hw: dict, calibration: dict | None, defaults: dict) -> dict | None:
    """The defaults at the largest micro-batch the memory model predicts to fit in FIT_SHARE of the GPU (None: none)."""
    from trainscout.trial import memory
    for mbs in sorted(space.domains["micro_batch_size"], reverse=True):
        point = dict(defaults, micro_batch_size=mbs)
        spec = _spec_at(args, space, hw, point)
        if spec is not None and memory.predict(spec, calibration) <= FIT_SHARE * hw["gpu_memory_gib"] * memory.GiB:
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
                  ranker=None):
    """Ray Tune's OptunaSearch on the study `name`, handing Tune only configurations the study has not measured nor
    is measuring. A resumed sampler starts its seed's draws again (a 4-trial search, killed and resumed, ended with
    2 distinct configurations), and TPE proposes its best again and again (skipping such a draw does not move it:
    the samplers ignore FAIL trials). So a draw equal to such a configuration is marked FAIL, with the user
    attribute "skipped", and replaced by a random configuration the study has not measured (enqueued, user
    attribute "explore"); where none is found (a space measured in full) the repeat runs, and the store answers it.
    Each Optuna trial carries its Tune trial's id (TUNE_ID): a resume matches one left RUNNING to the store's row.
    With a ranker (make_ranker), once the start points are drawn its proposal comes before the sampler's (enqueued,
    user attribute "ranked" saying why) while it has one."""
    import optuna
    from ray.tune.search.optuna import OptunaSearch
    states = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.RUNNING)
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
        def suggest(self, trial_id):
            if ranker is not None:
                trials = self._ot_study.get_trials(deepcopy=False)
                if not any(t.state == optuna.trial.TrialState.WAITING for t in trials):  # start points first
                    proposal = ranker.propose(trials)
                    if proposal is not None:
                        self._ot_study.enqueue_trial(proposal[0], user_attrs={"ranked": proposal[1]})
            config = super().suggest(trial_id)
            drawn = self._ot_trials[trial_id]
            drawn.set_user_attr(TUNE_ID, trial_id)
            others = [t for t in self._ot_study.get_trials(deepcopy=False, states=states) if t.number != drawn.number]
            twin = next((t for t in others if t.params == drawn.params), None)
            measured = {key(t.params) for t in others}
            fresh = unmeasured(measured) if twin is not None and len(measured) < size else None
            if fresh is None:
                return config
            drawn.set_user_attr("skipped", f"a draw of trial {twin.number}'s configuration again")
            self._ot_study.tell(drawn, state=optuna.trial.TrialState.FAIL)
            del self._ot_trials[trial_id]
            self._ot_study.enqueue_trial(fresh, user_attrs={"explore": f"instead of trial {drawn.number}'s draw"})
            config = super().suggest(trial_id)
            self._ot_trials[trial_id].set_user_attr(TUNE_ID, trial_id)
            return config

        def on_trial_complete(self, trial_id, result=None, error=False):
            drawn = self._ot_trials.get(trial_id)
            if drawn is not None and result and trial_id not in self._completed_trials:
                attrs = outcome_attrs(result)
                for k, v in attrs.items():
                    drawn.set_user_attr(k, v)
                set_constraint(drawn, attrs)
                if attrs["status"] == Status.UNSCHEDULED:  # nothing ran: FAIL, which the samplers ignore
                    result, error = None, True
            super().on_trial_complete(trial_id, result, error)

    return DistinctOptunaSearch(space=space.sample, metric=METRIC, mode="max", sampler=sampler, study_name=name,
                                storage=ostorage, points_to_evaluate=start or None)


def recover_interrupted(ostorage, name: str, store: Store) -> int:
    """Optuna trials left RUNNING by a driver that was killed or interrupted: one whose Tune trial the store holds
    (it finished; only the driver's report to Optuna was lost) is completed with the stored value, so the sampler
    knows it was measured; any other is marked FAIL (its measurement was lost). Returns the study's trial count."""
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
            ostorage.set_trial_state_values(t._trial_id, optuna.trial.TrialState.COMPLETE, [row["tokens_per_s"] or 0.0])
        else:
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
    seen = set()
    for t in sorted((t for t in trials if t["status"] == Status.OK and t["key"]), key=lambda t: -(t["tokens_per_s"] or 0)):
        if t["key"] in seen:
            continue
        seen.add(t["key"])
        rec = store.get(t["key"])
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
    # orchestration overhead, in the order the trials ran: a measured trial's wall time less its timed steps (those
    # of micro_batch_size=max's compared micro-batch too): start-up, build, probe, compile, warm-up, teardown
    overhead = [r.wall_s - r.metrics["timed_s"] - r.metrics.get("compared_timed_s", 0.0)
                for r in (store.get(t["key"]) for t in trials
                          if t["status"] == Status.OK and t["key"] and not t["cached"]) if r and r.wall_s]
    summary = {"search": name, "trials": len(trials), "by_status": by_status, "best": best[:top],
               "overhead_s": overhead, "quality": "strict" if strict else "mark",
               "passed_over": passed_over}
    print(f"\n{len(trials)} trials: " + ", ".join(f"{v} {k}" for k, v in sorted(by_status.items())), file=stream)
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
    for i, b in enumerate(best[:top], 1):
        mfu = f", MFU {b['mfu']:.3f}" if b["mfu"] else ""
        cfg = " ".join(f"{k}={fmt(v)}" for k, v in b["config"].items())
        print(f"best #{i}: {b['tokens_per_s']:,.0f} tokens/s{mfu}, {b['peak_memory_gib']:.1f} GiB, "
              f"{_days(b['projected_days'])} for the recipe\n         {cfg}\n         quality: {b['quality']}: "
              f"{b['quality_why']}{_verify_hint(b, out)}", file=stream)
        for note in b["notes"]:
            print(f"         note: {note}", file=stream)
    for b in passed_over:  # --quality strict: faster, but not shown to train the same model
        print(f"not best (--quality strict): {b['tokens_per_s']:,.0f} tokens/s, quality {b['quality']}: "
              f"{b['quality_why']}{_verify_hint(b, out)}", file=stream)
    if strict and not best and trials:
        print("no configuration shown to train the same model as its reference: none is called best", file=stream)
    print(f"results: trainscout results {out}   export: trainscout export {out} --best --format all", file=stream)
    return summary
