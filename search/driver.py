"""One run of a search's Tune loop on the driver: the Tuner (trainable, searcher, ASHA, start points), the callback
that records stopped trials and prints the live table's rows, the stopper, Ctrl-C (search/interrupt.py), the trackers
(search/tracking.py), and the one line a search stopped by its store ends with."""
from __future__ import annotations

import os
import socket
import sys
import threading
import time
from dataclasses import dataclass

from trainscout.search.live import Printer
from trainscout.spaces import fmt
from trainscout.store import Store, StoreError, guard, open_store
from trainscout.trial.ray_cluster import cluster_address
from trainscout.trial.status import Status, classify, host_oom_line, node_lost_line

from . import cluster, settle
from .args import SEED_RANGE, SearchArgs
from .halt import clear_store_failure, lease_failure, lease_lost, store_failed, store_failure
from .interrupt import catch_interrupt, interrupted, one_line_logs, quiet_host_oom
from .searcher import make_ranker, make_sampler, make_scheduler, make_searcher, recover_interrupted
from .nearest import nothing_line
from .space import Space
from .start import first
from .summary import clock, source_lines, sources_measured, summarize
from .tracking import trackers
from .trainable import (METRIC, TRIAL_ACTOR, before_run, capacities, counted, fault_schedule, space_knobs,
                        tune_trial)


def _cancel(tune_trial_id: str, stop: bool = False) -> None:
    """End the worker group of a Tune trial whose actor ended before its trial did; stop: ASHA stopped it, and its
    ranks leave at their next step boundary, keeping the group for the next trial (trial.pool.Pool.stop)."""
    from trainscout.trial import pool
    if stop:
        pool.pool().stop.remote(owner=tune_trial_id)
    else:
        pool.pool().cancel.remote(owner=tune_trial_id)


def guarded_write(fn, search: str | None = None) -> bool:
    """Run a store write of the driver inside Tune's loop; a storage failure is recorded, not raised into Tune
    (which would print its traceback). False when it failed, or when another driver took over the lease of
    `search` (checked first: nothing is written then)."""
    from trainscout.store import claims
    try:
        if (lease := claims.driving(search)) is not None and (line := lease.check()) is not None:
            lease_lost(line)
            return False
        fn()
        return True
    except Exception as e:  # only a storage failure is caught
        why = guard.failure_of(e)
        if why is None:
            raise
        store_failed(why)
        return False


def progress_callback(url: str, search: str, printer):
    """The search's Tune callback (Progress), writing to the store at url and printing rows with printer."""
    from ray.tune import Callback

    class Progress(Callback):
        """Records trials ASHA stopped early, and prints a row per finished trial."""

        def on_step_begin(self, iteration, trials, **info):  # the running trials, for the time budget's end
            _RUNNING.clear()
            _RUNNING.update(t.trial_id for t in trials if t.status == "RUNNING")

        def on_trial_complete(self, iteration, trials, trial, **info):
            r = trial.last_result or {}
            if r.get("store_failed"):  # the trial could not write its outcome: the search stops (run_search says)
                store_failed(r["store_failed"])
                return
            if r.get("status") == Status.HOST_OOM:  # the host's memory monitor killed its ranks: the search ends
                _host_oom(r.get("error") or "killed by the host's memory monitor")
            if r.get("status") == Status.NODE_LOST:  # its ranks' node left the cluster: the search goes on
                _not_counted(trial.trial_id)
            if r.get("status") == Status.RUNNING:  # stopped by the scheduler before its last step
                _cancel(trial.trial_id, stop=True)  # its actor is gone: the ranks still run its steps
                if not guarded_write(lambda: open_store(url).add_trial(search, trial.trial_id, None, Status.STOPPED,
                                                                       False, r.get(METRIC), trial.config), search):
                    return
                r = dict(r, status=str(Status.STOPPED))
            printer(trial, r)

        def on_trial_error(self, iteration, trials, trial, **info):
            _cancel(trial.trial_id)
            try:  # a Tune error holds the traceback: its last line says what failed
                lines = [ln.strip() for ln in str(trial.get_error() or _local_error(trial)).splitlines() if ln.strip()]
            except Exception:  # noqa: BLE001 - the error file may be gone; the row is what matters
                lines = []
            why = lines[-1][:2000] if lines else "the trial's actor failed"
            status, text = Status.CRASH, "\n".join(lines)
            kind = classify(text)
            if kind == Status.HOST_OOM:  # the memory monitor killed the search's own actor
                status, why = Status.HOST_OOM, host_oom_line(text)
                _host_oom(why)
            elif kind == Status.NODE_LOST or (where := _lost_node(text)):  # the trial's actor's node left the cluster
                status, why = Status.NODE_LOST, node_lost_line(text, None if kind == Status.NODE_LOST else where)
                _not_counted(trial.trial_id)
            if guarded_write(lambda: open_store(url).add_trial(search, trial.trial_id, None, status, False, 0.0,
                                                               trial.config, error=why), search):
                printer(trial, {"status": str(status), METRIC: 0.0, "error": why})

    return Progress()


