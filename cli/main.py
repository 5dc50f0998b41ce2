"""The `trainscout` command line. Bad input ends with one line naming the field and the fix, and exit code 2.

--json prints the machine output alone on stdout (progress and notes go to stderr); -q leaves out progress (the
live table of a search, a progress bar, hints), -v adds the detail the code has (each failed trial's error and its
ranks' stderr tail)."""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import stat
import sys
import textwrap
import warnings

from trainscout.spaces import ConfigError
from trainscout.trial.status import Status

EXIT_FAILED = 1  # the outcome is a failure: a trial, verify or train that did not end ok; the store failed
EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports Ctrl-C
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE: the reader of stdout went away (`trainscout knobs --json | head`)

DESCRIPTION = """What is the fastest way to pre-train model X on the GPUs I have, and how many days and dollars will
the run take? trainscout measures real training configurations (ZeRO, FSDP2, offload, activation checkpointing,
micro-batch, compile, precision, attention kernel, ...) in worker processes, times them with GPU synchronisation,
and searches the space with Ray Tune + Optuna instead of a grid."""

EPILOG = """a typical session:
  trainscout estimate --model pythia-1b --set zero_stage=2 --gpu-memory 141GB
  trainscout search --model pythia-1b --time-budget 2h --out runs/1b
  trainscout report runs/1b
  trainscout export runs/1b --best --out runs/1b/best

`trainscout COMMAND --help` shows a command's flags with their defaults and an example. Exit status: 0 done, 1 the
measured outcome is a failure (a trial, verify or train that did not end ok; an estimate that does not fit; a
search trial the cluster gave no room: unscheduled) or the results store failed while in use (deleted, full,
read-only: the line says what was kept), 2 bad input, 130 interrupted."""


class HelpFormatter(argparse.HelpFormatter):
    """Help that shows each flag's default (None and False are not shown: the help text says what applies) and
    keeps indented lines (the examples) as written; other text is wrapped to the terminal."""

    def _get_help_string(self, action):
        text = action.help or ""
        if "%(default)" in text or not action.option_strings or action.default in (None, False, argparse.SUPPRESS):
            return text
        return f"{text} (default: %(default)s)"

    def _fill_text(self, text, width, indent):
        out, words = [], []

        def flush():
            if words:
                out.append(textwrap.fill(" ".join(words), width, initial_indent=indent, subsequent_indent=indent))
                words.clear()
        for line in text.splitlines():
            if not line.strip() or line.startswith(" "):
                flush()
                out.append(indent + line if line.strip() else "")
            else:
                words.extend(line.split())
        flush()
        return "\n".join(out)


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors (no usage block) and exit code 2."""

    def error(self, message):
        """Raise the usage error as a ConfigError naming the flag (main prints it as one line, exit 2)."""
        flag = re.search(r"argument ([^:\s]+)", message)
        raise ConfigError(flag.group(1) if flag else "arguments", f"{message} (see `{self.prog} --help`)")


def parse_sets(items: list[str] | None) -> dict[str, str]:
    """--set knob=value, repeatable."""
    out: dict[str, str] = {}
    for item in items or []:
        name, eq, value = item.partition("=")
        if not eq or not name.strip() or not value.strip():
            raise ConfigError("--set", f"--set {item!r} is not knob=value: write e.g. --set zero_stage=2")
        if name.strip() in out:
            raise ConfigError("--set", f"--set {name.strip()} is given twice: keep one")
        out[name.strip()] = value.strip()
    return out


def positive_int(flag: str):
    """An argparse type: a whole number >= 1 (flag kept for the help text)."""
    def conv(s: str) -> int:
        try:
            v = int(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{s!r} is not a whole number: give a positive integer")
        if v < 1:
            raise argparse.ArgumentTypeError(f"{v} is not allowed: give a positive integer")
        return v
    return conv


def positive_seconds(flag: str):
    """An argparse type: a finite number of seconds > 0 (leaving the flag out means the default)."""
    def conv(s: str) -> float:
        try:
            v = float(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{s!r} is not a number: give a positive number of seconds")
        if not (0 < v < math.inf):
            raise argparse.ArgumentTypeError(f"{s} is not allowed: give a positive number of seconds "
                                             "(leave the flag out for the default)")
        return v
    return conv


def seed_int(s: str) -> int:
    """An argparse type: a sampler seed, 0 .. 2**32 - 1 (numpy's range, which Optuna's samplers use)."""
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{s!r} is not a whole number: give an integer from 0 to {2**32 - 1}")
    if not 0 <= v < 2**32:
        raise argparse.ArgumentTypeError(f"{v} is not allowed: give an integer from 0 to {2**32 - 1}")
    return v


def input_file(flag: str, path: str | None) -> None:
    """An input file given by a flag: a FIFO, a device or a socket is refused (reading one blocks forever); a
    missing path is left to the reader, which names what it needs."""
    if path is None:
        return
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        raise ConfigError(flag, f"{flag} {path} is not a regular file (a pipe, a device or a socket): give a file")


def out_folder(flag: str, path: str | None) -> str:
    """An output folder, checked before anything runs (trainscout.store.check_folder)."""
    from trainscout.store import check_folder
    return check_folder(path, flag)


SIZE = re.compile(r"\s*((?:\d+(?:\.\d*)?|\.\d+))\s*(gib|gb|mib|mb|g)\s*", re.I)


def gpu_memory(text: str) -> float:
    """--gpu-memory: a positive finite size with a unit (80GiB, 141GB, 512MiB) in bytes; a bare number, zero,
    a negative size or inf is refused (a bare number was read as bytes: every configuration 'did NOT fit')."""
    from trainscout.trial import memory
    m = SIZE.fullmatch(text or "")
    value = memory.parse_size(text) if m else 0.0
    if not m or not (0 < value < math.inf):
        raise ConfigError("--gpu-memory", f"--gpu-memory {text} is not a size: give a positive size with a unit, "
                                          "e.g. 80GiB or 141GB (GiB, GB, MiB or MB)")
    return value


def nonneg_float(flag: str):
    """An argparse type: a finite number >= 0."""
    def conv(s: str) -> float:
        try:
            v = float(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{s!r} is not a number: give a finite number >= 0")
        if not (0 <= v < float("inf")):
            raise argparse.ArgumentTypeError(f"{s} is not allowed: give a finite number >= 0")
        return v
    return conv


def add_recipe_flags(p: argparse.ArgumentParser) -> None:
    """The training recipe's flags (global batch, sequence length, run length, clipping) of a command."""
    g = p.add_argument_group("recipe (defaults: the model's, e.g. Pythia: 1024 x 2048 tokens, 143,000 steps)")
    g.add_argument("--global-batch", type=positive_int("--global-batch"), help="sequences per optimizer step")
    g.add_argument("--seq-len", type=positive_int("--seq-len"), help="tokens per sequence")
    g.add_argument("--train-steps", type=positive_int("--train-steps"), help="optimizer steps of the full run")
    g.add_argument("--train-tokens", type=positive_int("--train-tokens"), help="tokens of the full run (sets the steps)")
    g.add_argument("--grad-clip", type=nonneg_float("--grad-clip"), help="gradient clipping norm (0 = off)")


