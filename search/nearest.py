"""A search that measured nothing: the configuration closest to fitting, and what would make it fit (the memory
model's verdicts on the start point's candidates and the draws pruned or out of memory)."""
from __future__ import annotations

from dataclasses import dataclass

from trainscout.spaces import fmt
from trainscout.trial.status import Status

RANKS = (2, 4, 8, 16, 32, 64)  # rank counts tried for "on N GPUs"
NODE_GPUS = 8  # ranks of one host beyond which a trial spans hosts (each host then holds the memory of 8)


def nearest_fit(args, space, hw: dict, calibration: dict | None, host: float, trials: list[dict]) -> dict | None:
    """Where a search measured nothing: the configuration the memory model puts closest to fitting, among the start
    point's candidates (the defaults at the smallest micro-batch, and with each memory saver of the space, as
    search/start.fits tries them) and the draws pruned or out of memory, and what would make it fit: the host
    memory a configuration that fits the GPU needs, the fewest GPUs (the memory model at more ranks: FSDP/ZeRO
    shard over them) and a knob's value on this many. A configuration fits where the search's rule passes it
    (predictor/memory.refusal, with the search's calibration) at a start point's line: within FIT_SHARE of the GPU's
    memory and the host's memory less MARGIN. None where one of them fits (the trials failed otherwise: their
    reasons say why)."""
    from trainscout.spaces import all_knobs, micro_batch
    from trainscout.predictor import memory
    from trainscout.predictor.memory import FIT_SHARE, MARGIN
    judge = _Judge(args, space, hw, calibration, host, memory.gpu_capacity(hw), micro_batch().name,
                   {k.name: k.default for k in all_knobs()})
    candidates = _candidates(judge, trials)
    if not candidates or any(c["fits"] for c in candidates):
        return None
    # the least over its line; of equals (a CPU rank's process outweighs a tiny model), the fewest knobs changed
    closest = min(candidates, key=lambda c: (c["over"], len(judge.differs(c["config"]))))
    ways = _ways(judge, candidates, closest)
    return {"device": hw["device"], "gpu": hw.get("gpu"), "gpu_gib": hw.get("gpu_memory_gib"),
            "fit_share": FIT_SHARE, "fit_gib": round(judge.gpu_line / memory.GiB, 2) if judge.gpu else None,
            "host_gib": round(host / memory.GiB, 2), "host_margin": MARGIN,
            "host_fit_gib": round(judge.host_line / memory.GiB, 2),
            "ranks": judge.workers, "unit": judge.unit,
            "closest": {"source": closest["source"], "config": judge.differs(closest["config"]),
                        "gpu_gib": closest["gpu_gib"], "host_gib": closest["host_gib"], "over": closest["over"]},
            "candidates": len(candidates), "would_fit": ways}