_SEARCHER, _UNCOUNTED = [], set()  # the running search's searcher (search/study.py); trials taken back from it


def _not_counted(trial_id: str) -> None:
    """A trial lost with its node (node_lost) does not count toward --trials: the searcher counted it as it ended
    (Tune tells the searcher before the callbacks), so it is taken back and the searcher draws another in its place."""
    if _SEARCHER and trial_id not in _UNCOUNTED:
        _UNCOUNTED.add(trial_id)
        _SEARCHER[0].counted = max(0, _SEARCHER[0].counted - 1)


def _lost_node(error: str) -> str | None:
    """The node, named, that an actor's failure (the trial's actor unreachable: "Socket closed") was lost with, asked
    of Ray (the actor's node, and whether it is alive and its raylet answers): before the GCS marks a node dead, its
    actors' errors say nothing of it. None: no actor's failure, or its node is alive."""
    from trainscout.trial.pool import lost_in
    return lost_in(error)


def _local_error(trial) -> str:
    """The trial's error as Tune wrote it in its local folder (get_error reads the copy in the experiment's storage,
    which Tune syncs later: empty when the callback runs)."""
    try:
        with open(trial.error_file, encoding="utf-8", errors="replace") as f:
            return f.read()
    except (OSError, TypeError):
        return ""


def _warm_first(point: dict, base: dict, one_node: bool) -> None:
    """Start the worker group of the search's first trial while Tune starts its trial actor (trial.runner.warm);
    a first point the rules refuse warms nothing (its trial says why)."""
    from trainscout.spaces import ConfigError
    from trainscout.trial.runner import warm

    from .trainable import trial_spec
    try:
        spec = trial_spec({k: v for k, v in point.items() if k in base["knob_names"]}, base)
    except ConfigError:
        return
    warm(spec, one_node, base["timeout"])


def _numbered(trial) -> str:
    """Tune trial name "trial_N_ID", N counting the trials this driver created from 0 (the fault schedule's)."""
    return f"trial_{int(trial.experiment_tag.split('_', 1)[0]) - 1}_{trial.trial_id}"


# --- the time budget -----------------------------------------------------------------------------------------------
# The budget is the command's: it counts from the command's start (the interpreter's, for the console script) and the
# command ends, summary printed, by then. What the end takes after the trials are stopped (Tune stopping its trial
# actors, the study settled, the summary, Ray's shutdown at exit) is started this many seconds before the deadline
# (on 2 shared cores, tiny: the end took 1-2 s; a 60 s budget ended at 55-56 s with 6 s here).
END_S = 5.0
_RUNNING: set[str] = set()  # the Tune trials running now (the callback's view): their worker groups end at the budget
_BUDGET_OVER = threading.Event()