def recipe_kwargs(a) -> dict:
    """The recipe flags as keyword arguments of trial.prepare (None: the model's own)."""
    return dict(global_batch=a.global_batch, seq_len=a.seq_len, total_steps=a.train_steps,
                total_tokens=a.train_tokens, grad_clip=a.grad_clip)


# --- commands -------------------------------------------------------------------------------------------------
def cmd_knobs(a) -> int:
    """`trainscout knobs`: the table of knobs (-v: the module each comes from; -q: without the hint)."""
    from trainscout import spaces
    rows = []
    for k in spaces.all_knobs():
        req = ", ".join(f"{o}={'|'.join(spaces.fmt(v) for v in vals)}" for o, vals in k.requires.items()) or "-"
        rows.append({"name": k.name, "domain": k.domain_text(), "default": spaces.fmt(k.default),
                     "requires": req, "description": k.description, "module": type(k).__module__})
    if a.json:
        print(json.dumps(rows, indent=2))
        return 0
    columns = ("name", "domain", "default", "requires") + (("module",) if a.verbose else ())
    widths = {c: max(len(c), *(len(r[c]) for r in rows)) for c in columns}
    print("  ".join(c.upper().ljust(widths[c]) for c in widths) + "  DESCRIPTION")
    for r in rows:
        print("  ".join(r[c].ljust(widths[c]) for c in widths) + "  " + r["description"])
    if not a.quiet:
        print("\nSet a knob with --set NAME=VALUE. A knob with requirements may only leave its default when they hold.")
    return 0


def cmd_trial(a) -> int:
    """`trainscout trial`: measure one configuration; exit 1 when its outcome is a failure."""
    from trainscout.trial import execute, prepare
    input_file("--model", a.model)
    spec = prepare(a.model, parse_sets(a.set), device=a.device, workers=a.workers, steps=a.steps, warmup=a.warmup,
                   measure_accum=a.measure_accum, fault=a.inject_fault, **recipe_kwargs(a))
    record = execute(spec, timeout=a.timeout, address=a.address, one_node=a.one_node)
    if a.json:
        print(json.dumps(record.to_dict()))
    else:
        print_trial(record, verbose=a.verbose)
    return 0 if record.ok else 1


def print_trial(r, verbose: bool = False) -> None:
    """A trial's Record, as the `trial` command prints it (verbose: a failed trial's ranks' stderr tail too)."""
    cfg = " ".join(f"{k}={v}" for k, v in r.config.items())
    print(f"trial {r.trial_id}  model {r.model}  device {r.device} x{r.world_size}  status {r.status}")
    print(f"config   {cfg}")
    m = r.metrics
    if not m:
        print(f"error    {r.error}")
        if verbose and r.stderr_tail:
            print("stderr   the ranks' last lines:\n" + textwrap.indent(r.stderr_tail, "    "))
        return
    rec = r.recipe
    fpt = f"{m['flops_per_token'] / 1e9:.2f} GFLOPs per token ({m.get('flops_convention', 'dense-6N')}: "\
          f"{m['active_params'] / 1e6:,.1f} M active matmul parameters)" if m.get("active_params") else ""
    mfu = (f"{m['mfu']:.3f}, HFU {m['hfu']:.3f}" if m.get("hfu") is not None else f"{m['mfu']:.3f}") \
        if m["mfu"] is not None else "n/a (no GPU peak known)"
    mfu = f"{mfu}; {fpt}" if fpt else mfu
    rows = [
        ("tokens/s", f"{m['tokens_per_s']:,.0f}"),
        ("step", f"{m['step_s']:.4f} s projected for {rec['global_batch']} x {rec['seq_len']} tokens "
                 f"({r.grad_accum} micro-batches of {r.micro_batch}; measured "
                 f"{r.measured_accum} per step: {m['measured_step_s']:.4f} s)"),
        ("phases", f"micro-batch {m['micro_batch_s'] * 1e3:.2f} ms, last (syncs) {m['last_micro_batch_s'] * 1e3:.2f} ms, "
                   f"optimizer {m['optimizer_s'] * 1e3:.2f} ms"),
        ("spread", f"{m['step_spread'] * 100:.1f} % over {r.timed_steps} steps, {m['rank_spread'] * 100:.1f} % "
                   f"between ranks (slowest rank {m['slowest_rank']})"),
        ("memory", f"{m['peak_memory_gib']:.2f} GiB peak per rank"),
        ("MFU", mfu),
        ("run", f"{m['projected_days']:.2f} days for {rec['total_steps']:,} steps"),
        ("overhead", f"build{' and probe' if r.probe else ''} {m['build_s']:.1f} s"
                     + (f" (model and engine {m['model_s']:.1f} s)" if m.get("model_s") else "")
                     + f", warm-up {m['warmup_s']:.1f} s"
                     + (f", quality gate {m['gate_s']:.1f} s" if m.get("gate_s") else "")
                     + f", trial wall {r.wall_s:.1f} s"),
    ]
    if r.probe:  # micro_batch_size=max: what the probe tried, and the micro-batch below (or why not)
        tried = ", ".join(f"{mbs} {status}" for mbs, status in r.probe)
        if r.probe_compared and len(r.probe_compared) > 1:
            below = "; measured " + ", ".join(f"{mbs}: {t:,.0f} tokens/s" for mbs, t in r.probe_compared) + \
                    " (the faster is the record)"
        elif m.get("alloc_retries") == 0:
            below = "; the micro-batch below not measured: no allocator retry in the timed steps"
        else:
            below = ""
        from trainscout.spaces import micro_batch
        rows.insert(2, ("probe", f"{micro_batch().name}=max tried {tried}{below}"))
    for note in (r.plan.notes if r.plan else []):
        rows.append(("note", note))
    for k, v in rows:
        print(f"{k:9}{v}")


def cmd_estimate(a) -> int:
    """Predicted peak memory per rank, without a GPU; calibrated on a store's measurements of that GPU."""
    from trainscout.trial import memory, prepare
    capacity = None if a.gpu_memory is None else gpu_memory(a.gpu_memory)
    input_file("--model", a.model)
    hw = {"device": "cuda", "gpu_count": a.workers, "gpu": a.gpu}
    spec = prepare(a.model, parse_sets(a.set), workers=a.workers, hw=hw, **recipe_kwargs(a))
    cal = None
    if a.calibrate:
        from trainscout.analysis.table import store_of
        cal = memory.fit(memory.calibration_pairs(store_of(a.calibrate, create=False).measurements(), a.gpu))
    comp = memory.components(spec)
    total = memory.predict(spec, cal)
    host = memory.host_peak(spec)
    fits = None if capacity is None else total <= capacity
    if a.json:  # the same exit status as the text: 1 when it does not fit
        print(json.dumps({"config": spec.config, "components_gib": {k: v / memory.GiB for k, v in comp.items()},
                          "host_gib": {k: v / memory.GiB for k, v in host.items()},
                          "predicted_gib": total / memory.GiB, "calibration": cal,
                          "capacity_gib": capacity / memory.GiB if capacity else None, "fits": fits}))
        return 1 if fits is False else 0
    print(f"model {spec.model}  ranks {a.workers}  config " + " ".join(f"{k}={v}" for k, v in spec.config.items()))
    for k, v in comp.items():
        print(f"  {k:12} {v / memory.GiB:8.2f} GiB")
    how = (f"calibrated on {cal['n']} measured peaks: {cal['a']:.2f}·states + {cal['b']:.2f}·activations + "
           f"{cal['c'] / memory.GiB:.2f} GiB") if cal else "analytic sum + 1 GiB workspace"
    print(f"  {'predicted':12} {total / memory.GiB:8.2f} GiB per rank ({how})")
    print("  host memory, all ranks: " + ", ".join(f"{k} {v / memory.GiB:.1f}" for k, v in host.items()) + " GiB")
    if capacity:
        verdict = "fits" if fits else "does NOT fit"
        print(f"  {verdict} in {capacity / memory.GiB:.1f} GiB ({100 * total / capacity:.0f} %)")
    return 1 if fits is False else 0