@dataclass
class _Judge:
    """The memory model's verdicts for nearest_fit, by the search's rule at a start point's lines: FIT_SHARE of the
    GPU's memory (capacity; None: the CPU, or a GPU of unknown memory: the host's rule alone) and the host's (host:
    its bytes) less MARGIN. mb: the micro-batch knob's name; defaults: every knob's default."""
    args: object
    space: object
    hw: dict
    calibration: dict | None
    host: float
    capacity: float | None
    mb: str
    defaults: dict

    def __post_init__(self):
        from trainscout.predictor.memory import FIT_SHARE, MARGIN
        self.gpu = self.capacity is not None
        self.unit = "GPU" if self.gpu else "worker"
        self.gpu_line = FIT_SHARE * self.capacity if self.gpu else None
        self.host_line = self.host * (1 - MARGIN)
        self.workers = self.args.gpus_per_trial

    def evaluate(self, settings: dict, ranks: int) -> dict | None:
        """The memory model's verdict on settings at ranks (None: the knobs' rules refuse it): whether the
        search's rule passes it (fits; fits_gpu: its GPU line alone) and how far over its lines it is (over: the
        larger share, what ranks the candidates)."""
        from trainscout.spaces import ConfigError
        from trainscout.predictor import memory
        from trainscout.trial import prepare
        from trainscout.predictor.memory import FIT_SHARE
        box = dict(self.hw, gpu_count=max(ranks, self.hw.get("gpu_count") or 1)) if self.gpu else self.hw
        try:
            spec = prepare(self.args.model, settings, workers=ranks, hw=box, gate=False, **self.args.recipe)
        except ConfigError:
            return None
        # a question the search's trials are not asked: on more GPUs than one host holds, the trial proposed spans
        # hosts, each holding its share of the ranks' host memory (per_host); a search's trial is judged whole
        # against its one host's memory (the driver's capacity)
        got = memory.judge(spec, self.capacity, self.host, self.calibration, FIT_SHARE,
                           per_host=NODE_GPUS if self.gpu else None)
        g, h = got["gpu_b"], got["host_b"]
        over = max(g / self.gpu_line if self.gpu else 0.0, h / self.host_line)
        return {"config": spec.config, "ranks": ranks, "gpu_gib": None if g is None else round(g / memory.GiB, 2),
                "host_gib": round(h / memory.GiB, 2), "over": round(over, 3), "spec": spec, "host_b": h,
                "fits": got["gpu"] is None and got["host"] is None, "fits_gpu": got["gpu"] is None}

    def variants(self, base: dict, ranks: int, first: dict | None = None) -> list[dict]:
        """base itself, every knob's other values one at a time, then base with each memory saver (cheapest first),
        at ranks: those the memory model predicts to fit, in that order; one knob's values by predicted step time.
        Then the same at micro-batch 1, where base's is larger (two knobs changed: a fixed micro-batch of 16 kept
        Pythia-1B off 64 GPUs)."""
        from trainscout.spaces import all_knobs, memory_savers
        from trainscout.predictor import steptime
        first = first or {}
        start = dict(base, **first)
        singles = []
        for knob in all_knobs():
            for v in knob.choices:
                if v == start.get(knob.name) or (knob.name == self.mb and (first or not isinstance(v, int))):
                    continue
                got = self.evaluate(dict(start, **{knob.name: v}), ranks)
                if _fits(got):
                    singles.append(dict(got, changes={**first, knob.name: v}))
        singles.sort(key=lambda c: steptime.step_s(c["spec"]))
        savers = []
        for s in memory_savers():
            got = self.evaluate(dict(start, **s), ranks)
            if _fits(got):
                savers.append(dict(got, changes={**first, **s}))
        same = self.evaluate(start, ranks)
        out = ([dict(same, changes=dict(first))] if _fits(same) else []) + singles + savers
        if not first and isinstance(base.get(self.mb), int) and base[self.mb] > 1:
            out += self.variants(base, ranks, {self.mb: 1})
        return out

    def differs(self, config: dict) -> dict:
        """The knobs of config that differ from their defaults, and the micro-batch."""
        return _differs(config, self.defaults, self.mb)

    def shown(self, c: dict) -> dict:
        """A variant as the answer shows it: its ranks and memory, its changes and whether the space holds them."""
        out = {k: c[k] for k in ("ranks", "gpu_gib", "host_gib") if c.get(k) is not None}
        if "changes" in c:
            in_space = all(v in self.space.domains.get(k, ()) or self.space.fixed.get(k) == v
                           for k, v in c["changes"].items())
            out.update(changes=c["changes"], in_space=in_space)
        return out


def _fits(c: dict | None) -> bool:
    return c is not None and c["fits"]


