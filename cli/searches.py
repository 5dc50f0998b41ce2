"""The commands of a search and its store: search (run or resume; the CPU demo), results (list, export, import),
export."""
from __future__ import annotations

import json
import os
import sys
import textwrap

from trainscout.spaces import ConfigError
from trainscout.trial.records import TOKENS_PER_S
from trainscout.trial.status import Status

from .flags import EXIT_FAILED, EXIT_INTERRUPTED, input_file, out_folder, parse_sets, recipe_kwargs


SEARCH_RULES = """Search the knob space for the fastest configuration with real trials (Ray Tune + Optuna + ASHA):
a live table of the trials as they end, then a summary of the best ones (tokens/s, MFU, days of the recipe).

Output folders: a new search into a folder (or --storage) that already holds a search of that name (the folder's
name) is refused: continue it with --resume DIR, or give another --out. --resume DIR continues the search with the
settings it was started with; it may take a larger --trials (it says so), a --time-budget for this run, --storage
and --address; --model, --space, --set, --steps, --seed and the other settings may be repeated but not changed
(refused, naming the flag). A search does not measure a configuration twice while others are left. While a search runs
in a folder, a second one there is refused. Ctrl-C stops the running trials, keeps every result measured and exits 130;
--resume continues."""


# The CPU demo: tiny model, 2 workers, 6 trials, the knobs fixed where they would need a compiler (demo_sets)
DEMO = {"model": "tiny", "trials": 6, "workers": 2, "steps": 3, "warmup": 1}


def demo_sets() -> dict:
    """The knobs the CPU demo fixes, as --set values (Search.demo: no inductor, no DeepSpeed C++ ops)."""
    from trainscout.spaces import all_knobs, fmt
    return {k.name: fmt(k.search.demo) for k in all_knobs() if k.search.demo is not None}


# applied after parsing: a resume must know which flags were given
SEARCH_DEFAULTS = {"device": "auto", "gpus_per_trial": 1, "out": "runs/search", "seed": 0, "steps": 5, "warmup": 2,
                   "max_failures": 0, "one_node": True}


TRACKERS = ("mlflow", "wandb", "tensorboard")  # search --track: Ray Tune's own logger callbacks (search/driver.py)
TRACKER_PACKAGES = {"mlflow": ("mlflow", "mlflow"), "wandb": ("wandb", "wandb")}  # tracker: (module, extra)


def tracking(kinds: list[str] | None) -> list[str]:
    """--track's trackers, each once, in the order given; one whose package is missing is refused (exit 2) before
    anything starts, naming the extra that installs it (tensorboard: tensorboardX comes with ray[tune])."""
    import importlib.util
    out = list(dict.fromkeys(kinds or []))
    for kind in out:
        module, extra = TRACKER_PACKAGES.get(kind, (None, None))
        if module and importlib.util.find_spec(module) is None:
            raise ConfigError("--track", f"--track {kind} needs the {module} package, which is not installed: "
                                         f"pip install 'trainscout[{extra}]' (or leave --track {kind} out)")
    if "tensorboard" in out and importlib.util.find_spec("tensorboardX") is None:
        raise ConfigError("--track", "--track tensorboard needs tensorboardX (Ray Tune's TensorBoard writer), which "
                                     "is not installed: pip install tensorboardX")
    return out


def cmd_search(a) -> int:
    """`trainscout search`: run or resume a search; the live table, then the summary (-q: the summary alone). Where
    stdout is a terminal, every line it gets is fitted to its width (analysis.terminal.FitStream); a pipe gets
    whole lines."""
    from trainscout.analysis.terminal import FitStream, terminal_width
    real, width = sys.stdout, terminal_width(sys.stdout)
    if width is not None:
        sys.stdout = FitStream(real, width)
    try:
        return _search(a)
    finally:
        if sys.stdout is not real:
            sys.stdout.flush()
            sys.stdout = real