def budget_over(deadline: float | None) -> bool:
    """Whether the search must end now for the command to end by its deadline (time.time() seconds); the first time
    it must, the running trials' worker groups are killed, so that no trial runs past it (a trial's ranks only see
    Tune's stop at their next report, and the last trial of a budget ran whole past it)."""
    if _BUDGET_OVER.is_set():
        return True
    if deadline is None or time.time() < deadline - END_S:
        return False
    _BUDGET_OVER.set()
    for tid in list(_RUNNING):
        _cancel(tid)
    return True


def make_stopper(path: str | None = None, ident=None, deadline: float | None = None, search: str | None = None,
                 url: str | None = None, reserve: float = 0.0):
    """The search's Tune stopper (StopOnInterrupt); reserve: the seconds of the budget kept to settle a verdict
    (search/settle.py)."""
    from ray.tune import Stopper

    class StopOnInterrupt(Stopper):
        """Ends the whole experiment once Ctrl-C was pressed, the store failed or is not the file the search
        opened (path, ident: a SQLite store's; one stat per step), or the time budget is spent (deadline) (Tune
        asks on every step of its loop)."""

        def __call__(self, trial_id, result):
            return False

        def stop_all(self):
            if budget_over(deadline):
                return True
            if url and settle.due(url, search, deadline, reserve):  # the budget's share kept for settle.settle
                return True
            if (why := guard.lost(path, ident)) is not None:
                store_failed(why)
            from trainscout.store import claims  # the heartbeat found the search's lease taken over
            if (lease := claims.driving(search)) is not None and lease.lost:
                lease_lost(lease.lost_line())
            # module functions: a pickled copy of the stopper reads the same flags
            return interrupted() or store_failure() is not None or bool(_HOST_OOM)
    return StopOnInterrupt()


def _halt_why(budget_s: float | None) -> str:
    """Why the stopper ends the search, read from its flags once its stop_all said so."""
    if _BUDGET_OVER.is_set():
        return f"its time budget{f' ({clock(budget_s)})' if budget_s else ''} ran out"
    if interrupted():
        return "interrupted (Ctrl-C)"
    if lease_failure():
        return "another driver took the search over"
    if store_failure() is not None:
        return f"the results store failed ({store_failure()})"
    if _HOST_OOM:
        return f"a trial was {_HOST_OOM[0]}"
    return "the rest of its time budget is kept to settle an open verdict by training (search/settle.py)"


def _stalled_line(halted: dict | None) -> str | None:
    """The line of a search that ended while Ray Tune waited for its next trial (the searcher's halted: a draw that
    had not returned, or that proposed nothing for a second or more), else None."""
    if not halted or not (halted["draw"] or halted["waited_s"] >= 1.0):
        return None
    what = "its draw had not returned" if halted["draw"] else "it proposed no trial"
    return (f"ended while Ray Tune waited {clock(halted['waited_s'])} for the searcher's next trial ({what}): "
            f"{halted['why']}")


# --- the host's memory monitor ------------------------------------------------------------------------------------
_HOST_OOM: list[str] = []  # why the host's memory monitor ended this process's running search (the first reason)


class HostMemoryKilled(StoreError):
    """The host's memory monitor killed a trial's ranks or the search's own actors: the search stopped (the running
    trials too, none left RUNNING in the study); one line and exit 1, as a failed store ends a search (cli.main)."""


def _host_oom(why: str) -> None:
    if not _HOST_OOM:
        _HOST_OOM.append(why)