def _candidates(judge: _Judge, trials: list[dict]) -> list[dict]:
    """The start point's candidates (as start.fits tries them), then the draws pruned or out of memory, each once
    (by its configuration) with the memory model's verdict at the search's ranks and where it came from (source)."""
    import json

    from trainscout.spaces import memory_savers

    from .start import space_defaults, spec_at
    space, mb = judge.space, judge.mb
    sizes = [m for m in space.domains.get(mb, ()) if m != "max"]
    fixed_mb = space.fixed.get(mb)
    smallest = {mb: min(sizes) if sizes else 1} if sizes or fixed_mb == "max" else {}
    tried = []
    point = space_defaults(space)
    for extra, source in [({}, "the start point's defaults")] + [
            (s, "the start point's defaults with a memory saver") for s in memory_savers()
            if all(v in space.domains.get(k, ()) for k, v in s.items())]:
        spec = spec_at(judge.args, space, judge.hw, dict(point, **extra), **smallest)
        if spec is not None:
            tried.append((spec.config, source))
    for t in trials:
        if t["status"] in (Status.PRUNED, Status.OOM) and t["config"]:
            settings = {k: v for k, v in t["config"].items() if k in judge.defaults}
            if settings.get(mb) == "max":
                settings[mb] = 1
            tried.append((settings, f"{'a pruned draw' if t['status'] == Status.PRUNED else 'a trial out of memory'} "
                                    f"({t['trial'][-10:]})"))
    candidates, seen = [], set()
    for settings, source in tried:
        got = judge.evaluate(settings, judge.workers)
        if got is None:
            continue
        k = json.dumps(got["config"], sort_keys=True, default=str)
        if k not in seen:
            seen.add(k)
            candidates.append(dict(got, source=source))
    return candidates


def _ways(judge: _Judge, candidates: list[dict], closest: dict) -> list[dict]:
    """What would make the closest fit: more host memory (the candidate that fits the GPU with the least host
    memory), more GPUs (FSDP/ZeRO shard the model states over them; the CPU: fewer workers, each holding a copy),
    and a knob's value on this many ranks."""
    import math

    from trainscout.predictor import memory
    from trainscout.predictor.memory import MARGIN
    gpu, workers = judge.gpu, judge.workers
    base = dict(closest["config"])
    ways = []
    # more host memory: the candidate that fits the GPU with the least host memory, where the host refused it
    on_gpu = [c for c in candidates if c["fits_gpu"]] if gpu else candidates
    if on_gpu:  # the CPU: the closest itself (its memory is the host's)
        c = min(on_gpu, key=lambda c: (c["host_gib"], len(judge.differs(c["config"])))) if gpu else closest
        ways.append(dict(how="host", config=judge.differs(c["config"]), gpu_gib=c["gpu_gib"],
                         host_gib=c["host_gib"],
                         need_host_gib=math.ceil(c["host_b"] / (1 - MARGIN) / memory.GiB * 100) / 100,
                         host_has_gib=round(judge.host / memory.GiB, 2), source=c["source"]))
    # more ranks (a GPU: FSDP/ZeRO shard the model states over them); the CPU: fewer, each rank holds a copy there
    for ranks in (RANKS if gpu else range(workers - 1, 0, -1)):
        if gpu and ranks <= workers:
            continue
        found = judge.variants(base, ranks)
        if found:
            ways.append(dict(how="ranks", unit=judge.unit, **judge.shown(found[0])))
            break
    else:
        ways.append(dict(how="ranks", unit=judge.unit, ranks=None,
                         tried=list(RANKS) if gpu else list(range(1, workers))))
    found = [c for c in judge.variants(base, workers) if c["changes"]]
    ways.append(dict(how="knob", **judge.shown(found[0])) if found else dict(how="knob", ranks=workers, changes=None))
    return ways


def _differs(config: dict, defaults: dict, mb: str) -> dict:
    """The knobs of config that differ from their defaults, and the micro-batch."""
    return {k: v for k, v in config.items() if v != defaults.get(k) or k == mb}


def _settings(cfg: dict) -> str:
    return " ".join(f"{k}={fmt(v)}" for k, v in cfg.items())


def _gib(x: float) -> str:
    """GiB as the summary writes them: one decimal, two below 10 GiB."""
    return f"{x:.1f}" if x >= 10 else f"{x:.2f}"