def _search(a) -> int:
    """`trainscout search` past the terminal: the dry run, or the search's arguments (resumed or new), its run, the
    summary again where -q or -v asks, and the exit status."""
    if a.dry_run or a.gpu or a.gpus or a.host_memory or a.gpu_memory:
        return _dry_run(a)
    track = tracking(a.track)
    from trainscout.search.service import run_search, summarize
    from trainscout.store import default_url, open_store
    out = sys.stderr if a.json else sys.stdout  # --json: the JSON alone on stdout, the rest on stderr
    input_file("--space", a.space)
    sets = parse_sets(a.set) if a.set else None
    recipe = {k: v for k, v in recipe_kwargs(a).items() if v is not None}
    args = _resumed_args(a, sets, recipe, out) if a.resume else _new_args(a, sets, recipe)
    # -q: the live table, its progress lines and the start line go nowhere; the summary is printed after it ends
    stream = open(os.devnull, "w", encoding="utf-8") if a.quiet else out
    try:
        summary = run_search(args, stream=stream, resume=bool(a.resume), started=getattr(a, "started", None),
                             track=track)
    finally:
        if stream is not out:
            stream.close()
    if a.quiet or a.verbose:
        store = open_store(args.storage or default_url(args.out))
        if a.quiet and not a.json:
            summarize(store, summary["search"], out, out=args.out)
        if a.verbose:
            print_failures(store, summary["search"], out)
    if a.json:
        print(json.dumps(summary))
    return _search_status(summary, args)


def _resumed_args(a, sets: dict | None, recipe: dict, out):
    """--resume DIR: the search's saved arguments with what this command line gives (a renamed folder's search
    continues under its own name); each note printed unless -q."""
    from trainscout.search.service import counted, resumed
    from trainscout.store import Store, default_url, storage_url
    if not os.path.isdir(a.resume):
        raise ConfigError("--resume", f"--resume {a.resume}: no such folder: give the --out folder of a search")
    if a.out is not None and os.path.abspath(a.out) != os.path.abspath(a.resume):
        raise ConfigError("--out", f"--out {a.out} with --resume {a.resume}: a resumed search stays in its folder: "
                                   "leave --out out")
    storage = storage_url(a.storage) if a.storage else None
    if storage is None and not os.path.isfile(os.path.join(a.resume, "results.db")):
        raise ConfigError("--resume", f"--resume {a.resume}: no search recorded there (no results.db): start one "
                                      "with --out, or give its --storage")
    store = Store(storage or default_url(a.resume))
    name = os.path.basename(os.path.abspath(a.resume))
    saved, folder = store.search_args(name), name
    if saved is None:  # a folder renamed since: its store's one search is the one to continue, under its name
        names = store.searches()
        saved = store.search_args(names[0]) if len(names) == 1 else None
        name = names[0] if saved is not None else name
    if saved is None:
        recorded = f" (it holds {', '.join(store.searches())}: give --storage and the matching folder name)" \
            if store.searches() else ""
        raise ConfigError("--resume", f"--resume {a.resume}: no search recorded there{recorded}: start one with "
                                      "--out")
    given = {"model": a.model, "device": a.device, "gpus_per_trial": a.gpus_per_trial, "space": a.space,
             "sets": sets, "seed": a.seed, "steps": a.steps, "warmup": a.warmup, "timeout": a.timeout,
             "max_failures": a.max_failures, "recipe": recipe, "trials": a.trials, "time_budget_s": a.time_budget,
             "storage": storage, "address": a.address, "quality": a.quality,
             "max_concurrent": a.max_concurrent, "one_node": a.one_node}
    args, notes = resumed(saved, a.resume, given, done=counted(store.trials(name)))
    if name != folder:
        args.name = name
        notes.append(f"the folder was named {name} when the search started: it continues as {name}")
    for note in notes if not a.quiet else ():
        print(f"resuming {name}: {note}", file=out)
    if gone := _unregistered_knobs(store, name):  # a plugin uninstalled since: its knobs leave the space
        print(f"trainscout: warning: resuming {name}: its measurements set {', '.join(gone)}, which no installed knob "
              "registers (a plugin's knob needs its package installed: `trainscout knobs` names the plugins that "
              "loaded): this run draws without them", file=sys.stderr)
    return args


def _unregistered_knobs(store, name: str) -> list[str]:
    """The settings of a search's measurements that no registered knob (nor a retired setting) names."""
    from trainscout.spaces import RETIRED, all_knobs
    known = {k.name for k in all_knobs()} | set(RETIRED)
    records = (store.get(t["key"]) for t in store.trials(name) if t["key"])
    return sorted({k for rec in records if rec is not None for k in rec.config} - known)


