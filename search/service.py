"""A search: Ray Tune schedules real trials, Optuna (TPE) chooses what to try next, ASHA stops what is
clearly slower, and the store answers every configuration that was already measured.

Each Tune trial is a small Ray actor that runs one trainscout trial (its ranks are Ray Train workers it owns,
so they die with it), reports rank 0's throughput after every timed step (ASHA's signal), stores the record
the moment it exists, and reports infeasible outcomes (oom, invalid) as a value of 0 so the sampler learns to
avoid them (an exception would be a FAIL, which TPE ignores).
"""
from __future__ import annotations

import json
import os
import sys
import time
import warnings
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from trainscout.spaces import ConfigError, fmt
from trainscout.store import Store, default_url, measurement_key, open_store
from trainscout.trial import execute, hardware, prepare
from trainscout.trial.runner import context, remove_orphaned_placement_groups
from trainscout.trial.status import DETERMINISTIC, Status

from .space import Space, load_space_file

if TYPE_CHECKING:
    from trainscout.trial.records import TrialSpec

METRIC = "tokens_per_s"
MEMORY_MARGIN = 0.10  # a configuration predicted over the GPU's memory by more than this is not launched


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
        store.add_trial(base["search"], trial_id, None, Status.INVALID, False, 0.0, settings)
        tune.report({METRIC: 0.0, "status": str(Status.INVALID), "error": str(e), "cached": False})
        return
    mem = base.get("memory")
    # predicted clearly over the GPU's memory: not launched, recorded with the prediction (max finds its own fit)
    if mem and not spec.plan["micro_batch_probe"]:
        from trainscout.trial import memory
        predicted = memory.predict(spec, mem["calibration"])
        if predicted > mem["capacity"] * (1 + mem["margin"]):
            gib = predicted / memory.GiB
            store.add_trial(base["search"], trial_id, None, Status.PRUNED, False, 0.0,
                            dict(spec.config, predicted_gib=round(gib, 2)))
            tune.report({METRIC: 0.0, "status": str(Status.PRUNED), "cached": False, "predicted_gib": gib,
                         "error": f"predicted {gib:.1f} GiB per rank > {mem['capacity'] / memory.GiB:.0f} GiB"})
            return
    key = measurement_key(spec, base["hardware"], hardware.versions())
    record = store.get(key)
    cached = record is not None and record.status in DETERMINISTIC
    if not cached and (value := _stopped_before(store, base["search"], settings)) is not None:
        # ASHA ended this configuration earlier in the search: TPE proposed it again; it gets the same answer
        store.add_trial(base["search"], trial_id, None, Status.STOPPED, True, value, settings)
        tune.report({METRIC: value, "status": str(Status.STOPPED), "cached": True})
        return
    if not cached:
        seen = []

        def on_step(m):  # the best step so far: one slow step (noise, a late allocation) does not end a trial
            seen.append(m["tokens_per_s"])
            tune.report({METRIC: max(seen), "step_s": m["step_s"], "status": str(Status.RUNNING), "cached": False})
        for attempt in range(1 + base.get("max_failures", 0)):  # only a crash is measured again
            record = execute(spec, timeout=base["timeout"], storage=base["trial_dir"], address=base["address"],
                             on_step=on_step)
            record = record.replace(attempt=attempt + 1, fault=spec.fault or None)
            if record.status != Status.CRASH:
                break
        store.replace(key, record)  # a crash or timeout measured again: the newer record wins
    m = record.m
    value = m.get(METRIC, 0.0) if record.ok else 0.0
    store.add_trial(base["search"], trial_id, key, record.status, cached, value, spec.config)
    tune.report({METRIC: value, "status": str(record.status), "cached": cached, "error": record.error,
                 "projected_days": m.get("projected_days"), "mfu": m.get("mfu"), "key": key,
                 "peak_memory_gib": m.get("peak_memory_gib")})


