"""`trainscout search --dry-run`: the configurations a new search would hand to its trials, in order, each with the
verdict its trial would give before running (ok, invalid, pruned) and why, on a GPU box described by its kind, count
and host memory: no GPU and no Ray needed, nothing written.

The start points are the search's own (search/start.first); the draws after them come from the search's own
searcher (study.DistinctSearcher over the search's sampler, in memory), told each refusal as the search tells it
and no measurement (the trials it would run are left running, as TPE's constant liar reads them).
"""
from __future__ import annotations

from trainscout.spaces import ConfigError, all_knobs, fmt

from .args import SearchArgs, space_for
from .trainable import METRIC, before_run, capacities

OK = "ok"


def gpu_box(kind: str, gpus: int, host_memory_gib: float | None = None, gpu_memory_gib: float | None = None) -> dict:
    """The hardware fingerprint a search's trials would have on `gpus` GPUs of a kind (lookup's kinds), with every
    optional package a knob names installed (as lookup assumes of a GPU box); host memory default: lookup's
    assumption per GPU."""
    from trainscout.atlas.predict import HOST_GIB_PER_GPU
    from trainscout.trial.gpus import asked_kind, gpu_facts
    name = asked_kind(kind)  # one kind exactly, else refused listing the kinds
    facts = gpu_facts(name)
    if gpus < 1:
        raise ConfigError("--gpus", f"--gpus {gpus} is not allowed: give a positive number of GPUs")
    return {"device": "cuda", "gpu": kind if name != kind else f"NVIDIA {name}", "gpu_count": gpus,
            "gpu_memory_gib": gpu_memory_gib or facts[0], "capability": facts[1],
            "host_memory_gib": host_memory_gib or HOST_GIB_PER_GPU * gpus,
            "installed": sorted({p for k in all_knobs() for p in k.runtime.packages})}


def dry_run(args: SearchArgs, hw: dict, draws: int) -> dict:
    """{"model", "gpu", "gpus", "notes", "configs": [{"config", "verdict", "reason", "source"}]}: the start points
    and then the sampler's draws up to `draws` configurations in all (fewer where the searcher stops drawing: the
    last note says why)."""
    import optuna
    from ray.tune.search import Searcher

    from .searcher import make_ranker, make_sampler
    from .start import first
    from .study import DistinctSearcher
    space, _ = space_for(args, hw)
    notes: list[str] = []
    ranker = make_ranker(args, space, hw, None, seed=args.seed)
    start, atlas, known = first(args, space, hw, None, ranker, [], notes)
    sources = {_key(space.params_of(p)): f"start point from the atlas ({why})" for p, why in atlas}
    sources.update({_key(space.params_of(p)): f"start point from the store ({why})" for p, why in known})
    base = trial_base(args, hw)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    searcher = DistinctSearcher(space, "dry-run", None, make_sampler(args.seed, draws), start, seed=args.seed,
                                ranker=ranker, judge=lambda config: before_run(config, base)[1])
    out = []
    for i in range(draws):
        tid = f"dry_{i}"
        config = searcher.suggest(tid)
        if config is None or config == Searcher.FINISHED:
            notes.append(searcher.stopped_why or "the searcher proposed no more configurations")
            break
        verdict, reason = before_run(config, base)
        drawn = searcher.drawn[tid]
        source = sources.get(_key(drawn.params)) or (
            "start point" if i < len(start) else
            f"ranked ({drawn.user_attrs['ranked']})" if "ranked" in drawn.user_attrs else
            f"explore ({drawn.user_attrs['explore']})" if "explore" in drawn.user_attrs else "sampler")
        out.append({"config": {k: v for k, v in config.items() if k in space.domains}, "verdict": verdict,
                    "reason": reason, "source": source})
        if verdict != OK:  # told as the search tells a refusal
            searcher.on_trial_complete(tid, {METRIC: 0.0, "status": verdict, "error": reason})
        else:  # left running (no measurement), and it ends a run of refusals as its trial would when it ends
            searcher.free_run = 0
    return {"model": args.model, "searched": sorted(k for k, d in space.domains.items() if len(d) > 1),
            "gpu": hw["gpu"], "gpus": hw["gpu_count"], "host_memory_gib": hw["host_memory_gib"], "notes": notes,
            "configs": out}


def trial_base(args: SearchArgs, hw: dict) -> dict:
    """What a search's trials of args on hw are prepared and judged with before they run (trainable.before_run): a
    new search's, with no calibration of the memory model."""
    return {"model": args.model, "workers": args.gpus_per_trial, "steps": args.steps, "warmup": args.warmup,
            "hardware": hw, "seed": args.seed, "recipe": args.recipe, **capacities(hw)}


def render(result: dict) -> str:
    """The dry run as text: one line per configuration, its verdict and reason, then the shares."""
    lines = [f"dry run: {result['model']} on {result['gpus']} x {result['gpu']} "
             f"({result['host_memory_gib']:.0f} GiB host memory): the configurations a search would hand to its "
             "trials, in order"]
    for i, c in enumerate(result["configs"]):
        knobs = " ".join(f"{k}={fmt(v)}" for k, v in sorted(c["config"].items()) if k in result["searched"])
        why = f"  ({c['reason']})" if c["reason"] else ""
        lines.append(f"{i:>3} {c['verdict']:7} {c['source']}: {knobs}{why}")
    counts = {v: sum(c["verdict"] == v for c in result["configs"]) for v in (OK, "pruned", "invalid")}
    lines.append(f"{len(result['configs'])} configurations: " + ", ".join(f"{n} {v}" for v, n in counts.items()))
    lines += [f"note: {n}" for n in result["notes"]]
    return "\n".join(lines)


def _key(config: dict) -> str:
    import json
    return json.dumps(config, sort_keys=True, default=str)