def _new_args(a, sets: dict | None, recipe: dict):
    """A new search's arguments: the flags given, the defaults for the rest; without --model and a GPU, the CPU
    demo's."""
    from trainscout.search.service import SearchArgs
    if a.model is None:
        import torch
        if torch.cuda.is_available():
            raise ConfigError("--model", "give --model (e.g. pythia-160m); without a GPU the default is a CPU demo")
        # the demo's small settings where the flag was not given (a given --steps, --warmup, --gpus-per-trial or
        # --trials is kept, as with --model)
        a.model, a.trials = DEMO["model"], a.trials or DEMO["trials"]
        for flag, key in (("gpus_per_trial", "workers"), ("steps", "steps"), ("warmup", "warmup")):
            if getattr(a, flag) is None:
                setattr(a, flag, DEMO[key])
        if not a.quiet:
            print(f"no GPU here: running the CPU demo search (tiny model, {a.gpus_per_trial} workers, {a.trials} "
                  "trials)", file=sys.stderr)
        sets = dict(demo_sets(), **(sets or {}))
    for k, v in SEARCH_DEFAULTS.items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    input_file("--model", a.model)
    return SearchArgs(model=a.model, out=a.out, device=a.device, gpus_per_trial=a.gpus_per_trial, trials=a.trials,
                      time_budget_s=a.time_budget, space=a.space, sets=sets or {}, storage=a.storage,
                      address=a.address, seed=a.seed, steps=a.steps, warmup=a.warmup, timeout=a.timeout,
                      max_failures=a.max_failures, recipe=recipe, quality=a.quality or "mark",
                      max_concurrent=a.max_concurrent, one_node=a.one_node)


def _search_status(summary: dict, args) -> int:
    """The exit status of a search that ran, with its line on stderr where it is not 0."""
    if summary.get("none_why"):  # exit 0 means it did what was asked: a run that ended no trial did not
        print(f"trainscout: error: this run of {summary['search']} ended no trial: {summary['none_why']}",
              file=sys.stderr)
        return EXIT_FAILED
    if summary.get("interrupted"):
        n = summary["trials"]
        print(f"trainscout: interrupted: {n} trial{'s' if n != 1 else ''} ended and {'are' if n != 1 else 'is'} kept "
              f"in the store; continue with: trainscout search --resume {args.out}", file=sys.stderr)
        return EXIT_INTERRUPTED
    if summary.get("unscheduled"):  # asked to measure them: it did not (the summary says why and what to do)
        n = summary["unscheduled"]
        print(f"trainscout: {n} trial{'s' if n != 1 else ''} unscheduled: the cluster gave "
              f"{'them' if n != 1 else 'it'} no room; continue with: trainscout search --resume {args.out}",
              file=sys.stderr)
        return 1
    if summary.get("nothing_measured"):  # no trial ended ok: what was asked (a measurement) was not done
        print(f"trainscout: error: {summary['nothing_measured']}", file=sys.stderr)
        return EXIT_FAILED
    return 0


DRY_RUN_ONLY = ("resume", "out", "storage", "address", "track", "max_concurrent", "time_budget")


def _dry_run(a) -> int:
    """`trainscout search --dry-run --gpu KIND`: what the search would hand to its trials, nothing run or written."""
    from trainscout.search.args import SearchArgs
    from trainscout.search.dry_run import dry_run, gpu_box, render

    from .lookups import host_memory
    from .flags import gpu_memory
    if not a.dry_run:
        flag = next(f for f in ("gpu", "gpus", "host_memory", "gpu_memory") if getattr(a, f))
        raise ConfigError(f"--{flag.replace('_', '-')}", f"--{flag.replace('_', '-')} describes the box of a dry "
                                                        "run: add --dry-run (a search runs on the GPUs it has)")
    if not a.gpu:
        raise ConfigError("--gpu", "--dry-run needs the GPU kind of the box: add --gpu, e.g. --gpu H100")
    if not a.model:
        raise ConfigError("--model", "--dry-run needs --model (a name or a config.json)")
    given = [f for f in DRY_RUN_ONLY if getattr(a, f) not in (None, False, [])]
    if given:
        flag = f"--{given[0].replace('_', '-')}"
        raise ConfigError(flag, f"{flag} does not apply to --dry-run, which runs and writes nothing: leave it out")
    if a.gpus and a.gpus_per_trial and a.gpus != a.gpus_per_trial:
        raise ConfigError("--gpus", f"--gpus {a.gpus} and --gpus-per-trial {a.gpus_per_trial} differ: give one")
    input_file("--model", a.model)
    input_file("--space", a.space)
    gpus = a.gpus or a.gpus_per_trial or 1
    hw = gpu_box(a.gpu, gpus, host_memory(a.host_memory) / 2**30 if a.host_memory else None,
                 gpu_memory(a.gpu_memory) / 2**30 if a.gpu_memory else None)
    from trainscout.trial.models import absolute
    args = SearchArgs(model=absolute(a.model), out="(dry run)", gpus_per_trial=gpus, space=a.space,
                      sets=parse_sets(a.set) if a.set else {}, seed=a.seed or 0, steps=a.steps or 5,
                      warmup=a.warmup if a.warmup is not None else 2, recipe={
                          k: v for k, v in recipe_kwargs(a).items() if v is not None})
    result = dry_run(args, hw, a.trials or 30)
    print(json.dumps(result["configs"]) if a.json else render(result))
    return 0