def cmd_verify(a) -> int:
    """`trainscout verify`: train a stored configuration for N full steps; measured against projected step time."""
    from trainscout.analysis.verify import verify
    if a.quality is not None:
        return verify_quality(a)
    r = verify(a.source, key=a.trial, steps=a.steps, warmup=a.warmup, timeout=a.timeout, address=a.address,
               runner=a.runner, global_batch=a.global_batch)
    if a.json:
        print(json.dumps(r))
    elif r["status"] != Status.OK:
        print(f"verify {r['key'][:12]} ended {r['status']}: {r['error']}")
    else:
        by = {"trainscout": "trainscout's workers", "hf": "a stock HF Trainer + trainscout.runtime.hf.prepare",
              "accelerate": "accelerate launch + a stock HF Trainer + trainscout.runtime.hf.prepare"}[r["runner"]]
        print(f"verify {r['key'][:12]}  {r['model']}  {r['steps']} full optimizer steps in {by}  ({r['gpu'] or 'cpu'})")
        if r.get("global_batch", r.get("recipe_global_batch")) != r.get("recipe_global_batch"):
            print(f"  at --global-batch {r['global_batch']} (the recipe's is {r['recipe_global_batch']}: projected "
                  f"step {r['recipe_projected_step_s']:.2f} s); the projection below is the measurement's at this batch")
        if r.get("command"):
            print(f"  ran: {r['command']}")
        print(f"  projected step {r['projected_step_s']:.4f} s   measured median {r['measured_step_s']:.4f} s "
              f"(mean {r['mean_step_s']:.4f} s)   measured/projected {r['ratio']:.3f}")
        print(f"  tokens/s projected {r['projected_tokens_per_s']:,.0f}  measured {r['measured_tokens_per_s']:,.0f}")
        if r.get("seed_method_step_s"):
            print(f"  the seed paper's timer (one unsynchronised micro-batch x accumulation) on the same steps: "
                  f"{r['seed_method_step_s']:.4f} s = {r['seed_method_ratio']:.3f} x measured")
    return 0 if r["status"] == Status.OK else 1


def verify_quality(a) -> int:
    """`trainscout verify --quality STEPS`: the configuration and its reference trained on real text, compared."""
    from trainscout.analysis.quality import TOLERANCE, verify_quality as run
    if a.runner != "trainscout":
        raise ConfigError("--runner", "--quality trains in trainscout's workers: leave --runner out")
    r = run(a.source, key=a.trial, steps=a.quality, seeds=a.seeds, global_batch=a.global_batch, seq_len=a.seq_len,
            timeout=a.timeout, address=a.address)
    if a.json:
        print(json.dumps(r))
        return 0 if r.get("status") == "ok" or r["verdict"] == "same" else 1
    print(f"verify --quality {r['key'][:12]}  {r['model']}: {r['verdict']}")
    if r.get("status") != "ok":
        print(f"  {r['why']}")
        return 0 if r["verdict"] == "same" else 1
    changed = ", ".join(f"{k} ({why})" for k, why in r["changes"].items())
    ref = " ".join(f"{k}={v}" for k, v in r["reference"].items())
    loss = r["loss"]
    print(f"  changes the numerics: {changed}; reference: {ref}")
    print(f"  {r['steps']} steps x {r['global_batch']} x {r['seq_len']} tokens of the shipped corpus "
          f"({r['epochs']:.2f} epochs of {r['corpus_tokens']:,} tokens), {r['seeds']} seed(s), the same weights and "
          "batches")
    print(f"  loss over the last {r['window']} steps: {loss['candidate']:.4f} vs the reference's {loss['reference']:.4f}"
          f" ({loss['rel_diff']:+.2%}, 95 % interval {loss['ci95'][0]:+.2%} .. {loss['ci95'][1]:+.2%}; "
          f"verified within +{TOLERANCE:.0%})")
    sp = r["speed"]
    eff = r["token_efficiency"]
    print(f"  tokens/s {sp['candidate_tokens_per_s']:,.0f} vs {sp['reference_tokens_per_s']:,.0f} = {sp['ratio']:.3f}x "
          f"({sp['source']})")
    if eff is not None:
        print(f"  tokens to equal loss: {eff:.3f}x (reached at step {r['steps_to_equal_loss']}); speed at equal loss "
              f"{r['speed_at_equal_loss']:.3f}x")
    else:
        print("  the reference never reached the candidate's final loss: no speed at equal loss")
    return 0


def cmd_train(a) -> int:
    """`trainscout train`: train with an exported configuration (a progress bar on stderr unless -q or --json)."""
    from tqdm import tqdm

    from trainscout.trial.train import train
    out_folder("--out", a.out)
    for flag, path in (("--config", a.config), ("--data", a.data), ("--model", a.model)):
        input_file(flag, path)
    if a.data_dtype is not None and a.data is None:  # it was read as nothing at all (synthetic tokens)
        raise ConfigError("--data-dtype", f"--data-dtype {a.data_dtype} without --data: it says how a --data file is "
                                          "written; give --data FILE, or leave --data-dtype out for synthetic tokens")
    bars = []  # made at the first step: a refusal before training (the data file, the config) stays one line

    def on_step(m):
        if not bars:
            bars.append(tqdm(total=a.steps, unit="step", dynamic_ncols=True, disable=a.json or a.quiet, file=sys.stderr))
        bar = bars[0]
        bar.update(m["step"] - bar.n)
        loss = f"{m['loss']:.3f}" if m.get("loss") is not None else "-"
        bar.set_postfix_str(f"loss {loss}  {m['tokens_per_s']:,.0f} tok/s")
    r = train(a.config, model=a.model, steps=a.steps, data=a.data, data_dtype=a.data_dtype or "uint16", out=a.out,
              workers=a.workers, device=a.device, timeout=a.timeout, address=a.address, on_step=on_step,
              **recipe_kwargs(a))
    for bar in bars:
        bar.close()
    if a.json:
        print(json.dumps(r))
    elif r["status"] == Status.OK:
        m = r["metrics"]
        print(f"trained {r['model']} for {r['steps']} steps on {r['data'] or 'synthetic tokens'}: final loss "
              f"{m['loss']:.4f}, {m['tokens_per_s']:,.0f} tokens/s; checkpoint (transformers) in {r['checkpoint']}")
    else:
        print(f"training ended {r['status']}: {r['error']}")
    return 0 if r["status"] == Status.OK else 1


