"""The command line's shared parts: exit codes, the argument parser and its help, and the flag types that turn bad
input into one line naming the flag and the fix (a ConfigError: exit code 2)."""
from __future__ import annotations

import argparse
import math
import os
import re
import stat
import textwrap

from trainscout.spaces import ConfigError


EXIT_FAILED = 1  # the outcome is a failure: a trial, verify or train that did not end ok; the store failed


EXIT_BAD_INPUT = 2


EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports Ctrl-C


EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE: the reader of stdout went away (`trainscout knobs --json | head`)


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
    """argparse with one-line errors (no usage block) and exit code 2, and no prefix matching of long flags (a
    prefix would be read as whichever flag it starts, e.g. --gpu as --gpus-per-trial)."""

    def __init__(self, *args, **kw):
        kw.setdefault("allow_abbrev", False)
        super().__init__(*args, **kw)

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


def status_name(s: str) -> str:
    """An argparse type: one of a trial's statuses (trial.status.Status), any case; another word is refused with the
    list (a filter by a word no trial has showed "no trials" as if the store held none)."""
    from trainscout.trial.status import Status
    names = [x.value for x in Status]
    if s.strip().lower() not in names:
        raise argparse.ArgumentTypeError(f"{s!r} is not a trial status: give one of {', '.join(names)}")
    return s.strip().lower()


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
    """--gpu-memory: a positive finite size with a unit (`80GiB`, `141GB`, `512MiB`) in bytes; a bare number, zero,
    a negative size or inf is refused (a bare number was read as bytes: every configuration 'did NOT fit')."""
    from trainscout.predictor import memory
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
    g.add_argument("--train-tokens", type=positive_int("--train-tokens"),
                   help="tokens of the full run (sets the steps)")
    g.add_argument("--grad-clip", type=nonneg_float("--grad-clip"), help="gradient clipping norm (0 = off)")


def recipe_kwargs(a) -> dict:
    """The recipe flags as keyword arguments of trial.prepare (None: the model's own)."""
    return dict(global_batch=a.global_batch, seq_len=a.seq_len, total_steps=a.train_steps,
                total_tokens=a.train_tokens, grad_clip=a.grad_clip)


def duration(s: str) -> float:
    """A duration as people type it: `90s`, `30m`, `2h`, `1h30m`, `1h30m10s` (spaces between the parts too), `1.5h`,
    or plain seconds."""
    text = (s or "").strip().lower()
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*([hms]?)", text)
    units = [u for _, u in parts]
    ok = parts and re.fullmatch(r"(\s*\d+(?:\.\d+)?\s*[hms]?)+", text) and \
        (len(parts) == 1 or ("" not in units and units == sorted(set(units), key="hms".index)))
    total = sum(float(v) * {"": 1, "s": 1, "m": 60, "h": 3600}[u] for v, u in parts) if ok else 0
    if not ok or not 0 < total < float("inf"):
        raise argparse.ArgumentTypeError(f"{s!r} is not a duration: write e.g. 90s, 30m, 2h or 1h30m")
    return total


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