def print_failures(store, search: str, stream) -> None:
    """-v: every trial of a search that did not end ok, with its whole reason and its ranks' stderr tail if kept."""
    for t in store.trials(search):
        if t["status"] in (Status.OK, Status.STOPPED):
            continue
        print(f"trial {t['trial']} {t['status']}: {t['error'] or 'no reason recorded'}", file=stream)
        rec = store.get(t["key"]) if t["key"] else None
        if rec is not None and rec.stderr_tail:
            print(textwrap.indent(rec.stderr_tail, "    "), file=stream)


INTEGER_COLUMNS = ("world_size",)  # read as floats where a row lacks them (a trial without a record)


def cmd_results(a) -> int:
    """`trainscout results`: a store's trials as a table, CSV or JSON; or --export/--import of its measurements."""
    from trainscout.analysis.table import dumps, store_of
    if a.export_file or a.import_file:
        return _move_records(a)
    if a.share:
        raise ConfigError("--share", "--share goes with --export FILE: write e.g. --export mine.jsonl --share")
    store = store_of(a.source)
    df = _trials_frame(a, store)
    if a.format == "csv":
        print(df.to_csv(index=False), end="")
    elif a.format == "json":
        print(dumps(df))
    else:
        _print_table(a, df, store)
    return 0


def _move_records(a) -> int:
    """results --import FILE (each refused record printed with its reason; exit 1 if any was) or --export FILE
    (--share: a contribution file)."""
    from trainscout.analysis.table import store_of
    from trainscout.store import storage_url
    if a.import_file:
        input_file("--import", a.import_file)
        if "://" in a.source:
            a.source = storage_url(a.source, "DIR")  # an in-memory store would drop what is imported
        else:
            out_folder("DIR", a.source)
        store = store_of(a.source, create=True)
        added, present, refused = store.import_jsonl(a.import_file)
        store.checkpoint()
        for n, key, why in refused:  # each one, with its reason (store/contrib.py: the rules)
            print(f"trainscout: refused: {a.import_file} line {n} (key {key[:12]}): {why}", file=sys.stderr)
        print(f"imported {added} measurements, {present} already present"
              + (f", {len(refused)} refused" if refused else ""))
        return 1 if refused else 0
    if a.share:
        from trainscout.store.contrib import export_share
        n, left = export_share(store_of(a.source), a.export_file)
        print(f"exported {n} measurements to {a.export_file} to share (provenance and a content hash per row; no "
              "paths, host names or logs)" + "".join(f"; left out {k}: {v}" for k, v in sorted(left.items())))
    else:
        print(f"exported {store_of(a.source).export_jsonl(a.export_file)} measurements to {a.export_file}")
    return 0


def _trials_frame(a, store):
    """The store's trials as results lists them: whole numbers as integers, filtered by --model, --status and --gpu,
    sorted by --sort."""
    from trainscout.analysis.table import METRICS, load_resolved
    df = load_resolved(store)  # a store of measurements alone too (a grid, an import)
    for col in df.columns:  # whole numbers print as such (`1`, not `1.0`), also beside rows without a value
        vals = df[col].dropna()
        if df[col].dtype.kind == "f" and (col in INTEGER_COLUMNS or col not in METRICS) and len(vals) \
                and (vals == vals.round()).all():
            df[col] = df[col].astype("Int64")
    if a.model:  # a part of the model's name (its config.json's file name, or pythia)
        df = df[df["model"].astype(str).str.contains(a.model, case=False, regex=False)]
    if a.status:  # one status exactly: oom is not host_oom
        df = df[df["status"].astype(str).str.lower() == a.status.lower()]
    if a.gpu:  # one GPU kind exactly (H20 is not H200), or a measured name that is no kind
        from trainscout.trial.gpus import asked_kind, gpu_kind
        names = tuple(n for n in df["gpu"].dropna().astype(str).unique())
        kind = asked_kind(a.gpu, "--gpu", tuple(n for n in names if gpu_kind(n) is None))
        df = df[df["gpu"].fillna("").astype(str).map(lambda n: gpu_kind(n) == kind or n.lower() == kind.lower())]
    if a.sort:
        if a.sort not in df.columns:
            raise ConfigError("--sort", f"--sort {a.sort}: no such column: use one of {', '.join(df.columns)}")
        df = df.sort_values(a.sort, ascending=a.sort not in (TOKENS_PER_S, "mfu"), na_position="last")
    return df