def _stopped_before(store, search: str, settings: dict) -> float | None:
    """The best step of an earlier trial of this search that ASHA stopped with the same settings (None: none)."""
    same = json.loads(json.dumps(settings, sort_keys=True, default=str))
    for t in store.trials(search):
        if t["status"] == Status.STOPPED and {k: t["config"].get(k) for k in same} == same:
            return t["tokens_per_s"] or 0.0
    return None


def _progress_callback(url: str, search: str, printer):
    from ray.tune import Callback

    class Progress(Callback):
        """Records trials ASHA stopped early, and prints a row per finished trial."""

        def on_trial_complete(self, iteration, trials, trial, **info):
            remove_orphaned_placement_groups()
            r = trial.last_result or {}
            if r.get("status") == Status.RUNNING:  # stopped by the scheduler before its last step
                open_store(url).add_trial(search, trial.trial_id, None, Status.STOPPED, False, r.get(METRIC),
                                          trial.config)
                r = dict(r, status=str(Status.STOPPED))
            printer(trial, r)

        def on_trial_error(self, iteration, trials, trial, **info):
            remove_orphaned_placement_groups()
            open_store(url).add_trial(search, trial.trial_id, None, Status.CRASH, False, 0.0, trial.config)
            printer(trial, {"status": str(Status.CRASH), METRIC: 0.0})

    return Progress()


class Printer:
    """The live table: one row per finished trial, with the best so far."""

    def __init__(self, space: Space, stream=None):
        self.space, self.stream, self.best, self.n = space, stream, None, 0
        self.header = False

    def __getstate__(self):  # Ray Tune pickles its callbacks; an open stream is not picklable
        return dict(self.__dict__, stream=None)

    def __call__(self, trial, r: dict):
        out = self.stream or sys.stdout
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
        print(f"{self.n:>3} {trial.trial_id[-10:]:10} {status:8} {v:>11,.0f} "
              f"{days:>11} {(self.best or 0):>11,.0f}  {searched}", file=out, flush=True)


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
    """Check everything before anything is started or written: (space, base spec, hardware)."""
    if args.trials is None and args.time_budget_s is None:
        raise ConfigError("--trials", "give --trials N or --time-budget (e.g. 30m)")
    if args.trials is not None and args.trials < 1:
        raise ConfigError("--trials", f"--trials {args.trials} is not allowed: give a positive integer")
    if not isinstance(args.max_failures, int) or args.max_failures < 0:
        raise ConfigError("--max-failures", f"--max-failures {args.max_failures} is not allowed: give an integer >= 0")
    fault_schedule(os.environ.get("TRAINSCOUT_FAULT_SCHEDULE"))
    from trainscout.trial.models import absolute
    args.model = absolute(args.model)  # a relative config.json path would not resolve in the trials' directories
    from trainscout.trial.runner import detect_device
    device = detect_device(args.device)
    hw = hardware.fingerprint(device, args.gpus_per_trial)
    workers = args.gpus_per_trial
    # a trial of the defaults validates the model, recipe and worker count
    base = prepare(args.model, {}, workers=workers, steps=args.steps, warmup=args.warmup, hw=hw, **args.recipe)
    ctx = context(base.model_config, base.recipe["global_batch"], workers, hw)
    raw = load_space_file(args.space) if args.space else {}
    return Space.build(raw, args.sets, ctx), base, hw


