"""A search: Ray Tune schedules real trials, Optuna (TPE) chooses what to try next, ASHA stops what is
clearly slower, and the store answers every configuration that was already measured.

This module is the entry (run_search, SearchArgs, resumed, summarize: what cli/main.py calls); the jobs live in
their own modules: args.py (what a search is started with, validate), resume.py (--resume, one search per folder),
trainable.py (one Tune trial), searcher.py (Optuna/Tune wiring; study.py: Tune's Searcher over the Optuna study,
outcomes.py: what an Optuna trial carries of its outcome), start.py (start points), driver.py (the Tune loop, Ctrl-C,
a failing store), halt.py (a store that failed ends the search), summary.py (the summary); the live table:
live.py. The names other code and the tests read from here are imported here (__all__).
"""
from __future__ import annotations

import os
import sys
import time
from dataclasses import asdict

from trainscout.search.live import Printer
from trainscout.store import default_url, guard, open_store
from trainscout.predictor.memory import FIT_SHARE, MARGIN as MEMORY_MARGIN

from . import driver
from .args import SearchArgs, read_space, validate
from .outcomes import TUNE_ID
from .resume import LOCK_FILE, folder_free, hold_folder, refuse_existing, resumed
from .searcher import make_ranker, make_sampler, make_scheduler, make_searcher, recover_interrupted
from .start import first_points, fits, space_defaults, start_points, store_points
from .summary import summarize
from .tracking import check as check_tracking
from .trainable import FREE_RUN, METRIC, TRIAL_ACTOR, counted, space_knobs

# run_search, and the names cli/main.py, bench/, atlas/ and the tests import from here
__all__ = ["FIT_SHARE", "FREE_RUN", "LOCK_FILE", "MEMORY_MARGIN", "METRIC", "TRIAL_ACTOR", "TUNE_ID",
           "Printer", "SearchArgs", "counted", "first_points", "fits", "hold_folder", "make_ranker", "make_sampler",
           "make_scheduler", "make_searcher", "read_space", "recover_interrupted", "resumed", "run_search",
           "space_defaults", "space_knobs", "start_points", "store_points", "summarize", "validate"]


def run_search(args: SearchArgs, stream=None, resume: bool = False, started: float | None = None,
               track: list[str] | None = None) -> dict:
    """Run (or, resume=True, continue) a search; returns a summary with the best configurations ("interrupted":
    True when Ctrl-C ended it). A new search into a store that holds a search of its name (the --out folder's) is
    refused, and so is a second search on a folder while one runs there. A time budget counts from `started` (the
    command's start, time.time(); default: now) and the search has ended, its summary printed, by then. track: the
    trackers each trial is logged to as a run (mlflow, wandb, tensorboard: Ray Tune's callbacks, driver.trackers)."""
    started = time.time() if started is None else started
    deadline = started + args.time_budget_s if args.time_budget_s else None
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
        refuse_existing(store, name, args.out, resume)
    folder_free(args.out)
    if not (resume and store is not None and args.trials is not None and counted(store.trials(name)) >= args.trials):
        # the trackers' backends (a short timeout) and the Tune folder answer before Ray starts and before anything
        # is written, so that a refusal leaves no search in --out to block the folder's reuse
        check_tracking(track or [], args.out)
        # Ray reached (or started) before anything is written: an address where nothing listens is refused here,
        # not after the store, its log and the folder's lock were made (a rerun in that folder was then refused)
        from trainscout.trial.ray_cluster import check_resources, cluster_address, ensure_ray
        address = cluster_address(args.address)  # what comes before the first row (8-15 s on 2 cores) is said
        print(f"search {name}: {'attaching to ' + address if address else 'starting Ray on 127.0.0.1'}, then the "
              "start points and the first worker group", file=stream, flush=True)
        ensure_ray(args.address)
        check_resources(args.gpus_per_trial, hw["device"], "--gpus-per-trial", per_trial=TRIAL_ACTOR)
    os.makedirs(args.out, exist_ok=True)
    lock = hold_folder(args.out)
    lease = None
    try:
        store = store or open_store(args.storage or default_url(args.out))
        # one driver per search name across hosts: a lease with a heartbeat in the store (the folder's lock: this host)
        lease = store.hold_search(name, "--resume" if resume else "--out")
        saved = refuse_existing(store, name, args.out, resume)  # again, now that no other driver can start here
        if saved is None:
            store.add_search(name, asdict(args))
        elif asdict(args) != saved:
            store.update_search(name, asdict(args))  # more --trials: the next resume starts from them
        return driver.run(args, store, name, space, hw, stream, deadline, track=track or [])
    finally:
        if lease is not None:
            lease.release()
        os.close(lock)