def _print_table(a, df, store) -> None:
    """results' table for people: the columns a row has, within the terminal's width, then the best where it ties."""
    from trainscout.analysis.table import best_choice, fit_table
    from trainscout.analysis.terminal import terminal_width
    from trainscout.spaces import all_knobs
    from trainscout.store import one_line
    knobs = [k.name for k in sorted((k for k in all_knobs() if k.search.column), key=lambda k: k.search.column)]
    shown = [c for c in ("search", "status", TOKENS_PER_S, "mfu", "quality", "peak_memory_gib", "projected_days",
                         *knobs, "key", "error") if c in df.columns]
    if df["samples"].fillna(0).gt(1).any():  # a key measured more than once: how often, and the spread
        shown[3:3] = ["samples", "tokens_per_s_spread"]
    if df["placement"].fillna("").str.contains("nodes").any():  # a trial split over nodes: say so
        shown[3:3] = ["placement"]
    if df["shared"].notna().any():  # measured while other trials shared its CPU/GPU: kept apart, never served
        shown[3:3] = ["shared"]
    width = 4000 if a.verbose else 80  # -v: the whole reason, on one line
    df = df.assign(error=[one_line(e, width) if isinstance(e, str) else "" for e in df["error"]])
    # missing: "-"; on a terminal, within its width (a pipe: every column whole)
    print(fit_table(df[shown], terminal_width()) if len(df) else "no trials")
    choice = best_choice(store)
    if choice is not None and len(choice.tied) > 1:  # the best and what it ties with (rule: README, ties)
        from trainscout.analysis.terminal import fit_text
        print(fit_text(f"best: {choice.best.key}" + (f"; {choice.line()}" if choice.is_tie else
              f" (the fastest and the simplest of {len(choice.tied)} within the measured noise "
              f"({choice.noise:.1%}): {', '.join(r.key[:12] for r in choice.tied if r.key != choice.best.key)})"),
              terminal_width()))


def cmd_export(a) -> int:
    """`trainscout export`: write a measured configuration's files; prints each path, then what was not exported."""
    from trainscout.analysis.export import FORMATS, export
    from trainscout.analysis.table import best_choice, measurement, store_of
    if bool(a.trial) == bool(a.best):
        raise ConfigError("--best", "give --best or --trial KEY (one of them)")
    out_folder("--out", a.out)
    formats = FORMATS if a.format == "all" else (a.format,)
    store = store_of(a.source)
    rec = measurement(store, key=a.trial, best=a.best)
    for path in export(rec, a.out, formats, measurements=store.measurements(),
                       verified=store.quality(rec.key, "verify")):
        print(path)
    if a.best and (tie := best_choice(store).line()):
        print(f"note: {tie}")
    with open(os.path.join(a.out, "trainscout.json"), encoding="utf-8") as f:
        exported = json.load(f)
    print(f"quality: {exported['quality']['status']}: {exported['quality']['why']}")
    for fmt, why in exported["not_exported"].items():
        print(f"not exported: {fmt}: {why}")
    how = exported["launch"]
    print(f"launch (from {a.out}): {how['command']}" + ("   or ./launch.sh (trainscout train)" if "command" in formats
                                                         and how["launcher"] != "trainscout" else ""))
    if "hf" in formats and "hf" not in exported["not_exported"]:
        version = exported.get("transformers_version")  # training_args.json is a plain TrainingArguments file
        print(f"training_args.json was written for transformers {version}: load it with "
              f"trainscout.runtime.hf.training_arguments({a.out!r}), which adapts it to the installed version")
    for note in exported.get("notes", []):
        print(f"note: {note}")
    if exported["hook"] and "hf" in formats:
        print(f"training_args.json cannot express {', '.join(exported['hook'])}: apply them with "
              f"trainscout.runtime.hf.prepare(model, {a.out!r}) (README: your own trainer); a stock Trainer without it "
              "runs without them, slower than measured")
        for item, cost in exported.get("hook_cost", {}).items():
            if cost:
                print(f"  without {item} ({cost['without']}, measured in this store): {cost[TOKENS_PER_S]:,.0f} "
                      f"tokens/s = {cost['ratio']:.3f} x")
    return 0
