"""What a search is started with (SearchArgs, saved in the store so --resume continues the same search) and the
checks made before anything is started or written (validate)."""
from __future__ import annotations

import math
import os
import stat
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from trainscout.spaces import ConfigError
from trainscout.store import check_folder, storage_url
from trainscout.trial import hardware, prepare
from trainscout.trial.ray_cluster import cluster_address
from trainscout.trial.runner import context

from .space import Space, load_space_file
from .trainable import fault_schedule

if TYPE_CHECKING:
    from trainscout.trial.records import TrialSpec

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
    # trials at once (None: what the cluster holds; attached: a fair share of its room)
    max_concurrent: int | None = None
    one_node: bool = True  # each trial's ranks on one node (placement group STRICT_PACK); False: may be split
    space_content: dict | None = None  # the space file as read when the search started: a resume uses it

    def search_name(self) -> str:
        return self.name or os.path.basename(os.path.abspath(self.out))


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
    address = cluster_address(args.address)
    if not address:  # where this box's trials say what shared their device (a cluster's nodes keep their own)
        from trainscout.trial.contention import check_registry
        check_registry()
    if address:  # the hardware of the nodes that run the trials, read on them (attaching; nothing is written)
        from .cluster import cluster_hardware
        hw = cluster_hardware(address, args.device, args.gpus_per_trial, args.one_node,
                              "--address" if args.address else "RAY_ADDRESS")
    else:
        from trainscout.trial.runner import detect_device
        hw = hardware.fingerprint(detect_device(args.device), args.gpus_per_trial)
    space, base = space_for(args, hw)
    return space, base, hw


def space_for(args: SearchArgs, hw: dict) -> tuple[Space, TrialSpec]:
    """(the search's space, the trial of its defaults) on the trials' hardware: the defaults' trial validates the
    model, recipe and worker count; the space file is read once (args.space_content)."""
    workers = args.gpus_per_trial
    base = prepare(args.model, {}, workers=workers, steps=args.steps, warmup=args.warmup, hw=hw, **args.recipe)
    ctx = context(base.model_config, base.recipe["global_batch"], workers, hw)
    if args.space_content is None:
        args.space_content = read_space(args.space) if args.space else {}
        args.space = os.path.abspath(args.space) if args.space else None
    return Space.build(args.space_content, args.sets, ctx), base


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
