"""A search's start points: the configurations it measures first (the defaults at the largest micro-batch that
fits, compiled twins on a GPU, the best MFU the store measured for other models), and the order they run in."""
from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING

from trainscout.spaces import ConfigError, all_knobs, applies, fmt, get, memory_savers, micro_batch
from trainscout.trial import prepare
from trainscout.predictor.memory import FIT_SHARE  # a start point's share of the GPU (memory.refusal says why)
from trainscout.trial.records import TOKENS_PER_S

if TYPE_CHECKING:
    from trainscout.trial.records import TrialSpec

    from .args import SearchArgs
    from .space import Space


def start_points(args: SearchArgs, space: Space, hw: dict, calibration: dict | None,
                 notes: list[str] | None = None) -> list[dict]:
    """The first trials, on every device, are the strong defaults a person would set by hand: every searched knob at
    its default (the fixed ones as fixed), with the largest micro-batch that fits where it is searched - on a GPU
    probed (micro_batch_size=max) or else the largest the memory model predicts to fit in 85 % of its memory; on the
    CPU the smallest that fits the host's memory (_largest_fit says why). On a GPU the knobs' start values follow,
    step by step (Search.start: compile on with the loss compiled, then FP8 matmuls on top where the GPU has FP8 tensor
    cores). With two or more trials at once they run side by side. Where the defaults do not fit even at the smallest
    micro-batch, the memory saver of the space predicted fastest of those that make them fit (the GPU and the host) is
    added first (fits), and `notes` says which and why. A CPU search of a
    real model (pythia-14m, 3 trials) drew 1 invalid and 2 pruned configurations and measured nothing; `--trials 1
    --set micro_batch_size=...` drew random values for the knobs left (eager attention, full checkpointing, FSDP on
    one GPU)."""
    if not space.domains:
        return []
    gpu = hw["device"] == "cuda" and bool(hw.get("gpu_memory_gib"))
    defaults = fits(args, space, hw, calibration, space_defaults(space), notes)
    if defaults is None:
        return []
    mb = micro_batch().name
    sizes = space.domains.get(mb)
    if sizes is None:  # fixed: the defaults as they are
        point = defaults if spec_at(args, space, hw, defaults) is not None else None
    else:  # on a GPU probed in the trial, from the memory model's estimate up, where the rules allow it (a saver
        # DeepSpeed runs refuses a probe): else the largest the memory model predicts to fit
        point = {**defaults, mb: "max"} if gpu and "max" in sizes else None
        if point is None or spec_at(args, space, hw, point) is None:
            point = _largest_fit(args, space, hw, calibration, defaults)
    if point is None:
        return []
    # each passes the rules the sampler's draws pass (Space.point_of): a start point is a draw like the others
    return [p for p in [applicable(point), *(started(args, space, hw, point) if gpu else [])]
            if spec_at(args, space, hw, p) is not None]


def applicable(point: dict) -> dict:
    """point less the knobs whose requirements it does not meet: they keep their defaults (compile_scope without
    compile)."""
    return {k: v for k, v in point.items() if applies(get(k), point)}


def started(args: SearchArgs, space: Space, hw: dict, point: dict) -> list[dict]:
    """The GPU start points after `point`: step by step, each searched knob's start value of that step on top of the
    last (Search.start). A step is taken where a knob of it that leads (not Search.start_follows) changes the point; a
    step past the first only where the model accepts it (FP8: the knob's check refuses a GPU without it)."""
    knobs = [k for k in all_knobs() if k.search.start and k.search.start[1] in space.domains.get(k.name, ())]
    out, on = [], dict(point)
    for step in sorted({k.search.start[0] for k in knobs}):
        now = [k for k in knobs if k.search.start[0] == step]
        if not any(not k.search.start_follows and point.get(k.name) != k.search.start[1] for k in now):
            break
        on = {**on, **{k.name: k.search.start[1] for k in now}}
        if out and spec_at(args, space, hw, applicable(on)) is None:
            break
        out.append(applicable(on))
    return out


def space_defaults(space: Space) -> dict:
    """Every searched knob at its default (its first value where the default is not in the domain)."""
    return {k: get(k).default if get(k).default in dom else dom[0] for k, dom in space.domains.items()}