def run(args: SearchArgs, store: Store, name: str, space: Space, hw: dict, stream,
        deadline: float | None = None, track: list[str] | None = None) -> dict:
    """Run the search's Tune loop on its open store (run_search holds the folder and the lease); the summary. A
    store that failed or was lost while it ran ends it in one line (StoreError: what was kept where)."""
    clear_store_failure()
    _HOST_OOM.clear()
    keeper = guard.Keeper(store.path)  # reads the store after a deletion, for the rescue (store.guard)
    try:
        summary = _run(args, store, name, space, hw, stream, keeper, deadline, track or [])
    except Exception as e:  # a storage failure ends in one line; anything else is raised as it is
        # a store that failed first makes what Tune raises after it (its state file written empty) its consequence
        why = guard.failure_of(e) or store_failure()
        if why is None and keeper.lost() is None:
            # a driver woken after another took its lease over: Optuna refuses its stale write to a trial the
            # successor settled (UpdateFinishedTrialError, from a write the lease's guard does not see): the one line
            from trainscout.store import claims
            lease = claims.driving(name)
            if lease is None or (line := lease.check()) is None:
                raise
            lease_lost(line)
        else:
            store_failed(why or keeper.lost())
        summary = None
    try:
        if lease_failure():  # another driver took this search over: what the store holds is theirs now
            from trainscout.store.claims import LeaseLost
            raise LeaseLost(lease_failure())
        if keeper.lost() or store_failure():
            raise StoreError(_store_stop_line(args, store, name, keeper))
    finally:
        keeper.close()
    if _HOST_OOM:  # the trial is recorded host_oom (not counted toward --trials, no measurement stored)
        raise HostMemoryKilled(f"search {name} stopped, a trial {_HOST_OOM[0]}; what ended before is kept; continue "
                               f"with: trainscout search --resume {args.out}")
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


@dataclass
class _Setup:
    """What a run of the Tune loop is built from before Tune starts: the study's storage, the searcher over it and
    ASHA, the memory model's calibration on this GPU, and the start points (atlas, known: those from the atlas and
    the store, with why; notes: why the start point is what it is)."""
    ostorage: object
    searcher: object
    scheduler: object
    calibration: dict | None
    start: list[dict]
    atlas: list[tuple[dict, str]]
    known: list[tuple[dict, str]]
    notes: list[str]


def _run(args: SearchArgs, store: Store, name: str, space: Space, hw: dict, stream, keeper,
         deadline: float | None = None, track: list[str] | tuple = ()) -> dict:
    """deadline: when the command must have ended (time.time(); the time budget counted from the command's start)."""
    _BUDGET_OVER.clear()
    _RUNNING.clear()
    rows = store.trials(name)
    done = [t for t in rows if t["status"] != Status.UNSCHEDULED]  # an unscheduled trial ran nothing: run it again
    remaining = None if args.trials is None else args.trials - counted(done)
    if remaining is not None and remaining <= 0:
        print(f"search {name}: all {args.trials} trials done; give a larger --trials with --resume to run more",
              file=stream)
        return summarize(store, name, stream, out=args.out)
    attached, ostorage = _open_study(args, store, name)
    setup = _set_up(args, store, name, space, hw, ostorage, done, remaining)
    concurrent, why_concurrent = cluster.concurrency(hw, args.gpus_per_trial, args.max_concurrent, attached)
    base = _trial_base(args, store, name, hw, len(rows))
    if setup.start:
        _warm_first(setup.start[0], base, args.one_node)
    setup.searcher.judge = lambda config: before_run(config, base)[1]  # asked after its draws keep being refused
    # the stopper's conditions, asked by the searcher too: Tune waits for a next trial without asking its stopper
    halting = make_stopper(keeper.path, keeper.ident, deadline, name, store.url,
                           settle.SHARE * (args.time_budget_s or 0))
    setup.searcher.halt = lambda: _halt_why(args.time_budget_s) if halting.stop_all() else None
    # the capacities the trials are judged on (trainable.launch_refusal): the host the driver's (on one box, the
    # common case, the trials' too; on a cluster the nodes' smallest), the GPU's
    base.update(capacities(hw, setup.calibration))
    printer = Printer(space, None if stream in (sys.stdout, sys.stderr) else stream, total=remaining,
                      budget_s=None if deadline is None else max(0.0, deadline - time.time()),
                      ranks=args.gpus_per_trial,
                      unit="GPU" if hw["device"] == "cuda" else "worker")
    printer.to_stderr = stream is sys.stderr
    tuner = _tuner(args, name, setup, base, halting, concurrent,
                   [progress_callback(store.url, name, printer), *trackers(track, name, args.out, stream)])
    _print_start(args, name, hw, store.url, (concurrent, why_concurrent), (counted(done), remaining), setup, stream)
    with catch_interrupt(), one_line_logs("ray.tune.execution.experiment_state"), quiet_host_oom():
        if not budget_over(deadline):  # what came before (Ray, the start points) may have spent it
            tuner.fit()
    stalled = _stalled_line(setup.searcher.halted)
    if stalled:  # the search ended while Tune waited for a next trial: said first, whatever line ends the run
        print(f"  {stalled}", file=stream, flush=True)
    if keeper.lost() or store_failure():  # stopped by its store: no summary (the caller says what was kept)
        return {}
    cut = _cut_trials(args, store, name, setup.ostorage, stream)
    if setup.searcher.stopped_why:
        print(f"  {setup.searcher.stopped_why}", file=stream, flush=True)
    fit = _nearest(args, space, hw, setup.calibration, base["host"]["capacity"], store, name, stream)
    settled = _settled(args, store, name, deadline, stream)
    summary = summarize(store, name, stream, out=args.out, fit=fit)
    summary["settled"] = settled
    summary["atlas"] = sources_measured(store.trials(name), setup.atlas)
    for line in source_lines(summary["atlas"], "the atlas"):
        print(line, file=stream, flush=True)
    return _ended(summary, args, setup.searcher, cut, stalled, len(store.trials(name)) - len(done))


