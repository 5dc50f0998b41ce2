"""A search's summary: trials by status, per-trial overhead, the fastest distinct configurations and their quality."""
from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from trainscout.spaces import fmt
from trainscout.trial.metrics import median
from trainscout.trial.status import Status

from .trainable import counted

if TYPE_CHECKING:
    from trainscout.store import Store


def clock(seconds: float) -> str:
    """4m12s, 1h05m, 37s."""
    s = int(round(seconds))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


def days_or_hours(d: float) -> str:
    """1.5 days, 3.00 hours."""
    return f"{d:.1f} days" if d >= 1 else f"{d * 24:.2f} hours"


def _verify_hint(b: dict, out: str) -> str:
    """What to run where a best's numerics differ and no training run has compared it with its reference."""
    if b["quality"] in ("same", "verified"):
        return ""
    return f"; train both to compare: trainscout verify {out} --trial {b['key'][:12]} --quality 500"


def overhead_s(record) -> float:
    """A measured trial's orchestration overhead: its wall less its timed steps (those of micro_batch_size=max's
    compared micro-batch too): start-up, build, probe, compile, warm-up, the quality gate, teardown."""
    return record.wall_s - record.metrics["timed_s"] - record.metrics.get("compared_timed_s", 0.0)


def overhead_parts(records: list, overhead: list[float]) -> str:
    """Medians of what the trials' overhead is made of (the parts a record times), and how many started a fresh
    worker group."""
    m = [r.metrics for r in records]
    parts = []
    timed_parts = all(x.get("model_s") is not None for x in m)  # records since 2026-12-04 time the model and gate
    if timed_parts:
        parts.append(f"model and engine {median([x['model_s'] for x in m]):.1f} s")
        steps = [x['build_s'] - x['model_s'] + x['warmup_s'] for x in m]
        if all(x.get("compile_s") is not None for x in m):  # records since 2026-12-05 time torch.compile too
            parts.append(f"torch.compile {median([x['compile_s'] for x in m]):.1f} s")
            tuned = (f" (inductor autotuning new kernels {median([x['autotune_s'] for x in m]):.1f} s)"
                     if all(x.get("autotune_s") is not None for x in m) else "")
            parts.append(f"probe or warm-up steps {median([s - x['compile_s'] for s, x in zip(steps, m)]):.1f} s{tuned}")
        else:
            parts.append(f"compile and probe or warm-up steps {median(steps):.1f} s")
    else:
        parts.append(f"build, probe and warm-up {median([x['build_s'] + x['warmup_s'] for x in m]):.1f} s")
    gates = [x["gate_s"] for x in m if x.get("gate_s")]
    if gates:
        parts.append(f"quality gate {median(gates):.1f} s in {len(gates)} of {len(m)}")
    rest = [o - x["build_s"] - x["warmup_s"] - (x.get("gate_s") or 0.0) for o, x in zip(overhead, m)]
    if all(x.get("handoff_s") is not None for x in m):  # records since 2026-12-05 (session 21) time the rest too
        inside = [r - x["handoff_s"] - x["reset_s"] for r, x in zip(rest, m)]
        parts.append(f"the rest {median(rest):.1f} s (hand-off: Ray, a worker group's start or a stopped trial's "
                     f"last step {median([x['handoff_s'] for x in m]):.1f}, the reset after "
                     f"{median([x['reset_s'] for x in m]):.1f}, in the trial otherwise {max(0.0, median(inside)):.1f})")
        parts.append(f"Python's garbage collector ran {median([x['gc_s'] for x in m]):.1f} s within the trial's parts")
    else:
        parts.append(f"the rest {median(rest):.1f} s (worker start or hand-off, teardown, the store"
                     f"{'' if timed_parts else ', any quality gate'})")
    fresh = sum(1 for r in records if not r.reused)
    return ", ".join(parts) + f"; {fresh} of {len(records)} in a fresh worker group"


_FITS: dict[tuple[str, str], dict] = {}  # (store URL, search) -> nearest_fit's answer given to summarize here