def _n(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def fit_lines(fit: dict) -> list[str]:
    """nearest_fit's answer as the summary prints it."""
    c, gpu = fit["closest"], fit["device"] == "cuda"
    host = (f"host's {_gib(fit['host_gib'])} GiB less {fit['host_margin']:.0%} ({_gib(fit['host_fit_gib'])} GiB)")
    if gpu:
        over = (f"over the {fit['gpu']}'s {_gib(fit['gpu_gib'])} GiB (a start point must fit in "
                f"{fit['fit_share']:.0%}: {_gib(fit['fit_gib'])} GiB) or over the {host}")
        where = (f"{_gib(c['gpu_gib'])} GiB per GPU (line {_gib(fit['fit_gib'])}), host {_gib(c['host_gib'])} GiB "
                 f"(line {_gib(fit['host_fit_gib'])})")
    else:
        over = f"over the {host}"
        where = f"host {_gib(c['host_gib'])} GiB (line {_gib(fit['host_fit_gib'])})"
    lines = [f"nothing fits: the memory model puts every configuration this search tried or started from "
             f"({_n(fit['candidates'], 'configuration')}) {over}",
             f"  closest ({c['source']}): {_settings(c['config'])}: {where}, {c['over']:.2f}x what fits",
             "  what would make it fit:"]
    for w in fit["would_fit"]:
        if w["how"] == "host":
            on = f", {_gib(w['gpu_gib'])} GiB per GPU" if w.get("gpu_gib") is not None else ""
            lines.append(f"    a host with {_gib(w['need_host_gib'])} GiB of memory (this one has "
                         f"{_gib(w['host_has_gib'])}): {_settings(w['config'])} needs {_gib(w['host_gib'])} GiB "
                         f"of it{on}")
        elif w["how"] == "ranks" and w.get("ranks") is None:
            if w["tried"]:
                on = ", ".join(map(str, w["tried"][:-1])) + (", " if len(w["tried"]) > 1 else "")
                lines.append(f"    {'more GPUs' if gpu else 'fewer workers'}: none predicted to fit on "
                             f"{on}{_n(w['tried'][-1], w['unit'])} (as it is, with any one knob changed or with a "
                             "memory saver)")
        elif w["how"] == "ranks":
            lines.append(f"    {_n(w['ranks'], w['unit'])} (--gpus-per-trial {w['ranks']}): {_change(w)}")
        elif w.get("changes") is None:
            lines.append(f"    knob values: none predicted to fit on {_n(w['ranks'], fit['unit'])} (any one knob "
                         "changed, or a memory saver, at the closest's micro-batch or at 1)")
        else:
            lines.append(f"    knob values on {_n(w['ranks'], fit['unit'])}: {_change(w)}")
    return lines


def _change(w: dict) -> str:
    outside = "" if w["in_space"] else " (outside this search's space: give it with --set, or widen --space)"
    what = f"the closest with {_settings(w['changes'])}{outside}" if w["changes"] else "the closest as it is"
    per = f"{_gib(w['gpu_gib'])} GiB per GPU, " if w.get("gpu_gib") is not None else ""
    return f"{what}: {per}host {_gib(w['host_gib'])} GiB"


def nothing_line(summary: dict) -> str:
    """The one line a search that measured nothing ends with (its exit status 1): how its trials ended and, where
    nothing fits, the closest configuration and the first thing that would make it fit."""
    line = (f"search {summary['search']} measured nothing: {_n(summary['trials'], 'trial')}, none ok ("
            + ", ".join(f"{v} {k}" for k, v in sorted(summary["by_status"].items())) + ")")
    fit = summary.get("nothing_fits")
    if fit is None:
        return line + ": see each trial's reason above (trainscout results DIR, -v)"
    c = fit["closest"]
    gpu = f"{_gib(c['gpu_gib'])} GiB per GPU of {_gib(fit['gpu_gib'])}, " if c["gpu_gib"] is not None else ""
    line += (f"; nothing fits: the closest, {_settings(c['config'])}, needs {gpu}{_gib(c['host_gib'])} GiB of host "
             f"memory of {_gib(fit['host_gib'])}")
    ways = []
    for w in fit["would_fit"]:
        if w["how"] == "host":
            ways.append(f"a host with {_gib(w['need_host_gib'])} GiB")
        elif w.get("ranks") is not None and w.get("changes") is not None and (w["how"] == "ranks" or w["changes"]):
            change = f" with {_settings(w['changes'])}" if w["changes"] else ""
            ways.append(f"{_n(w['ranks'], w.get('unit') or fit['unit'])}{change}")
    return line + (f"; it would fit on {' or on '.join(ways)} (the summary above says more)" if ways else
                   "; no host memory, rank count or knob value the search looked at makes it fit")
