"""The `trainscout` command line. Bad input ends with one line naming the field and the fix, and exit code 2."""
from __future__ import annotations

import argparse
import json
import os
import re
import sys

from trainscout.spaces import ConfigError

EXIT_BAD_INPUT = 2


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors (no usage block) and exit code 2."""

    def error(self, message):
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
    g = p.add_argument_group("recipe (defaults: the model's, e.g. Pythia: 1024 x 2048 tokens, 143,000 steps)")
    g.add_argument("--global-batch", type=positive_int("--global-batch"), help="sequences per optimizer step")
    g.add_argument("--seq-len", type=positive_int("--seq-len"), help="tokens per sequence")
    g.add_argument("--train-steps", type=positive_int("--train-steps"), help="optimizer steps of the full run")
    g.add_argument("--train-tokens", type=positive_int("--train-tokens"), help="tokens of the full run (sets the steps)")
    g.add_argument("--grad-clip", type=nonneg_float("--grad-clip"), help="gradient clipping norm (0 = off)")


def recipe_kwargs(a) -> dict:
    return dict(global_batch=a.global_batch, seq_len=a.seq_len, total_steps=a.train_steps,
                total_tokens=a.train_tokens, grad_clip=a.grad_clip)


# --- commands -------------------------------------------------------------------------------------------------
def cmd_knobs(a) -> int:
    from trainscout import spaces
    rows = []
    for k in spaces.all_knobs():
        req = ", ".join(f"{o}={'|'.join(spaces.fmt(v) for v in vals)}" for o, vals in k.requires.items()) or "-"
        rows.append({"name": k.name, "domain": k.domain_text(), "default": spaces.fmt(k.default),
                     "requires": req, "description": k.description, "module": type(k).__module__})
    if a.json:
        print(json.dumps(rows, indent=2))
        return 0
    widths = {c: max(len(c), *(len(r[c]) for r in rows)) for c in ("name", "domain", "default", "requires")}
    print("  ".join(c.upper().ljust(widths[c]) for c in widths) + "  DESCRIPTION")
    for r in rows:
        print("  ".join(r[c].ljust(widths[c]) for c in widths) + "  " + r["description"])
    print("\nSet a knob with --set NAME=VALUE. A knob with requirements may only leave its default when they hold.")
    return 0


def cmd_trial(a) -> int:
    from trainscout.trial import execute, prepare
    spec = prepare(a.model, parse_sets(a.set), device=a.device, workers=a.workers, steps=a.steps, warmup=a.warmup,
                   measure_accum=a.measure_accum, fault=a.inject_fault, **recipe_kwargs(a))
    record = execute(spec, timeout=a.timeout, address=a.address)
    if a.json:
        print(json.dumps(record))
    else:
        print_trial(record)
    return 0 if record["status"] == "ok" else 1


def print_trial(r: dict) -> None:
    cfg = " ".join(f"{k}={v}" for k, v in r["config"].items())
    print(f"trial {r['trial_id']}  model {r['model']}  device {r['device']} x{r['world_size']}  status {r['status']}")
    print(f"config   {cfg}")
    m = r.get("metrics")
    if not m:
        print(f"error    {r['error']}")
        return
    rec = r["recipe"]
    mfu = f"{m['mfu']:.3f}" if m["mfu"] is not None else "n/a (no GPU peak known)"
    rows = [
        ("tokens/s", f"{m['tokens_per_s']:,.0f}"),
        ("step", f"{m['step_s']:.4f} s projected for {rec['global_batch']} x {rec['seq_len']} tokens "
                 f"({r['grad_accum']} micro-batches of {r['config']['micro_batch_size']}; measured "
                 f"{r['measured_accum']} per step: {m['measured_step_s']:.4f} s)"),
        ("phases", f"micro-batch {m['micro_batch_s'] * 1e3:.2f} ms, last (syncs) {m['last_micro_batch_s'] * 1e3:.2f} ms, "
                   f"optimizer {m['optimizer_s'] * 1e3:.2f} ms"),
        ("spread", f"{m['step_spread'] * 100:.1f} % over {r['timed_steps']} steps, {m['rank_spread'] * 100:.1f} % "
                   f"between ranks (slowest rank {m['slowest_rank']})"),
        ("memory", f"{m['peak_memory_gib']:.2f} GiB peak per rank"),
        ("MFU", mfu),
        ("run", f"{m['projected_days']:.2f} days for {rec['total_steps']:,} steps"),
        ("overhead", f"build {m['build_s']:.1f} s, warm-up {m['warmup_s']:.1f} s, trial wall {r['wall_s']:.1f} s"),
    ]
    for k, v in rows:
        print(f"{k:9}{v}")


def build_parser() -> Parser:
    p = Parser(prog="trainscout", description=__doc__.splitlines()[0].replace("The `trainscout` command line. ", ""))
    sub = p.add_subparsers(dest="command", parser_class=Parser, metavar="COMMAND")

    k = sub.add_parser("knobs", help="list every knob: domain, default, constraints, description")
    k.add_argument("--json", action="store_true", help="print JSON")
    k.set_defaults(func=cmd_knobs)

    t = sub.add_parser("trial", help="measure one configuration for real")
    t.add_argument("--model", required=True, help="pythia-14m ... pythia-12b, tiny, or a config.json path")
    t.add_argument("--set", action="append", metavar="KNOB=VALUE", help="set a knob (repeatable)")
    t.add_argument("--device", default="auto", help="auto (a GPU if there is one), cpu or cuda")
    t.add_argument("--workers", type=positive_int("--workers"), default=1, help="ranks: GPUs, or CPU processes")
    t.add_argument("--steps", type=positive_int("--steps"), default=5, help="timed optimizer steps")
    t.add_argument("--warmup", type=int, default=2, help="untimed optimizer steps first (compile happens here)")
    t.add_argument("--measure-accum", type=int, default=None,
                   help="micro-batches per timed step (default min(accumulation, 4); 0 = the full step)")
    t.add_argument("--timeout", type=nonneg_float("--timeout"), default=None,
                   help="hard limit for the whole trial in seconds (default 300 on CPU, 900 on GPU)")
    t.add_argument("--address", default=None, help="Ray cluster address (default: start Ray on 127.0.0.1)")
    t.add_argument("--json", action="store_true", help="print one JSON object")
    t.add_argument("--inject-fault", default=None, help=argparse.SUPPRESS)
    add_recipe_flags(t)
    t.set_defaults(func=cmd_trial)
    return p


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    try:
        a = build_parser().parse_args(argv)
        if not getattr(a, "func", None):
            build_parser().print_help()
            return EXIT_BAD_INPUT
        return a.func(a)
    except ConfigError as e:
        print(f"trainscout: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("trainscout: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