def fits(args: SearchArgs, space: Space, hw: dict, calibration: dict | None, point: dict,
         notes: list[str] | None = None, host: float | None = None) -> dict | None:
    """point if the memory model predicts it to fit at the space's smallest micro-batch; else point with the memory
    saver of the space (spaces.memory_savers) predicted fastest (steptime.step_s, at the largest micro-batch that fits
    it) of those that fit the GPU and the host (host: its bytes; default predictor.memory.host_capacity(hw)): the rule a
    search's trials are pruned by (predictor.memory.refusal), held to FIT_SHARE of the GPU; sharding over the ranks
    before offload where the GPUs hold the states, checkpointing every 4th layer before every layer; None where none
    fits (notes: why)."""
    import re

    from trainscout.predictor import dtypes, memory, steptime
    mb = micro_batch().name
    searched = mb in space.domains
    sizes = [m for m in space.domains.get(mb, ()) if m != "max"] or [1]
    # fixed: as fixed, but max (probed from the largest candidate down) at micro-batch 1: predicted at its largest
    # candidate, a model's defaults would not fit at all
    probed = space.fixed.get(mb) == "max"
    smallest = {mb: min(sizes)} if searched or probed else {}
    gpu = memory.gpu_capacity(hw)
    host = host or memory.host_capacity(hw)  # the trials' host, as the driver hands it to them

    def judged(p: dict, **at) -> tuple[TrialSpec, tuple[str, dict] | None] | None:
        """(spec, why it does not fit: memory.refusal) of p at `at` (the smallest micro-batch); None: invalid here."""
        spec = spec_at(args, space, hw, p, **(at or smallest))
        return None if spec is None else (spec, memory.refusal(spec, gpu, host, calibration, FIT_SHARE))

    def speed(p: dict) -> float:
        """Predicted step seconds of p at the largest micro-batch of the space that fits (the smallest's otherwise)."""
        for m in sorted(sizes, reverse=True) if searched or probed else [None]:
            got = judged(p, **({mb: m} if m is not None else {}))
            if got is not None and got[1] is None:
                return steptime.step_s(got[0])
        return math.inf
    first = judged(point)
    if first is None or first[1] is None:
        return point
    tried, fitting = [], []
    for saver in memory_savers():
        if any(v not in space.domains.get(k, ()) for k, v in saver.items()):
            continue
        got = judged(dict(point, **saver))
        if got is None or memory.shards_nothing(got[0]):  # sharding over one rank
            continue
        (spec, refused), label = got, " ".join(f"{k}={fmt(v)}" for k, v in saver.items())
        if refused is None:  # savers that keep fp32 states first, within a cost (dtypes.prefer)
            fitting.append((dtypes.lowers_state(spec.plan), speed(dict(point, **saver)), len(fitting), label, saver))
        else:  # why (the host's without its components), and the GPU's prediction where it fits
            gib = refused[1].get("predicted_gib", math.inf)
            fit = f"{gib:.1f} GiB per rank fits, but " if gpu and gib * memory.GiB <= FIT_SHARE * gpu else ""
            tried.append(f"{label}: {fit}" + re.sub(r" \([^()]*\)$", "", refused[0]).replace("; ", " and "))
    return _with_saver(point, fitting, tried, f"at micro-batch {min(sizes)} ({first[1][0]})", notes)


def _with_saver(point: dict, fitting: list[tuple], tried: list[str], over: str, notes: list[str] | None) -> dict | None:
    """fits' answer where point does not fit (`over`: at what, and why): point with the saver dtypes.prefer takes of
    those that fit, else None; notes: which, or why none (tried: each saver's reason)."""
    from trainscout.predictor import dtypes
    if fitting:
        best = dtypes.prefer(fitting)  # fp32 states kept within a cost, fastest predicted, the savers' rank order
        if notes is not None:
            why = ("; predicted step of each saver that fits: " + ", ".join(
                f"{label} {t:.3g} s" for _, t, _, label, _ in fitting) + ", the fastest taken (one keeping fp32 states "
                f"first, within {dtypes.KEEP_STATE_COST:g}x of it)") if len(fitting) > 1 else ""
            notes.append(f"the defaults do not fit {over}{why}: the start point adds {best[3]}")
        return dict(point, **best[4])
    if notes is not None:
        notes.append(f"no start point: the defaults do not fit {over} and no memory saver of the space fits "
                     f"({'; '.join(tried) or 'the space has none'})")
    return None


STORE_POINTS = 2  # start points taken from the store: the best MFU measured on this GPU kind, other models


