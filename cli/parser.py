"""The `trainscout` argument parser: every command with its flags, defaults, help and example."""
from __future__ import annotations

import argparse

from .flags import (JSON_HELP, MODEL_HELP, SET_HELP, HelpFormatter, Parser, add_recipe_flags, command, duration,
                    positive_int, positive_seconds, seed_int, status_name, verbosity_flags)
from .lookups import cmd_atlas, cmd_lookup, cmd_report
from .measure import cmd_estimate, cmd_knobs, cmd_train, cmd_trial, cmd_verify
from .searches import SEARCH_DEFAULTS, SEARCH_RULES, TRACKERS, cmd_export, cmd_results, cmd_search


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


def build_parser() -> Parser:
    """The `trainscout` argument parser: global flags and one subcommand per command, in the order of a session."""
    p = Parser(prog="trainscout", description=DESCRIPTION, epilog=EPILOG, formatter_class=HelpFormatter)
    p.add_argument("--version", action="store_true", help="print the installed version and exit")
    verbosity_flags(p, False)
    sub = p.add_subparsers(title="commands", dest="command", parser_class=Parser, metavar="COMMAND")
    for add in (_knobs_command, _estimate_command, _lookup_command, _trial_command, _search_command, _results_command,
                _report_command, _atlas_command, _export_command, _verify_command, _train_command):
        add(sub)
    return p


def _knobs_command(sub) -> None:
    """`trainscout knobs`: every knob with its choices."""
    k = command(sub, "knobs", "list every knob: choices, default, requirements",
                "Every knob a trial or a search may set: its choices, default, the knobs it requires, what it does. "
                "Set one with --set NAME=VALUE (trial, search, estimate) or fix and narrow them in a --space file.",
                "  trainscout knobs --json", cmd_knobs)
    k.add_argument("--json", action="store_true", help=JSON_HELP)


def _estimate_command(sub) -> None:
    """`trainscout estimate`: a configuration's predicted memory, without a GPU."""
    m = command(sub, "estimate", "predict peak GPU memory per rank (no GPU needed)",
                "Predict the peak GPU memory per rank of a configuration (weights, gradients, optimizer, buffers, "
                "activations, logits) and the host memory of all ranks, without a GPU. With --gpu-memory (and "
                "--host-memory): exit 1 when it does not fit.",
                "  trainscout estimate --model pythia-1b --set zero_stage=3 --workers 8 --gpu-memory 80GiB",
                cmd_estimate)
    m.add_argument("--model", required=True, help=MODEL_HELP)
    m.add_argument("--set", action="append", metavar="KNOB=VALUE", help=SET_HELP)
    m.add_argument("--workers", type=positive_int("--workers"), default=1, help="GPUs the configuration spans")
    m.add_argument("--gpu-memory", default=None,
                   help="capacity per GPU to check against: a size with a unit, e.g. 80GiB or 141GB "
                        "(default: no check)")
    m.add_argument("--host-memory", default=None,
                   help="host (CPU) memory of the box to check against, e.g. 128GiB: a search there prunes a trial "
                        "predicted over it less 10 %% (offloaded states, the model build) (default: no check)")
    m.add_argument("--calibrate", default=None, metavar="DIR",
                   help="fit the model on the measured peaks in this store, a search's --out or a URL "
                        "(default: the analytic sum + 1 GiB workspace)")
    m.add_argument("--gpu", default=None, help="with --calibrate: only measurements of this GPU name (default: all)")
    m.add_argument("--json", action="store_true", help=JSON_HELP)
    add_recipe_flags(m)


def _lookup_command(sub) -> None:
    """`trainscout lookup`: the atlas's answer for a model on a GPU kind."""
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
    lk.add_argument("--gpu", default=None, help="a GPU kind, e.g. H200 (default: every kind measured for it; a "
                                                "prediction: this machine's GPU, else the kind the atlas measured "
                                                "most)")
    lk.add_argument("--gpus", type=positive_int("--gpus"), default=None,
                    help="GPUs per run (default: every count measured; a prediction: 1)")
    lk.add_argument("--global-batch", type=positive_int("--global-batch"), default=None,
                    help="sequences per optimizer step (default: the model's recipe, 1,024 for Pythia)")
    lk.add_argument("--budget", default=None, help="days (30d) or dollars of rent ($5000): what fits in it")
    lk.add_argument("--gpu-memory", default=None,
                    help="memory per GPU for a prediction, e.g. 80GiB (default: the GPU kind's datasheet)")
    lk.add_argument("--host-memory", default=None,
                    help="host (CPU) memory of the GPU box for a prediction, e.g. 128GiB: a prediction is what a "
                         "search there would run, its host memory within this less 10 %% (default: 128 GiB per GPU)")
    lk.add_argument("--db", action="append", metavar="STORE|FILE",
                    help="a results store (--out folder, .db, URL) or an export/share file on top of the shipped "
                         "measurements (repeatable; a file's rows are checked as an import checks them)")
    lk.add_argument("--top", type=positive_int("--top"), default=5,
                    help="measured configurations shown per GPU kind and count")
    lk.add_argument("--json", action="store_true", help=JSON_HELP)


def _trial_command(sub) -> None:
    """`trainscout trial`: one configuration measured."""
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