def duration(s: str) -> float:
    """A duration as people type it: 90s, 30m, 2h, 1h30m, 1h 30m 10s, 1.5h, or plain seconds."""
    text = (s or "").strip().lower()
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*([hms]?)", text)
    units = [u for _, u in parts]
    ok = parts and re.fullmatch(r"(\s*\d+(?:\.\d+)?\s*[hms]?)+", text) and \
        (len(parts) == 1 or ("" not in units and units == sorted(set(units), key="hms".index)))
    total = sum(float(v) * {"": 1, "s": 1, "m": 60, "h": 3600}[u] for v, u in parts) if ok else 0
    if not ok or not 0 < total < float("inf"):
        raise argparse.ArgumentTypeError(f"{s!r} is not a duration: write e.g. 90s, 30m, 2h or 1h30m")
    return total


SEARCH_RULES = """Search the knob space for the fastest configuration with real trials (Ray Tune + Optuna + ASHA):
a live table of the trials as they end, then a summary of the best ones (tokens/s, MFU, days of the recipe).

Output folders: a new search into a folder (or --storage) that already holds a search of that name (the folder's
name) is refused: continue it with --resume DIR, or give another --out. --resume DIR continues the search with the
settings it was started with; it may take a larger --trials (it says so), a --time-budget for this run, --storage
and --address; --model, --space, --set, --steps, --seed and the other settings may be repeated but not changed
(refused, naming the flag). A search does not measure a configuration twice while others are left. While a
search runs in a folder, a second one there is refused. Ctrl-C stops the running trials, keeps every result measured and exits
130; --resume continues."""

# The CPU demo: tiny model, 2 workers, 6 trials, the knobs fixed where they would need a compiler (demo_sets)
DEMO = {"model": "tiny", "trials": 6, "workers": 2, "steps": 3, "warmup": 1}


def demo_sets() -> dict:
    """The knobs the CPU demo fixes, as --set values (Knob.demo: no inductor, no DeepSpeed C++ ops)."""
    from trainscout.spaces import all_knobs, fmt
    return {k.name: fmt(k.demo) for k in all_knobs() if k.demo is not None}


SEARCH_DEFAULTS = {"device": "auto", "gpus_per_trial": 1, "out": "runs/search", "seed": 0, "steps": 5, "warmup": 2,
                   "max_failures": 0, "one_node": True}  # applied after parsing: a resume must know which flags were given


def cmd_search(a) -> int:
    """`trainscout search`: run or resume a search; the live table, then the summary (-q: the summary alone)."""
    from trainscout.search.service import SearchArgs, counted, resumed, run_search, summarize
    from trainscout.store import default_url, open_store
    out = sys.stderr if a.json else sys.stdout  # --json: the JSON alone on stdout, the rest on stderr
    input_file("--space", a.space)
    sets = parse_sets(a.set) if a.set else None
    recipe = {k: v for k, v in recipe_kwargs(a).items() if v is not None}
    if a.resume:
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
        saved = store.search_args(name)
        if saved is None:
            raise ConfigError("--resume", f"--resume {a.resume}: no search recorded there: start one with --out")
        given = {"model": a.model, "device": a.device, "gpus_per_trial": a.gpus_per_trial, "space": a.space,
                 "sets": sets, "seed": a.seed, "steps": a.steps, "warmup": a.warmup, "timeout": a.timeout,
                 "max_failures": a.max_failures, "recipe": recipe, "trials": a.trials, "time_budget_s": a.time_budget,
                 "storage": storage, "address": a.address, "quality": a.quality,
                 "max_concurrent": a.max_concurrent, "one_node": a.one_node}
        args, notes = resumed(saved, a.resume, given, done=counted(store.trials(name)))
        for note in notes if not a.quiet else ():
            print(f"resuming {name}: {note}", file=out)
    else:
        for k, v in SEARCH_DEFAULTS.items():
            if getattr(a, k) is None:
                setattr(a, k, v)
        if a.model is None:
            import torch
            if torch.cuda.is_available():
                raise ConfigError("--model", "give --model (e.g. pythia-160m); without a GPU the default is a CPU demo")
            if not a.quiet:
                print("no GPU here: running the CPU demo search (tiny model, 2 workers, 6 trials)", file=sys.stderr)
            a.model, a.trials, a.gpus_per_trial = DEMO["model"], a.trials or DEMO["trials"], DEMO["workers"]
            a.steps, a.warmup = DEMO["steps"], DEMO["warmup"]
            sets = dict(demo_sets(), **(sets or {}))
        input_file("--model", a.model)
        args = SearchArgs(model=a.model, out=a.out, device=a.device, gpus_per_trial=a.gpus_per_trial, trials=a.trials,
                          time_budget_s=a.time_budget, space=a.space, sets=sets or {}, storage=a.storage,
                          address=a.address, seed=a.seed, steps=a.steps, warmup=a.warmup, timeout=a.timeout,
                          max_failures=a.max_failures, recipe=recipe, quality=a.quality or "mark",
                          max_concurrent=a.max_concurrent, one_node=a.one_node)
    # -q: the live table, its progress lines and the start line go nowhere; the summary is printed after it ends
    stream = open(os.devnull, "w", encoding="utf-8") if a.quiet else out
    try:
        summary = run_search(args, stream=stream, resume=bool(a.resume))
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
    if summary.get("none_why"):  # exit 0 means it did what was asked: a run that ended no trial did not
        print(f"trainscout: error: this run of {summary['search']} ended no trial: {summary['none_why']}", file=sys.stderr)
        return EXIT_FAILED
    if summary.get("interrupted"):
        n = summary["trials"]
        print(f"trainscout: interrupted: {n} trial{'s' if n != 1 else ''} ended and {'are' if n != 1 else 'is'} kept "
              f"in the store; continue with: trainscout search --resume {args.out}", file=sys.stderr)
        return EXIT_INTERRUPTED
    if summary.get("unscheduled"):  # asked to measure them: it did not (the summary says why and what to do)
        n = summary["unscheduled"]
        print(f"trainscout: {n} trial{'s' if n != 1 else ''} unscheduled: the cluster gave {'them' if n != 1 else 'it'} "
              f"no room; continue with: trainscout search --resume {args.out}", file=sys.stderr)
        return 1
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
    from trainscout.analysis.table import METRICS, best_choice, dumps, load_resolved, store_of
    from trainscout.store import one_line, storage_url
    if a.export_file or a.import_file:
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
    if a.share:
        raise ConfigError("--share", "--share goes with --export FILE: write e.g. --export mine.jsonl --share")
    store = store_of(a.source)
    df = load_resolved(store)  # a store of measurements alone too (a grid, an import)
    for col in df.columns:  # whole numbers print as such (1, not 1.0), also beside rows without a value
        vals = df[col].dropna()
        if df[col].dtype.kind == "f" and (col in INTEGER_COLUMNS or col not in METRICS) and len(vals) \
                and (vals == vals.round()).all():
            df[col] = df[col].astype("Int64")
    for col, want in (("model", a.model), ("gpu", a.gpu), ("status", a.status)):
        if want:
            df = df[df[col].astype(str).str.contains(want, case=False, regex=False)]
    if a.sort:
        if a.sort not in df.columns:
            raise ConfigError("--sort", f"--sort {a.sort}: no such column: use one of {', '.join(df.columns)}")
        df = df.sort_values(a.sort, ascending=a.sort not in ("tokens_per_s", "mfu"), na_position="last")
    if a.format == "csv":
        print(df.to_csv(index=False), end="")
    elif a.format == "json":
        print(dumps(df))
    else:
        from trainscout.spaces import all_knobs
        knobs = [k.name for k in sorted((k for k in all_knobs() if k.column), key=lambda k: k.column)]
        shown = [c for c in ("search", "status", "tokens_per_s", "mfu", "quality", "peak_memory_gib", "projected_days",
                             *knobs, "key", "error") if c in df.columns]
        if df["samples"].fillna(0).gt(1).any():  # a key measured more than once: how often, and the spread
            shown[3:3] = ["samples", "tokens_per_s_spread"]
        if df["placement"].fillna("").str.contains("nodes").any():  # a trial split over nodes: say so
            shown[3:3] = ["placement"]
        width = 4000 if a.verbose else 80  # -v: the whole reason, on one line
        df = df.assign(error=[one_line(e, width) if isinstance(e, str) else "" for e in df["error"]])
        print(df[shown].to_string(index=False, float_format=lambda v: f"{v:,.3f}") if len(df) else "no trials")
        choice = best_choice(store)
        if choice is not None and len(choice.tied) > 1:  # the best and what it ties with (rule: README, ties)
            print(f"best: {choice.best.key}" + (f"; {choice.line()}" if choice.is_tie else
                  f" (the fastest and the simplest of {len(choice.tied)} within the measured noise "
                  f"({choice.noise:.1%}): {', '.join(r.key[:12] for r in choice.tied if r.key != choice.best.key)})"))
    return 0


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
    print(f"launch (from {a.out}): {how['command']}" + (f"   or ./launch.sh (trainscout train)" if "command" in formats
                                                         and how["launcher"] != "trainscout" else ""))
    if "hf" in formats and "hf" not in exported["not_exported"]:
        with open(os.path.join(a.out, "training_args.json"), encoding="utf-8") as f:
            version = json.load(f).get("transformers_version")
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
                print(f"  without {item} ({cost['without']}, measured in this store): {cost['tokens_per_s']:,.0f} "
                      f"tokens/s = {cost['ratio']:.3f} x")
    return 0