def summarize(store: Store, name: str, stream=sys.stdout, top: int = 3, out: str = "OUT",
              fit: dict | None = None) -> dict:
    """Print a search's outcome to stream: trials by status, per-trial overhead, the `top` fastest distinct
    configurations, each with its quality status (trial/quality.py: the same model as its reference, or not, or
    not known); a search run with --quality strict calls best only those that train the same model (same, passed,
    verified) and names the faster ones it passed over. Where no trial ended ok it says so, and fit (nearest_fit's
    answer; the one this process gave for the search before, where none is given: `search -q` prints the summary
    again) says which configuration came closest to fitting and what would make it fit ("nothing_fits").
    Returns the same as a dict."""
    from trainscout.trial import quality
    if fit is not None:
        _FITS[(store.url, name)] = fit
    fit = fit or _FITS.get((store.url, name))
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
                     "quality": status, "quality_why": why, "notes": rec.plan.notes if rec.plan else []})
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
    # orchestration overhead, in the order the trials ran
    ran = [r for r in (store.get(t["key"]) for t in trials if t["status"] == Status.OK and t["key"] and not t["cached"])
           if r and r.wall_s]
    overhead = [overhead_s(r) for r in ran]
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
        parts = overhead_parts(ran[1:] or ran, overhead[1:] or overhead)
        print(f"  where it went{' after the first' if len(ran) > 1 else ''}: {parts}", file=stream)
    tied = set(tie["tied"]) if tie else set()
    for i, b in enumerate(best[:top], 1):
        mfu = f", MFU {b['mfu']:.3f}" if b["mfu"] else ""
        cfg = " ".join(f"{k}={fmt(v)}" for k, v in b["config"].items())
        mark = " (tie)" if b["key"] in tied else ""
        print(f"best #{i}{mark}: {b['tokens_per_s']:,.0f} tokens/s{mfu}, {b['peak_memory_gib']:.1f} GiB, "
              f"{days_or_hours(b['projected_days'])} for the recipe\n         {cfg}\n         quality: {b['quality']}: "
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
    summary["measured"] = by_status.get(Status.OK, 0)  # trials that ended ok (answered from the store included)
    if trials and not summary["measured"]:
        print(f"nothing measured: no trial of this search ended ok ("
              + ", ".join(f"{v} {k}" for k, v in sorted(by_status.items())) + "): no configuration to call best",
              file=stream)
        if fit is not None:
            summary["nothing_fits"] = fit
            print("\n".join(fit_lines(fit)), file=stream)
    print(f"results: trainscout results {out}   export: trainscout export {out} --best --format all", file=stream)
    return summary


# --- a search that measured nothing: the configuration closest to fitting, and what would make it fit -------------
RANKS = (2, 4, 8, 16, 32, 64)  # rank counts tried for "on N GPUs"
NODE_GPUS = 8  # ranks of one host beyond which a trial spans hosts (each host then holds the memory of 8)


def nearest_fit(args, space, hw: dict, calibration: dict | None, host: float, trials: list[dict]) -> dict | None:
    """Where a search measured nothing: the configuration the memory model puts closest to fitting, among the start
    point's candidates (the defaults at the smallest micro-batch, and with each memory saver of the space, as
    search/start.fits tries them) and the draws pruned or out of memory, and what would make it fit: the host
    memory a configuration that fits the GPU needs (trial/memory.host_refusal's rule), the fewest GPUs (the memory
    model at more ranks: FSDP/ZeRO shard over them) and a knob's value on this many, each predicted by
    trial/memory.predict with the search's calibration. A configuration fits where it is predicted within FIT_SHARE
    of the GPU's memory (the line of a start point) and within the host's memory less MEMORY_MARGIN (what the
    search prunes by). None where the closest is predicted to fit (the trials failed otherwise: their reasons say
    why)."""
    import json
    import math

    from trainscout.spaces import ConfigError, all_knobs, get, memory_savers, micro_batch
    from trainscout.trial import memory, prepare
    from trainscout.trial.memory import FIT_SHARE, MARGIN

    from .start import space_defaults, spec_at
    gpu = hw["device"] == "cuda" and bool(hw.get("gpu_memory_gib"))
    unit = "GPU" if gpu else "worker"
    gpu_line = FIT_SHARE * hw["gpu_memory_gib"] * memory.GiB if gpu else None
    host_line = host * (1 - MARGIN)
    workers = args.gpus_per_trial
    mb = micro_batch().name
    sizes = [m for m in space.domains.get(mb, ()) if m != "max"]
    fixed_mb = space.fixed.get(mb)
    smallest = {mb: min(sizes) if sizes else 1} if sizes or fixed_mb == "max" else {}
    defaults = {k.name: k.default for k in all_knobs()}

    def evaluate(settings: dict, ranks: int) -> dict | None:
        """The memory model's verdict on settings at ranks (None: the rules refuse it)."""
        box = dict(hw, gpu_count=max(ranks, hw.get("gpu_count") or 1)) if gpu else hw
        try:
            spec = prepare(args.model, settings, workers=ranks, hw=box, gate=False, **args.recipe)
        except ConfigError:
            return None
        g = memory.predict(spec, calibration) if gpu else None
        # a trial of more ranks than one host holds spans hosts: each holds its share of the ranks' host memory
        h = memory.host_need(memory.host_peak(spec)) * (min(ranks, NODE_GPUS) / ranks if gpu else 1.0)
        over = max(g / gpu_line if gpu else 0.0, h / host_line)
        return {"config": spec.config, "ranks": ranks, "gpu_gib": None if g is None else round(g / memory.GiB, 2),
                "host_gib": round(h / memory.GiB, 2), "over": round(over, 3), "spec": spec, "host_b": h}

    # the candidates: the start point's (as start.fits tries them), then the draws pruned or out of memory
    candidates, seen = [], set()

    def add(settings: dict, source: str) -> None:
        got = evaluate(settings, workers)
        if got is None:
            return
        k = json.dumps(got["config"], sort_keys=True, default=str)
        if k not in seen:
            seen.add(k)
            candidates.append(dict(got, source=source))
    point = space_defaults(space)
    for extra, source in [({}, "the start point's defaults")] + [
            (s, "the start point's defaults with a memory saver") for s in memory_savers()
            if all(v in space.domains.get(k, ()) for k, v in s.items())]:
        spec = spec_at(args, space, hw, dict(point, **extra), **smallest)
        if spec is not None:
            add(spec.config, source)
    for t in trials:
        if t["status"] in (Status.PRUNED, Status.OOM) and t["config"]:
            settings = {k: v for k, v in t["config"].items() if k in defaults}
            if settings.get(mb) == "max":
                settings[mb] = 1
            add(settings, f"{'a pruned draw' if t['status'] == Status.PRUNED else 'a trial out of memory'} "
                          f"({t['trial'][-10:]})")
    if not candidates:
        return None
    # the least over its line; of equals (a CPU rank's process outweighs a tiny model), the fewest knobs changed
    closest = min(candidates, key=lambda c: (c["over"], len(_differs(c["config"], defaults, mb))))
    if closest["over"] <= 1.0:
        return None

    def fits(c: dict | None) -> bool:
        return c is not None and c["over"] <= 1.0

    def variants(base: dict, ranks: int, first: dict | None = None) -> list[dict]:
        """base itself, every knob's other values one at a time, then base with each memory saver (cheapest first),
        at ranks: those the memory model predicts to fit, in that order; one knob's values by predicted step time.
        Then the same at micro-batch 1, where base's is larger (two knobs changed: a fixed micro-batch of 16 kept
        Pythia-1B off 64 GPUs)."""
        from trainscout.trial import steptime
        first = first or {}
        start = dict(base, **first)
        singles = []
        for knob in all_knobs():
            for v in knob.choices:
                if v == start.get(knob.name) or (knob.name == mb and (first or not isinstance(v, int))):
                    continue
                got = evaluate(dict(start, **{knob.name: v}), ranks)
                if fits(got):
                    singles.append(dict(got, changes={**first, knob.name: v}))
        singles.sort(key=lambda c: steptime.step_s(c["spec"]))
        savers = []
        for s in memory_savers():
            got = evaluate(dict(start, **s), ranks)
            if fits(got):
                savers.append(dict(got, changes={**first, **s}))
        same = evaluate(start, ranks)
        out = ([dict(same, changes=dict(first))] if fits(same) else []) + singles + savers
        if not first and isinstance(base.get(mb), int) and base[mb] > 1:
            out += variants(base, ranks, {mb: 1})
        return out

    def in_space(changes: dict) -> bool:
        return all(v in space.domains.get(k, ()) or space.fixed.get(k) == v for k, v in changes.items())

    def shown(c: dict) -> dict:
        out = {k: c[k] for k in ("ranks", "gpu_gib", "host_gib") if c.get(k) is not None}
        if "changes" in c:
            out.update(changes=c["changes"], in_space=in_space(c["changes"]))
        return out
    base = dict(closest["config"])
    ways = []
    # more host memory: the candidate that fits the GPU with the least host memory, where the host refused it
    on_gpu = [c for c in candidates if c["gpu_gib"] is not None and c["gpu_gib"] * memory.GiB <= gpu_line] if gpu \
        else candidates
    if on_gpu:  # the CPU: the closest itself (its memory is the host's)
        c = min(on_gpu, key=lambda c: (c["host_gib"], len(_differs(c["config"], defaults, mb)))) if gpu else closest
        ways.append(dict(how="host", config=_differs(c["config"], defaults, mb), gpu_gib=c["gpu_gib"],
                         host_gib=c["host_gib"],
                         need_host_gib=math.ceil(c["host_b"] / (1 - MARGIN) / memory.GiB * 100) / 100,
                         host_has_gib=round(host / memory.GiB, 2), source=c["source"]))
    # more ranks (a GPU: FSDP/ZeRO shard the model states over them); the CPU: fewer, each rank holds a copy there
    for ranks in (RANKS if gpu else range(workers - 1, 0, -1)):
        if gpu and ranks <= workers:
            continue
        found = variants(base, ranks)
        if found:
            ways.append(dict(how="ranks", unit=unit, **shown(found[0])))
            break
    else:
        ways.append(dict(how="ranks", unit=unit, ranks=None, tried=list(RANKS) if gpu else list(range(1, workers))))
    found = [c for c in variants(base, workers) if c["changes"]]
    ways.append(dict(how="knob", **shown(found[0])) if found else dict(how="knob", ranks=workers, changes=None))
    return {"device": hw["device"], "gpu": hw.get("gpu"), "gpu_gib": hw.get("gpu_memory_gib"),
            "fit_share": FIT_SHARE, "fit_gib": round(gpu_line / memory.GiB, 2) if gpu else None,
            "host_gib": round(host / memory.GiB, 2), "host_margin": MARGIN,
            "host_fit_gib": round(host_line / memory.GiB, 2),
            "ranks": workers, "unit": unit,
            "closest": {"source": closest["source"], "config": _differs(closest["config"], defaults, mb),
                        "gpu_gib": closest["gpu_gib"], "host_gib": closest["host_gib"], "over": closest["over"]},
            "candidates": len(candidates), "would_fit": ways}


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
