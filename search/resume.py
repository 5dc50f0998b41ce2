"""The rules of a search's folder and of --resume: what a resume may change, one search per folder (a lock held by
its driver), and no second search of a name the store holds."""
from __future__ import annotations

import os
from dataclasses import fields
from typing import TYPE_CHECKING

from trainscout.spaces import ConfigError

from .args import SEED_RANGE, SearchArgs, read_space

if TYPE_CHECKING:
    from trainscout.store import Store

LOCK_FILE = ".trainscout-search.lock"  # in --out: held (flock) by the driver of the search running there


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


def refuse_existing(store: Store, name: str, out: str, resume: bool) -> dict | None:
    """The saved settings of the search `name`; a new search (not resume) of a name the store holds is refused."""
    saved = store.search_args(name)
    if saved is not None and not resume:
        n = len(store.trials(name))
        raise ConfigError("--out", f"--out {out} already holds the search {name} ({n} trial{'s' if n != 1 else ''}): "
                                   f"use --resume {out} to continue it (a larger --trials runs more), or another --out")
    return saved