def lookup_models(values: list[str]) -> list[str]:
    """--model, repeatable and comma-separated; a pattern (pythia-*) names the built-in models it matches."""
    import fnmatch

    from trainscout.trial.models import model_names
    out = []
    for value in values:
        for item in (v.strip() for v in value.split(",")):
            if not item:
                continue
            if any(c in item for c in "*?[") and not os.path.exists(item):
                hits = [m for m in model_names() if m != "tiny" and fnmatch.fnmatch(m, item)]
                if not hits:
                    raise ConfigError("--model", f"--model {item} matches no built-in model: use e.g. 'pythia-*' "
                                                 f"({', '.join(model_names())})")
                out += hits
            else:
                out.append(item)
    return list(dict.fromkeys(out))


def cmd_lookup(a) -> int:
    """`trainscout lookup`: measured best configurations from the atlas, else a labelled prediction; exit 1 when a
    --db file had refused rows (each printed with its reason)."""
    from trainscout.atlas import db
    from trainscout.atlas.lookup import lookup, render, render_summary
    for path in a.db or []:
        input_file("--db", path)
    models = lookup_models(a.model)
    capacity = gpu_memory(a.gpu_memory) / 2**30 if a.gpu_memory else None
    atlas = db.load(a.db)
    refused = [(layer.name, *r) for layer in atlas.layers for r in layer.refused]
    for name, n, key, why in refused:
        print(f"trainscout: refused: {name} line {n} (key {key[:12]}): {why}", file=sys.stderr)
    answers = [lookup(atlas, m, gpu=a.gpu, gpus=a.gpus, global_batch=a.global_batch, budget=a.budget,
                      gpu_memory_gib=capacity, top=a.top) for m in models]
    if a.json:
        print(json.dumps(answers[0] if len(answers) == 1 else answers))
    elif len(answers) == 1 or a.verbose:
        print("\n\n".join(render(x, provenance=not a.quiet) for x in answers))
    else:
        print(render_summary(answers))
        for x in answers:
            if x.get("predicted"):
                print(f"measure {x['model']}: {x['predicted']['search_command']}")
        if not a.quiet:
            print("(one --model for its configurations, provenance and the predictions' leave-one-out error; -v: "
                  "all of them)")
    return 1 if refused else 0


def cmd_atlas(a) -> int:
    """`trainscout atlas`: the whole atlas (shipped + the stores and files given) as one self-contained HTML page;
    exit 1 when a file had refused rows (each printed with its reason)."""
    from trainscout.atlas import db, page
    for path in a.sources:
        input_file("DB", path)
    out_folder("--out", a.out)
    atlas = db.load(a.sources)
    refused = [(layer.name, *r) for layer in atlas.layers for r in layer.refused]
    for name, n, key, why in refused:
        print(f"trainscout: refused: {name} line {n} (key {key[:12]}): {why}", file=sys.stderr)
    path = page.write(atlas, a.out)
    print(f"atlas: {path} ({sum(len(x.rows) for x in atlas.layers)} rows, "
          f"{len(atlas.model.get('predictions', {}))} predicted models; {os.path.getsize(path):,} bytes)")
    return 1 if refused else 0


def cmd_report(a) -> int:
    """`trainscout report`: print the analysis' summary and write report.html."""
    from trainscout.analysis.report import analyse, summary, write_html
    out = a.out if a.out is not None else (a.source if "://" not in a.source else "report")
    out_folder("--out", out)
    input_file("--prices", a.prices)
    analysis = analyse(a.source, a.prices)
    print(summary(analysis))
    print(f"report: {write_html(analysis, out)}")
    return 0


def verbosity_flags(p: argparse.ArgumentParser, default) -> None:
    """-q/--quiet and -v/--verbose; on each command too (default SUPPRESS there: the top-level value stands)."""
    p.add_argument("-q", "--quiet", action="store_true", default=default,
                   help="print only results and errors: no live table, progress bar or hints")
    p.add_argument("-v", "--verbose", action="store_true", default=default,
                   help="print more: each failed trial's whole reason and its ranks' stderr tail, full errors in "
                        "tables, each knob's module")