def store_points(args: SearchArgs, space: Space, hw: dict, records: list, have: list[dict]) -> list[tuple[dict, str]]:
    """Start points from what the store knows: the configurations with the highest MFU measured on the same GPU
    kind and rank count for other models (MFU, not tokens/s, carries across model sizes), put into this search's
    space (a knob outside its domain keeps the start point's value; the micro-batch is probed again where the space
    has max, as it is this model's) and checked against this model (an invalid one is left out). [(point, why)]."""
    if hw["device"] != "cuda" or not have:
        return []
    me = spec_at(args, space, hw, have[0])
    if me is None:
        return []
    from trainscout.trial.contention import contended  # a shared device's MFU says less of the configuration
    from trainscout.trial.quality import FAILED, status  # one that trained another model is never a best to copy
    same = [r for r in records if r.ok and r.m.get("mfu") and not contended(r) and r.world_size == args.gpus_per_trial
            and status(r.m)[0] != FAILED
            and (r.hardware or {}).get("gpu") == hw.get("gpu") and r.model != me.model and r.device == "cuda"]
    best = sorted(same, key=lambda r: -r.m["mfu"])
    return _into_space(args, space, hw, [(r.config, f"{r.model}'s MFU {r.m['mfu']:.3f} on {hw.get('gpu')}")
                                         for r in best], have, STORE_POINTS)


class Reason(str):
    """Why a start point was taken, as printed, with the tokens/s its source gave (`kind`: measured or predicted) for
    the summary to set beside the measurement."""

    def __new__(cls, text: str, kind: str | None = None, tokens_per_s: float | None = None):
        out = super().__new__(cls, text)
        out.kind, out.tokens_per_s = kind, tokens_per_s
        return out


ATLAS_POINTS = 1  # start points taken from lookup's answer: its first (its next ones differed in tf32 alone)


def atlas_points(args: SearchArgs, space: Space, hw: dict, have: list[dict],
                 notes: list[str] | None = None) -> list[tuple[dict, str]]:
    """Start points from the atlas (trainscout lookup's answer for this model on the trials' GPU kind and count):
    its measured best where it has one, then its predicted best configurations, put into this search's space as
    store_points puts a stored one and held to the same rules, the first ATLAS_POINTS that are new. A GPU kind or a
    model the atlas cannot answer for gives none (notes: why). [(point, why)]."""
    if hw["device"] != "cuda" or not have:
        return []
    from trainscout.atlas import db
    from trainscout.atlas.lookup import lookup
    from trainscout.trial.gpus import gpu_kind
    from trainscout.predictor import memory
    kind = gpu_kind(hw.get("gpu"))
    if kind is None:
        return []
    try:
        answer = lookup(db.load([]), args.model, gpu=kind, gpus=args.gpus_per_trial,
                        global_batch=args.recipe.get("global_batch"), gpu_memory_gib=hw.get("gpu_memory_gib"),
                        host_memory_gib=memory.host_capacity(hw) / memory.GiB, top=ATLAS_POINTS)
    except ConfigError as e:
        if notes is not None:
            notes.append(f"no start point from the atlas: {e}")
        return []
    rows = [(r, Reason(f"lookup's measured best, {r[TOKENS_PER_S]:,.0f} tokens/s", "measured", r[TOKENS_PER_S]))
            for g in answer["measured"] for r in g["rows"] if r.get("best")]
    rows += [(r, Reason(f"lookup's prediction, {r[TOKENS_PER_S]:,.0f} tokens/s", "predicted", r[TOKENS_PER_S]))
             for r in (answer.get("predicted") or {}).get("rows", [])]
    return _into_space(args, space, hw, [(r["config"], why) for r, why in rows], have, ATLAS_POINTS)


def _into_space(args: SearchArgs, space: Space, hw: dict, configs: list[tuple[dict, str]], have: list[dict],
                most: int, calibration: dict | None = None) -> list[tuple[dict, str]]:
    """Configurations measured or predicted elsewhere as start points of this search (store_points' rule: a knob
    outside the space's domain keeps the first start point's value, the micro-batch probed again where the space has
    max, a memory saver added where it does not fit, held to the sampler's rules), the first `most` that are new."""
    mb = micro_batch().name
    base = have[0]
    out, seen = [], [json.dumps(p, sort_keys=True, default=str) for p in have]
    sizes = space.domains.get(mb, ())
    for config, why in configs:
        # the micro-batch probed again where the space has max (this model's own), else the one measured or
        # predicted; max where the rules refuse it (a saver DeepSpeed runs), the measured one
        for size in [m for m in ("max", config.get(mb)) if m in sizes] or [base.get(mb)]:
            point = _put(args, space, hw, dict(base), config, mb, size, calibration)
            if point is not None:
                break
        if point is None:
            continue
        k = json.dumps(point, sort_keys=True, default=str)
        if k in seen:
            continue
        seen.append(k)
        out.append((point, why))
        if len(out) == most:
            break
    return out