def _open_study(args: SearchArgs, store: Store, name: str) -> tuple[bool, object]:
    """Ray reached, the worker groups' pool, and the search's Optuna storage, each of its writes checked against the
    driver's lease and pinned to the store's file: (attached to a cluster, the storage)."""
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # Tune's verbose=0 then prints nothing of its own
    import optuna

    from trainscout.trial import pool
    from trainscout.trial.ray_cluster import ensure_ray
    ensure_ray(args.address)
    attached = cluster_address(args.address) is not None
    # the worker groups' pool, owned by this driver on its node, so that it outlives the trials that use it (and no
    # worker node's end takes it along); attached to a cluster others use, its idle groups go back while others wait
    pool.pool(shared=attached)
    from trainscout.store import secrets, shared
    secrets.publish(store.url)  # the storage's password, for the trials' processes wherever they run (in memory only)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    ostorage = shared.optuna_storage(store.url, engine_kwargs=Store.engine_kwargs(store.url))  # its schema made once
    from trainscout.store import claims  # each write of the study checks the driver's lease first
    ostorage = claims.guarded_storage(ostorage, name, lease_lost)
    guard.pin(ostorage.engine, store.path, store.identity)  # no new, empty database where the store was
    return attached, ostorage


def _set_up(args: SearchArgs, store: Store, name: str, space: Space, hw: dict, ostorage, done: list[dict],
            remaining: int | None) -> _Setup:
    """The study's trials left RUNNING settled, the sampler, the calibration, the ranker, a new search's start
    points, and the searcher and scheduler of this run."""
    drawn = recover_interrupted(ostorage, name, store)
    # a resumed search's sampler would replay its seed's draws from the first: it continues from another seed
    sampler = make_sampler((args.seed + drawn) % SEED_RANGE, args.trials)
    calibration = None  # the memory model fitted once on this GPU's stored peaks: pruning and the start point use it
    if hw["device"] == "cuda" and hw.get("gpu_memory_gib"):
        from trainscout.predictor import memory
        calibration = memory.fit(memory.calibration_pairs(store.measurements(), hw.get("gpu")))
    notes: list[str] = []
    ranker = make_ranker(args, space, hw, calibration, seed=(args.seed + drawn) % SEED_RANGE)
    start, atlas, known = ([], [], []) if done else first(args, space, hw, calibration, ranker, store.measurements(),
                                                         notes)
    searcher = make_searcher(space, name, ostorage, sampler, start, seed=(args.seed + drawn) % SEED_RANGE,
                             ranker=ranker, target=remaining)
    _SEARCHER[:] = [searcher]
    _UNCOUNTED.clear()
    return _Setup(ostorage, searcher, make_scheduler(args.steps), calibration, start, atlas, known, notes)