def command(sub, name: str, summary: str, description: str, example: str, func, **kw) -> Parser:
    """A subcommand: its one-line summary (the top-level list), what it does, and its example(s) as the epilog."""
    p = sub.add_parser(name, help=summary, description=description, epilog="example:\n" + example,
                       formatter_class=HelpFormatter, **kw)
    verbosity_flags(p, argparse.SUPPRESS)
    p.set_defaults(func=func)
    return p


JSON_HELP = "print the machine output alone on stdout as JSON, progress and notes on stderr (default: text)"
MODEL_HELP = "pythia-14m ... pythia-12b, tiny, or a config.json path"
SET_HELP = "set a knob (repeatable; a knob not set keeps its default)"


def build_parser() -> Parser:
    """The `trainscout` argument parser: global flags and one subcommand per command, in the order of a session."""
    p = Parser(prog="trainscout", description=DESCRIPTION, epilog=EPILOG, formatter_class=HelpFormatter)
    p.add_argument("--version", action="store_true", help="print the installed version and exit")
    verbosity_flags(p, False)
    sub = p.add_subparsers(title="commands", dest="command", parser_class=Parser, metavar="COMMAND")

    k = command(sub, "knobs", "list every knob: choices, default, requirements",
                "Every knob a trial or a search may set: its choices, default, the knobs it requires, what it does. "
                "Set one with --set NAME=VALUE (trial, search, estimate) or fix and narrow them in a --space file.",
                "  trainscout knobs --json", cmd_knobs)
    k.add_argument("--json", action="store_true", help=JSON_HELP)

    m = command(sub, "estimate", "predict peak GPU memory per rank (no GPU needed)",
                "Predict the peak GPU memory per rank of a configuration (weights, gradients, optimizer, buffers, "
                "activations, logits) and the host memory of all ranks, without a GPU. With --gpu-memory: exit 1 "
                "when it does not fit.",
                "  trainscout estimate --model pythia-1b --set zero_stage=3 --workers 8 --gpu-memory 80GiB",
                cmd_estimate)
    m.add_argument("--model", required=True, help=MODEL_HELP)
    m.add_argument("--set", action="append", metavar="KNOB=VALUE", help=SET_HELP)
    m.add_argument("--workers", type=positive_int("--workers"), default=1, help="GPUs the configuration spans")
    m.add_argument("--gpu-memory", default=None,
                   help="capacity per GPU to check against: a size with a unit, e.g. 80GiB or 141GB "
                        "(default: no check)")
    m.add_argument("--calibrate", default=None, metavar="DIR",
                   help="fit the model on the measured peaks in this store, a search's --out or a URL "
                        "(default: the analytic sum + 1 GiB workspace)")
    m.add_argument("--gpu", default=None, help="with --calibrate: only measurements of this GPU name (default: all)")
    m.add_argument("--json", action="store_true", help=JSON_HELP)
    add_recipe_flags(m)

    lk = command(sub, "lookup", "the atlas's measured best, or a prediction (no GPU)",
                 "What the atlas knows about training a model on a GPU kind, without a GPU: the best measured "
                 "configurations (tokens/s, MFU, peak memory, days and rent of the recipe, provenance), from the "
                 "H200 measurements that ship with trainscout and any store or file given with --db; for a model "
                 "or GPU kind not measured, a prediction labelled as such, with its leave-one-out error over the "
                 "shipped rows and the search command that would measure it.",
                 "  trainscout lookup --model pythia-1b --gpu H200\n"
                 "  trainscout lookup --model 'pythia-*' --gpu H200 --gpus 1      # the seed paper's question\n"
                 "  trainscout lookup --model my/config.json --budget '$5000' --db runs/mine", cmd_lookup)
    lk.add_argument("--model", action="append", required=True,
                    help="a model name, a config.json path, or a pattern (pythia-*); repeatable, comma-separated")
    lk.add_argument("--gpu", default=None, help="a GPU kind, e.g. H200 (default: every kind measured for it)")
    lk.add_argument("--gpus", type=positive_int("--gpus"), default=None,
                    help="GPUs per run (default: every count measured; a prediction: 1)")
    lk.add_argument("--global-batch", type=positive_int("--global-batch"), default=None,
                    help="sequences per optimizer step (default: the model's recipe, 1,024 for Pythia)")
    lk.add_argument("--budget", default=None, help="days (30d) or dollars of rent ($5000): what fits in it")
    lk.add_argument("--gpu-memory", default=None,
                    help="memory per GPU for a prediction, e.g. 80GiB (default: the GPU kind's datasheet)")
    lk.add_argument("--db", action="append", metavar="STORE|FILE",
                    help="a results store (--out folder, .db, URL) or an export/share file on top of the shipped "
                         "measurements (repeatable; a file's rows are checked as an import checks them)")
    lk.add_argument("--top", type=positive_int("--top"), default=5,
                    help="measured configurations shown per GPU kind and count")
    lk.add_argument("--json", action="store_true", help=JSON_HELP)

    t = command(sub, "trial", "measure one configuration for real",
                "Measure one configuration: build the model in worker processes (GPUs, or CPU processes), run the "
                "warm-up steps, then time the optimizer steps with synchronisation. Prints tokens/s, the projected "
                "full step, phase times, spread, peak memory per rank, MFU and the recipe's projected days. A failure "
                "(oom, timeout, crash, invalid) is an outcome: printed, and exit 1.",
                "  trainscout trial --model pythia-160m --set zero_stage=2 --set micro_batch_size=8 --steps 10",
                cmd_trial)
    t.add_argument("--model", required=True, help=MODEL_HELP)
    t.add_argument("--set", action="append", metavar="KNOB=VALUE", help=SET_HELP)
    t.add_argument("--device", default="auto", help="auto (a GPU if there is one), cpu or cuda")
    t.add_argument("--workers", type=positive_int("--workers"), default=1, help="ranks: GPUs, or CPU processes")
    t.add_argument("--steps", type=positive_int("--steps"), default=5, help="timed optimizer steps")
    t.add_argument("--warmup", type=int, default=2, help="untimed optimizer steps first (compile happens here)")
    t.add_argument("--measure-accum", type=int, default=None,
                   help="micro-batches per timed step, 0 = the full step (default: min(accumulation, 4))")
    t.add_argument("--timeout", type=positive_seconds("--timeout"), default=None,
                   help="hard limit for the whole trial in seconds, > 0 (default: 300 on CPU, 900 on GPU)")
    t.add_argument("--address", default=None, help="Ray cluster address (default: start Ray on 127.0.0.1)")
    t.add_argument("--one-node", action=argparse.BooleanOptionalAction, default=True,
                   help="its ranks on one node; --no-one-node: wherever the cluster has room, maybe split over "
                        "nodes (the record's placement says) (default: one node)")
    t.add_argument("--json", action="store_true", help=JSON_HELP)
    t.add_argument("--inject-fault", default=None, help=argparse.SUPPRESS)
    add_recipe_flags(t)

    d = SEARCH_DEFAULTS
    s = command(sub, "search", "find the fastest configuration with real trials",
                SEARCH_RULES,
                "  trainscout search --model pythia-1b --gpus-per-trial 8 --time-budget 2h --out runs/1b\n"
                "  trainscout search --resume runs/1b --trials 60          # continue it, up to 60 trials", cmd_search)
    s.add_argument("--model", default=None,
                   help="as for trial (default: on a box without a GPU, the CPU demo: tiny model, 2 workers, 6 trials)")
    s.add_argument("--device", default=None, help=f"auto, cpu or cuda (default: {d['device']})")
    s.add_argument("--gpus-per-trial", type=positive_int("--gpus-per-trial"), default=None,
                   help=f"ranks per trial: GPUs (on the CPU: worker processes) (default: {d['gpus_per_trial']})")
    s.add_argument("--trials", type=positive_int("--trials"), default=None,
                   help="number of trials in all; with --resume a larger number runs more (default: until "
                        "--time-budget; give one of them)")
    s.add_argument("--time-budget", type=duration, default=None,
                   help="stop starting trials after this, e.g. 30m, 2h, 1h30m; with --resume: for this run "
                        "(default: until --trials)")
    s.add_argument("--space", default=None,
                   help="YAML space file: knob: value (fixed) or knob: [values] (default: every knob's choices)")
    s.add_argument("--set", action="append", metavar="KNOB=VALUE", help="fix a knob (repeatable)")
    s.add_argument("--out", default=None, help=f"output folder: results.db, logs (default: {d['out']})")
    s.add_argument("--storage", default=None, help="SQLAlchemy URL of the results store (default: OUT/results.db)")
    s.add_argument("--address", default=None,
                   help="Ray cluster address; auto: attach to a running cluster (default: start Ray on 127.0.0.1)")
    s.add_argument("--max-concurrent", type=positive_int("--max-concurrent"), default=None,
                   help="trials at once (default: what this machine holds; attached to a cluster others may use: "
                        "what it has free when the search starts)")
    s.add_argument("--one-node", action=argparse.BooleanOptionalAction, default=None,
                   help="each trial's ranks on one node (Ray STRICT_PACK); --no-one-node: wherever the cluster has "
                        "room, maybe split over nodes, marked so in results (default: one node)")
    s.add_argument("--resume", default=None, metavar="DIR", help="continue the search whose --out was DIR")
    s.add_argument("--seed", type=seed_int, default=None, help=f"sampler seed, 0 .. 2**32-1 (default: {d['seed']})")
    s.add_argument("--steps", type=positive_int("--steps"), default=None,
                   help=f"timed optimizer steps per trial (default: {d['steps']})")
    s.add_argument("--warmup", type=int, default=None, help=f"untimed steps per trial (default: {d['warmup']})")
    s.add_argument("--timeout", type=positive_seconds("--timeout"), default=None,
                   help="hard limit per trial in seconds, > 0 (default: 300 on CPU, 900 on GPU)")
    s.add_argument("--max-failures", type=int, default=None,
                   help="measure a crashed trial again up to this many times; oom, invalid, timeout: never "
                        f"(default: {d['max_failures']})")
    s.add_argument("--quality", choices=("mark", "strict"), default=None,
                   help="mark: every best says whether it trains the same model as its reference (knobs that change "
                        "the numerics: fp8, precision, ...: the quality gate); strict: only configurations shown to "
                        "do so are called best (default: mark)")
    s.add_argument("--json", action="store_true", help="print the summary as JSON at the end, alone on stdout; the "
                                                       "live table and progress go to stderr (default: text)")
    add_recipe_flags(s)

    r = command(sub, "results", "the trials of a store as a table, CSV or JSON",
                "The trials of a store (a search's --out folder or a storage URL), each failed or refused one with "
                "its reason. --export and --import move measurement records (JSON lines, one measurement a line) "
                "between stores, to pool measurements; to write a configuration for a trainer, use the export "
                "command.",
                "  trainscout results runs/1b --status ok --sort tokens_per_s\n"
                "  trainscout results runs/1b --export 1b.jsonl && trainscout results runs/all --import 1b.jsonl",
                cmd_results)
    r.add_argument("source", help="a search's --out folder or a storage URL")
    r.add_argument("--model", help="only rows whose model contains this (default: all)")
    r.add_argument("--gpu", help="only rows whose GPU name contains this (default: all)")
    r.add_argument("--status", help="only rows with this status: ok, oom, stopped, ... (default: all)")
    r.add_argument("--sort", help="sort by a column, tokens_per_s and mfu highest first (default: the order run)")
    r.add_argument("--format", choices=("table", "csv", "json"), default="table",
                   help="table (for people), csv, or json (one list of rows, alone on stdout)")
    r.add_argument("--export", dest="export_file", metavar="FILE.jsonl",
                   help="write every measurement record of the store to FILE as JSON lines (not a trainer's "
                        "configuration: that is the export command)")
    r.add_argument("--import", dest="import_file", metavar="FILE.jsonl",
                   help="add the measurement records of such a JSON-lines file (an export, or a --share file): each "
                        "record is checked (plausible numbers, provenance, versions that run its knobs, a duplicate "
                        "that agrees); each refused one is printed with its reason, the rest imported, exit 1 if "
                        "any was refused; a malformed line refuses the whole file (exit 2)")
    r.add_argument("--share", action="store_true",
                   help="with --export: a contribution file (ok and out-of-memory measurements only, with provenance "
                        "and a content hash per row, no paths, host names or logs)")

    rp = command(sub, "report", "best configurations, days and dollars, failures; HTML",
                 "Best configurations (tokens/s, MFU, days, rent and purchase cost from list-price estimates), "
                 "failures, knob importance (Optuna PED-ANOVA); prints a summary and writes a self-contained "
                 "report.html.",
                 "  trainscout report runs/1b --prices my-prices.json", cmd_report)
    rp.add_argument("source", help="a search's --out folder or a storage URL")
    rp.add_argument("--out", default=None,
                    help="folder for report.html (default: the source folder; ./report for a URL)")
    rp.add_argument("--prices", default=None, metavar="FILE.json",
                    help="GPU prices over the built-in list-price estimates, format: analysis/prices.json "
                         "(default: the built-in ones)")

    at = command(sub, "atlas", "the atlas as one HTML page: what a GPU trains",
                 "Write the whole atlas (the H200 measurements that ship with trainscout, its predictions, and any "
                 "store or file given) as one self-contained HTML page (no network): the best configuration per "
                 "model, GPU kind and count, tokens/s against model size, and every row with its provenance, "
                 "filterable by model size, architecture, GPU kind and count, knob, measured or predicted.",
                 "  trainscout atlas --out atlas\n  trainscout atlas runs/mine contrib.jsonl --out atlas", cmd_atlas)
    at.add_argument("sources", nargs="*", metavar="DB",
                    help="results stores (--out folder, .db, URL) or export/share files on top of the shipped rows")
    at.add_argument("--out", default="atlas", help="folder for atlas.html")

    e = command(sub, "export", "write a configuration for HF Trainer, DeepSpeed, accelerate",
                "Write a measured configuration for your own trainer: HF TrainingArguments JSON, the engine's "
                "DeepSpeed JSON, an accelerate YAML, a launch command, and trainscout.json (provenance: model, "
                "recipe, hardware, versions; what was not exported and what only trainscout.runtime.hf applies).",
                "  trainscout export runs/1b --best --format all --out runs/1b/best", cmd_export)
    e.add_argument("source", help="a search's --out folder or a storage URL")
    e.add_argument("--best", action="store_true", help="the fastest successful measurement")
    e.add_argument("--trial", help="a measurement key (or a unique prefix of one); give it or --best")
    e.add_argument("--format", choices=("hf", "deepspeed", "accelerate", "command", "all"), default="all",
                   help="hf: training_args.json, deepspeed: deepspeed.json, accelerate: accelerate.yaml, command: "
                        "launch.sh, all: every one the measured engine can carry")
    e.add_argument("--out", required=True, help="folder to write into")

    v = command(sub, "verify", "N full steps of a stored configuration vs its projection",
                "Train the best (or a given) stored configuration for N full optimizer steps, every micro-batch of "
                "the global batch in every step, and compare the measured step time with the one the search "
                "projected. Exit 1 when the run fails.",
                "  trainscout verify runs/1b --steps 200 --runner hf", cmd_verify)
    v.add_argument("source", help="a search's --out folder or a storage URL")
    v.add_argument("--trial", default=None, help="a measurement key or prefix (default: the best)")
    v.add_argument("--runner", default="trainscout", choices=("trainscout", "hf", "accelerate"),
                   help="who trains: trainscout's workers, the export in a stock HF Trainer with the runtime hook "
                        "(hf; several ranks: through accelerate launch), or always via accelerate launch")
    v.add_argument("--steps", type=positive_int("--steps"), default=200, help="timed full optimizer steps")
    v.add_argument("--global-batch", type=positive_int("--global-batch"), default=None,
                   help="with --runner trainscout: full steps of this many sequences, where the recipe's step is too "
                        "long to verify (default: the recipe's)")
    v.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    v.add_argument("--quality", type=positive_int("--quality"), default=None, metavar="STEPS",
                   help="instead of timing: train the configuration and its reference (the knobs that change the "
                        "numerics at their reference values) STEPS steps on the shipped real-text corpus from the same "
                        "seed; compares the loss (with a 95 %% interval) and the speed at equal loss")
    v.add_argument("--seeds", type=positive_int("--seeds"), default=1,
                   help="with --quality: pairs of runs from this many seeds (the interval is over seeds from 2)")
    v.add_argument("--seq-len", type=positive_int("--seq-len"), default=None,
                   help="with --quality: sequence length of the runs (default: the recipe's)")
    v.add_argument("--timeout", type=positive_seconds("--timeout"), default=None,
                   help="hard limit in seconds, > 0 (default: 30 x the projected time of the steps, at least 900)")
    v.add_argument("--address", default=None, help="Ray cluster address (default: start Ray on 127.0.0.1)")
    v.add_argument("--json", action="store_true", help=JSON_HELP)

    tr = command(sub, "train", "train with an exported configuration",
                 "Train with a configuration `trainscout export` wrote, on synthetic tokens or a flat file of token "
                 "ids; a transformers checkpoint at the end. Exit 1 when the run fails.",
                 "  trainscout train --config runs/1b/best --steps 1000 --data tokens.bin --out runs/1b/ckpt",
                 cmd_train)
    tr.add_argument("--config", required=True, help="a folder written by `trainscout export` (or its trainscout.json)")
    tr.add_argument("--model", default=None, help="model to train (default: the exported one)")
    tr.add_argument("--steps", type=positive_int("--steps"), default=100, help="optimizer steps")
    tr.add_argument("--data", default=None, help="flat binary file of token ids (default: synthetic tokens)")
    tr.add_argument("--data-dtype", default=None,
                    help="token id type of --data: uint16, uint32, int32, int64 (default: uint16)")
    tr.add_argument("--out", default="runs/train", help="checkpoint folder (config.json + model.safetensors)")
    tr.add_argument("--workers", type=positive_int("--workers"), default=None, help="ranks (default: as exported)")
    tr.add_argument("--device", default="auto", help="auto, cpu or cuda")
    tr.add_argument("--timeout", type=positive_seconds("--timeout"), default=None,
                    help="hard limit in seconds, > 0 (default: none)")
    tr.add_argument("--address", default=None, help="Ray cluster address (default: start Ray on 127.0.0.1)")
    tr.add_argument("--json", action="store_true", help=JSON_HELP)
    add_recipe_flags(tr)
    return p