def run_search(args: SearchArgs, stream=sys.stdout) -> dict:
    """Run (or continue) a search; returns a summary with the best configurations."""
    space, _, hw = validate(args)
    if args.storage:
        store = open_store(args.storage)  # a bad URL is refused before anything is written
        os.makedirs(args.out, exist_ok=True)
    else:
        os.makedirs(args.out, exist_ok=True)
        store = open_store(default_url(args.out))
    url = store.url
    name = args.search_name()
    saved = store.search_args(name)
    if saved is None:
        store.add_search(name, asdict(args))
    done = store.trials(name)
    remaining = None if args.trials is None else args.trials - len(done)
    if remaining is not None and remaining <= 0:
        return summarize(store, name, stream, out=args.out)

    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # Tune's verbose=0 then prints nothing of its own
    import optuna
    import ray
    from ray import tune
    from ray.tune.search.optuna import OptunaSearch

    from trainscout.trial.runner import ensure_ray
    ensure_ray(args.address)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    ostorage = optuna.storages.RDBStorage(url, engine_kwargs=Store._engine_kwargs(url))
    _fail_interrupted(ostorage, name)
    sampler = make_sampler(args.seed, args.trials)
    calibration = None  # the memory model fitted once on this GPU's stored peaks: pruning and the start point use it
    if hw["device"] == "cuda" and hw.get("gpu_memory_gib"):
        from trainscout.trial import memory
        calibration = memory.fit(memory.calibration_pairs(store.measurements(), hw.get("gpu")))
    start = [] if done else start_points(args, space, hw, calibration)
    searcher = OptunaSearch(space=space.sample, metric=METRIC, mode="max", sampler=sampler,
                            study_name=name, storage=ostorage, points_to_evaluate=start or None)
    scheduler = make_scheduler(args.steps)
    if hw["device"] == "cuda":
        concurrent = max(1, int(ray.cluster_resources().get("GPU", 0)) // args.gpus_per_trial)
    else:
        concurrent = max(1, int(ray.cluster_resources().get("CPU", 1)) // (1 + args.gpus_per_trial))
    base = {"model": args.model, "workers": args.gpus_per_trial, "steps": args.steps, "warmup": args.warmup,
            "hardware": hw, "seed": args.seed, "recipe": args.recipe, "storage": url, "search": name,
            "timeout": args.timeout, "address": args.address, "max_failures": args.max_failures,
            "faults": fault_schedule(os.environ.get("TRAINSCOUT_FAULT_SCHEDULE")), "offset": len(done),
            "trial_dir": os.path.abspath(os.path.join(args.out, "trials")), "knob_names": list(space_knobs())}
    if hw["device"] == "cuda" and hw.get("gpu_memory_gib"):
        base["memory"] = {"capacity": hw["gpu_memory_gib"] * memory.GiB, "margin": MEMORY_MARGIN,
                          "calibration": calibration}
    printer = Printer(space, None if stream is sys.stdout else stream)
    tuner = tune.Tuner(
        tune.with_resources(tune.with_parameters(_trainable, base=base), {"CPU": 1}),
        tune_config=tune.TuneConfig(search_alg=searcher, scheduler=scheduler,
                                    num_samples=remaining if remaining is not None else -1,
                                    max_concurrent_trials=concurrent, time_budget_s=args.time_budget_s,
                                    trial_name_creator=_numbered if base["faults"] else None,
                                    reuse_actors=False),  # a stopped trial's actor dies, and its ranks with it
        run_config=tune.RunConfig(name=f"{name}-{int(time.time())}", storage_path=os.path.abspath(os.path.join(args.out, "tune")),
                                  verbose=0, callbacks=[_progress_callback(url, name, printer)],
                                  failure_config=tune.FailureConfig(max_failures=0)))
    print(f"search {name}: model {args.model} on {hw.get('gpu') or hw['cpu']} ({hw['device']}), "
          f"{args.gpus_per_trial} {'GPU' if hw['device'] == 'cuda' else 'worker'}(s) per trial, {concurrent} at once; "
          f"{len(done)} trials done, {remaining if remaining is not None else 'until the time budget'} to go; "
          f"store {url}", file=stream, flush=True)
    tuner.fit()
    return summarize(store, name, stream, out=args.out)


def start_points(args: SearchArgs, space: Space, hw: dict, calibration: dict | None) -> list[dict]:
    """On a GPU, the first trials are the strong defaults a person would set by hand: every searched knob at its
    default, with the largest micro-batch that fits (probed: micro_batch_size=max; else the largest the memory
    model predicts to fit in 85 % of the GPU's memory) - and, where compile is searched, the same with compile on
    (the yardstick's own best rows are compiled), the loss compiled too where loss_kernel is searched. With two or
    more trials at once they run side by side."""
    if hw["device"] != "cuda" or not hw.get("gpu_memory_gib") or "micro_batch_size" not in space.domains:
        return []
    from trainscout.spaces import get
    defaults = {k: get(k).default if get(k).default in dom else dom[0] for k, dom in space.domains.items()}
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
    return [applicable(point), *compiled]


def _largest_fit(args: SearchArgs, space: Space, hw: dict, calibration: dict | None, defaults: dict) -> dict | None:
    """The defaults at the largest micro-batch the memory model predicts to fit in 85 % of the GPU (None: none)."""
    import optuna

    from trainscout.trial import memory
    for mbs in sorted(space.domains["micro_batch_size"], reverse=True):
        point = dict(defaults, micro_batch_size=mbs)
        try:  # the configuration the point means, as the sampler would build it
            spec = prepare(args.model, space.sample(optuna.trial.FixedTrial(point)), workers=args.gpus_per_trial,
                           hw=hw, **args.recipe)
        except ConfigError:
            continue
        if memory.predict(spec, calibration) <= 0.85 * hw["gpu_memory_gib"] * memory.GiB:
            return point
    return None


def make_sampler(seed: int, trials: int | None):
    """TPE made for conditional spaces (multivariate, grouped), seeded; a few random trials first."""
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
    from trainscout.spaces import all_knobs
    return (k.name for k in all_knobs())


def _fail_interrupted(ostorage, name: str) -> None:
    """Optuna trials left RUNNING by a driver that was killed are marked FAIL (their measurement was lost)."""
    import optuna
    try:
        study = optuna.load_study(study_name=name, storage=ostorage)
    except KeyError:
        return
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        ostorage.set_trial_state_values(t._trial_id, optuna.trial.TrialState.FAIL)


def _days(d: float) -> str:
    return f"{d:.1f} days" if d >= 1 else f"{d * 24:.2f} hours"


def summarize(store: Store, name: str, stream=sys.stdout, top: int = 3, out: str = "OUT") -> dict:
    store.checkpoint()
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
        best.append({"key": t["key"], "config": rec.config, **{k: rec.metrics.get(k) for k in
                     ("tokens_per_s", "step_s", "mfu", "peak_memory_gib", "projected_days", "gpu_hours")}})
    # orchestration overhead: a measured trial's wall time less its timed steps (start-up, build, warm-up, teardown)
    overhead = sorted(r.wall_s - r.metrics["timed_s"] for r in (store.get(t["key"]) for t in trials
                      if t["status"] == Status.OK and t["key"] and not t["cached"]) if r and r.wall_s)
    summary = {"search": name, "trials": len(trials), "by_status": by_status, "best": best[:top],
               "overhead_s": overhead}
    print(f"\n{len(trials)} trials: " + ", ".join(f"{v} {k}" for k, v in sorted(by_status.items())), file=stream)
    if overhead:
        print(f"per-trial overhead (wall − timed steps): median {overhead[len(overhead) // 2]:.1f} s, "
              f"range {overhead[0]:.1f}–{overhead[-1]:.1f} s over {len(overhead)} measured trials", file=stream)
    for i, b in enumerate(best[:top], 1):
        mfu = f", MFU {b['mfu']:.3f}" if b["mfu"] else ""
        cfg = " ".join(f"{k}={fmt(v)}" for k, v in b["config"].items())
        print(f"best #{i}: {b['tokens_per_s']:,.0f} tokens/s{mfu}, {b['peak_memory_gib']:.1f} GiB, "
              f"{_days(b['projected_days'])} for the recipe\n         {cfg}", file=stream)
    print(f"results: trainscout results {out}   export: trainscout export {out} --best --format all", file=stream)
    return summary