def _trial_base(args: SearchArgs, store: Store, name: str, hw: dict, offset: int) -> dict:
    """What every trial of this run is handed (trainable.tune_trial's base; offset: the trials the search had)."""
    base = {"model": args.model, "workers": args.gpus_per_trial, "steps": args.steps, "warmup": args.warmup,
            "hardware": hw, "seed": args.seed, "recipe": args.recipe, "storage": store.url, "search": name,
            "timeout": args.timeout, "address": args.address, "max_failures": args.max_failures,
            "faults": fault_schedule(os.environ.get("TRAINSCOUT_FAULT_SCHEDULE")), "offset": offset,
            "trial_dir": os.path.abspath(os.path.join(args.out, "trials")), "knob_names": list(space_knobs()),
            "one_node": args.one_node,
            # the SQLite file's (device, inode) as the driver opened it; a trial on another host (a shared
            # filesystem numbers devices per host) does not compare it
            "store_identity": store.identity, "driver_host": socket.gethostname()}
    # handed to the trial actors: what the start points' memory predictions built the model for, its sizes, and
    # the FLOP count every trial's MFU is derived from (counted there, each actor's first trial imported
    # transformers and built the model on the meta device after it ran: 6-10 s on 2 cores)
    from trainscout.predictor import flops, model_tree
    from trainscout.trial.models import resolve_model
    flops.count(resolve_model(args.model).config)
    base["facts"] = model_tree.known()
    return base


def _tuner(args: SearchArgs, name: str, setup: _Setup, base: dict, halting, concurrent: int, callbacks: list):
    """Ray Tune's Tuner of this run: the trials in actors Tune reuses, drawn by the searcher, stopped by ASHA and the
    stopper (halting), as many at once as concurrent."""
    from ray import tune
    return tune.Tuner(
        tune.with_resources(tune.with_parameters(tune_trial, base=base), TRIAL_ACTOR),
        tune_config=tune.TuneConfig(search_alg=setup.searcher, scheduler=setup.scheduler,
                                    num_samples=-1,  # the searcher ends at --trials counted (FREE ones not)
                                    max_concurrent_trials=concurrent,  # the budget: the stopper's deadline
                                    trial_name_creator=_numbered if base["faults"] else None,
                                    reuse_actors=True),  # one trial after another in the same actor process
        run_config=tune.RunConfig(name=f"{name}-{int(time.time())}",
                                  storage_path=os.path.abspath(os.path.join(args.out, "tune")), verbose=0,
                                  callbacks=callbacks,
                                  stop=halting,
                                  failure_config=tune.FailureConfig(max_failures=0)))


def _print_start(args: SearchArgs, name: str, hw: dict, url: str, concurrency: tuple[int, str],
                 trials: tuple[int, int | None], setup: _Setup, stream) -> None:
    """The search's first lines: what it runs on, how many trials at once (concurrency: and why) and to go (trials:
    done, remaining), its store; then the start points' notes and those taken from the atlas and the store."""
    from trainscout.store import secrets
    (concurrent, why_concurrent), (done, remaining) = concurrency, trials
    nodes = f" on {hw['nodes']} node{'s' if hw['nodes'] != 1 else ''}" if hw.get("nodes") else ""
    print(f"search {name}: model {args.model} on {hw.get('gpu') or hw['cpu']} ({hw['device']}){nodes}, "
          f"{args.gpus_per_trial} {'GPU' if hw['device'] == 'cuda' else 'worker'}(s) per trial"
          f"{'' if args.one_node else ' (may be split over nodes)'}, {concurrent} at once ({why_concurrent}); "
          f"{done} trials done, {remaining if remaining is not None else 'until the time budget'} to go; "
          f"store {secrets.masked(url)}", file=stream, flush=True)
    for note in setup.notes:
        print(f"  {note}", file=stream, flush=True)
    for where, points in (("the atlas", setup.atlas), ("the store", setup.known)):
        for p, why in points:
            print(f"  start point from {where} ({why}): " + " ".join(f"{k}={fmt(v)}" for k, v in sorted(p.items())),
                  file=stream, flush=True)