def version() -> str:
    """The installed distribution's version (trainscout.__version__)."""
    from trainscout import __version__
    return __version__ if __version__ != "unknown" else "unknown (not installed: pip install -e .)"


def main(argv: list[str] | None = None) -> int:
    """The `trainscout` console script: parse, run the command, turn bad input into one line and exit code 2."""
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    try:
        a = build_parser().parse_args(argv)
        if a.version:
            print(f"trainscout {version()}")
            return 0
        if a.quiet and a.verbose:
            raise ConfigError("--quiet", "-q/--quiet and -v/--verbose contradict each other: give one of them")
        if not getattr(a, "func", None):
            build_parser().print_help()
            return EXIT_BAD_INPUT
        with warnings.catch_warnings():
            if a.quiet:  # libraries' deprecation notices (Optuna's, in a search) are not results
                warnings.simplefilter("ignore", FutureWarning)
                warnings.simplefilter("ignore", DeprecationWarning)
            return a.func(a)
    except ConfigError as e:
        print(f"trainscout: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("trainscout: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # the reader stopped reading (| head): no traceback, and none at exit's flush either
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except Exception as e:  # noqa: BLE001
        from trainscout.store.guard import StoreError  # here: the store's imports cost every command 0.17 s
        if not isinstance(e, StoreError):
            raise
        print(f"trainscout: error: {e}", file=sys.stderr)  # the store failed while in use: what was kept
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())


def console() -> None:
    """The console script (and `python -m trainscout.cli`): main(), then an exit without the interpreter's teardown
    of torch's, Ray's and transformers' modules, which took 1.7-2.4 s of every command on 2 cores (2026-12-03):
    what a normal exit does first is done here (other threads joined, the exit handlers run: Ray's shutdown,
    logging's flush; every open file flushed), then os._exit with main's code. An exception leaves as usual."""
    code = main()
    import atexit
    import gc
    import io
    import threading
    for t in threading.enumerate():
        if t is not threading.main_thread() and not t.daemon:
            t.join()
    atexit._run_exitfuncs()
    kinds = (io.TextIOWrapper, io.BufferedWriter, io.BufferedRandom)  # type(), not isinstance: no __class__ read
    for f in gc.get_objects():  # files still open: os._exit would drop what their buffers hold
        if type(f) in kinds:
            try:
                if not f.closed and f.writable():
                    f.flush()
            except Exception:  # noqa: BLE001 - a broken pipe, a closed descriptor: as a normal exit would
                pass
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except Exception:  # noqa: BLE001
        pass
    os._exit(0 if code is None else code)