def _put(args: SearchArgs, space: Space, hw: dict, point: dict, config: dict, mb: str, size,
         calibration: dict | None) -> dict | None:
    """point with config's searched knobs (where the space's domain has the value) and the micro-batch `size`,
    with the memory saver this model needs where it does not fit; None where none fits or the rules refuse it."""
    for k, dom in space.domains.items():
        v = config.get(k)
        if k != mb and v in dom:
            point[k] = v
    point = {k: v for k, v in point.items() if k in space.domains and applies(get(k), point)}
    if size is not None and mb in space.domains:
        point[mb] = size
    # another model's best may not fit this one: it takes the memory saver this model needs (a 1.6B's bf16-mixed
    # point probed 8 micro-batches of a 7B on an H100 for nothing); skipped where none fits
    point = fits(args, space, hw, calibration, point)
    if point is None:
        return None
    point = complete(space, applicable(point))
    return point if spec_at(args, space, hw, point) is not None else None


def complete(space: Space, point: dict) -> dict:
    """The point with every searched knob that applies to it: one it lacks (a record that predates the knob, or a
    requirement another value of the point releases) takes the knob's default, which is what such a record ran, or
    the domain's first value where the space leaves the default out. Sampling a point without a knob it applies to
    would stop the search (no value to give it)."""
    out = dict(point)
    for k in all_knobs():
        dom = space.domains.get(k.name)
        if dom and k.name not in out and applies(k, out):
            out[k.name] = k.default if k.default in dom else dom[0]
    return out


def spec_at(args: SearchArgs, space: Space, hw: dict, point: dict, **override) -> TrialSpec | None:
    """The trial a start point means, as the sampler would build it, with `override` set over it (None: this model
    refuses it)."""
    try:
        settings = dict(space.point_of(complete(space, point))[0], **override)
        return prepare(args.model, settings, workers=args.gpus_per_trial, hw=hw, **args.recipe)
    except ConfigError:
        return None


def _largest_fit(args: SearchArgs, space: Space, hw: dict, calibration: dict | None, defaults: dict) -> dict | None:
    """The defaults at the largest micro-batch the memory model predicts to fit FIT_SHARE of the GPU and the host
    (predictor.memory.refusal, fits' rule); on the CPU the smallest that fits the host's memory: a CPU's step is
    compute-bound at any micro-batch, so a larger one costs its trial's time in proportion and gains little (None:
    none)."""
    from trainscout.predictor import memory
    gpu, host = memory.gpu_capacity(hw), memory.host_capacity(hw)
    mb = micro_batch().name
    sizes = sorted((m for m in space.domains[mb] if m != "max"), reverse=True)
    if gpu is None:
        sizes = sizes[::-1]
    for mbs in sizes:
        point = {**defaults, mb: mbs}
        spec = spec_at(args, space, hw, point)
        if spec is not None and memory.refusal(spec, gpu, host, calibration, FIT_SHARE) is None:
            return point
    return None


def first(args: SearchArgs, space: Space, hw: dict, calibration: dict | None, ranker, records: list,
          notes: list[str]) -> tuple[list[dict], list[tuple[dict, str]], list[tuple[dict, str]]]:
    """A new search's start points in the order they run, (all of them, those from the atlas, those from the store):
    lookup's answer for this model first (atlas_points: a search is never worse than lookup's first answer
    measured), then the defaults and their start steps (start_points, first_points), then the store's best MFU of
    other models (store_points, over the shipped measurements too)."""
    from trainscout.atlas.db import with_shipped
    own = first_points(start_points(args, space, hw, calibration, notes), ranker)
    atlas = atlas_points(args, space, hw, own, notes)
    known = store_points(args, space, hw, with_shipped(records), own + [p for p, _ in atlas])
    return [p for p, _ in atlas] + own + [p for p, _ in known], atlas, known


def first_points(points: list[dict], ranker) -> list[dict]:
    """The start points the search runs first: the fastest predicted first, less those predicted more than
    ranked.MARGIN slower than it (an eager default costs the time of its compiled twin, predicted faster); the ranked
    neighbours of the fastest come next (docs/BENCHMARKS.md). All of them where no ranker or no prediction is at
    hand."""
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