def _cut_trials(args: SearchArgs, store: Store, name: str, ostorage, stream) -> list[dict]:
    """The study's trials left RUNNING settled; each that Ctrl-C or the time budget ended before Tune reported it
    (the live table never showed it) printed with its settings, and returned."""
    cut: list[dict] = []
    recover_interrupted(ostorage, name, store, cut)
    by = "the interrupt" if interrupted() else "the time budget" if args.time_budget_s else "the search's end"
    for c in cut:
        ran = f" after {clock(c['seconds'])}" if c["seconds"] is not None else ""
        steps = f"{c['steps']} timed step(s) reported" if c["steps"] else "before its first timed step"
        print(f"  trial {c['number']}: ended by {by}{ran}, {steps}; no record, not counted: "
              + " ".join(f"{k}={fmt(v)}" for k, v in sorted(c["params"].items())), file=stream, flush=True)
    return cut


def _nearest(args: SearchArgs, space: Space, hw: dict, calibration: dict | None, host: float, store: Store,
             name: str, stream) -> dict | None:
    """Where no trial ended ok (and no Ctrl-C ended the search): the configuration closest to fitting and what would
    make it fit (nearest.nearest_fit, the memory model's); None otherwise, or where it could not be worked out."""
    if interrupted() or any(t["status"] == Status.OK for t in store.trials(name)):
        return None
    from .nearest import nearest_fit
    try:
        return nearest_fit(args, space, hw, calibration, host, store.trials(name))
    except Exception as e:  # noqa: BLE001 - the search's outcome stands without it, and says so
        print(f"  (which configuration came closest to fitting could not be worked out: {type(e).__name__}: "
              f"{e})", file=stream, flush=True)
        return None


def _settled(args: SearchArgs, store: Store, name: str, deadline: float | None, stream) -> dict | None:
    """The fastest's one-step verdict settled by training, in what is left of the budget (search/settle.py)."""
    if interrupted() or store_failure():
        return None
    settled = settle.settle(args.out, store, name, None if deadline is None else deadline - END_S - time.time(),
                            args.address)
    if settled:
        print(settle.line(settled), file=stream, flush=True)
    return settled


def _ended(summary: dict, args: SearchArgs, searcher, cut: list[dict], stalled: str | None, ran: int) -> dict:
    """The summary with how this run ended: interrupted, the trials cut short, a stall, the trials it ran (ran: a
    resume's included) and, where it ran none or measured nothing, why."""
    if interrupted():
        summary["interrupted"] = True
    summary["cut"] = cut
    if stalled:
        summary["stalled"] = stalled
    summary["ran"] = ran  # trials this run ended (a resume's included)
    if summary["ran"] == 0 and not interrupted():
        summary["none_why"] = (f"the time budget ({clock(args.time_budget_s)}, counted from the command's start) ran "
                               "out before a trial ended (the first trial of a run starts its worker processes): "
                               "give a longer --time-budget"
                               if args.time_budget_s else searcher.stopped_why or "the searcher proposed no trial")
    elif not summary["measured"] and not interrupted():  # exit 0 means it did what was asked: it measured nothing
        summary["nothing_measured"] = nothing_line(summary)
    return summary