def _search_command(sub) -> None:
    """`trainscout search`: what to search and where its results go, then the trials' flags and the dry run's."""
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
                   help="the command's time, e.g. 30m, 2h, 1h30m, counted from its start: the search ends, summary "
                        "printed, by then (the running trials stopped); with --resume: for this run "
                        "(default: until --trials)")
    s.add_argument("--track", action="append", choices=TRACKERS, default=None, metavar="{" + ",".join(TRACKERS) + "}",
                   help="log each trial as a run (its knobs as params, per-step and final metrics, the search's name "
                        "as the experiment) through Ray Tune's own callbacks (repeatable): mlflow "
                        "(MLFLOW_TRACKING_URI, default sqlite:///OUT/mlflow.db; pip install 'trainscout[mlflow]'), "
                        "wandb (project: the search's name; WANDB_MODE=offline works; pip install "
                        "'trainscout[wandb]'), tensorboard (event files per trial under OUT/tune)")
    s.add_argument("--space", default=None,
                   help="YAML space file: knob: value (fixed) or knob: [values] (default: every knob's choices)")
    s.add_argument("--set", action="append", metavar="KNOB=VALUE", help="fix a knob (repeatable)")
    s.add_argument("--out", default=None, help=f"output folder: results.db, logs (default: {d['out']})")
    s.add_argument("--storage", default=None, help="SQLAlchemy URL of the results store (default: OUT/results.db)")
    s.add_argument("--address", default=None,
                   help="Ray cluster address; auto: attach to a running cluster (default: start Ray on 127.0.0.1)")
    s.add_argument("--max-concurrent", type=positive_int("--max-concurrent"), default=None,
                   help="trials at once (default: what this machine holds; attached to a cluster others may use: "
                        "what it has free when the search starts, within a fair share among the searches attached)")
    s.add_argument("--one-node", action=argparse.BooleanOptionalAction, default=None,
                   help="each trial's ranks on one node (Ray STRICT_PACK); --no-one-node: wherever the cluster has "
                        "room, maybe split over nodes, marked so in results (default: one node)")
    s.add_argument("--resume", default=None, metavar="DIR", help="continue the search whose --out was DIR")
    _search_trial_flags(s)
    _search_dry_run_flags(s)
    add_recipe_flags(s)


def _search_trial_flags(s) -> None:
    """search's flags for each trial it runs and for its summary."""
    d = SEARCH_DEFAULTS
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


def _search_dry_run_flags(s) -> None:
    """search --dry-run and the box it describes."""
    dry = s.add_argument_group("dry run (no GPU, nothing written)")
    dry.add_argument("--dry-run", action="store_true",
                     help="print the configurations the search would hand to its trials, in order (start points, "
                          "the atlas's and the store's picks, then the sampler's draws), each with its verdict (ok, "
                          "invalid, pruned) and why; --trials of them; --json: a JSON list")
    dry.add_argument("--gpu", default=None, help="with --dry-run: the GPU kind of the box, e.g. H100 (required)")
    dry.add_argument("--gpus", type=positive_int("--gpus"), default=None,
                     help="with --dry-run: GPUs per trial (default: --gpus-per-trial, else 1)")
    dry.add_argument("--host-memory", default=None,
                     help="with --dry-run: the box's host memory, e.g. 256GiB (default: 128 GiB per GPU)")
    dry.add_argument("--gpu-memory", default=None,
                     help="with --dry-run: memory per GPU, e.g. 80GiB (default: the GPU kind's datasheet)")


def _results_command(sub) -> None:
    """`trainscout results`: a store's trials; --export and --import of its measurements."""
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
    r.add_argument("--status", type=status_name,
                   help="only rows with this status: ok, oom, stopped, ... (default: all)")
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


def _report_command(sub) -> None:
    """`trainscout report`: the best configurations, costs and failures, as text and HTML."""
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


def _atlas_command(sub) -> None:
    """`trainscout atlas`: the atlas as one HTML page."""
    at = command(sub, "atlas", "the atlas as one HTML page: what a GPU trains",
                 "Write the whole atlas (the H200 measurements that ship with trainscout, its predictions, and any "
                 "store or file given) as one self-contained HTML page (no network): the best configuration per "
                 "model, GPU kind and count, tokens/s against model size, and every row with its provenance, "
                 "filterable by model size, architecture, GPU kind and count, knob, measured or predicted.",
                 "  trainscout atlas --out atlas\n  trainscout atlas runs/mine contrib.jsonl --out atlas", cmd_atlas)
    at.add_argument("sources", nargs="*", metavar="DB",
                    help="results stores (--out folder, .db, URL) or export/share files on top of the shipped rows")
    at.add_argument("--out", default="atlas", help="folder for atlas.html")


def _export_command(sub) -> None:
    """`trainscout export`: a measured configuration's files for another trainer."""
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


def _verify_command(sub) -> None:
    """`trainscout verify`: a stored configuration trained in full steps."""
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


def _train_command(sub) -> None:
    """`trainscout train`: training with an exported configuration."""
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
    tr.add_argument("--save-dtype", default=None, choices=("float32", "bfloat16", "float16"),
                    help="cast the checkpoint's weights on save (default: the master weights' dtype, which trained)")
    tr.add_argument("--workers", type=positive_int("--workers"), default=None, help="ranks (default: as exported)")
    tr.add_argument("--device", default="auto", help="auto, cpu or cuda")
    tr.add_argument("--timeout", type=positive_seconds("--timeout"), default=None,
                    help="hard limit in seconds, > 0 (default: none)")
    tr.add_argument("--address", default=None, help="Ray cluster address (default: start Ray on 127.0.0.1)")
    tr.add_argument("--json", action="store_true", help=JSON_HELP)
    add_recipe_flags(tr)
