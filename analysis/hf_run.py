"""Run an export in the stock HF Trainer and time it: what `trainscout verify --runner hf|accelerate` launches.

    python -m trainscout.analysis.hf_run EXPORT_DIR [--steps 20] [--warmup 3] [--no-hook] [--out row.json]
    accelerate launch --config_file EXPORT_DIR/accelerate.yaml -m trainscout.analysis.hf_run EXPORT_DIR ...

EXPORT_DIR is what `trainscout export` wrote. The model is built from the exported config (transformers'
AutoModelForCausalLM, SDPA attention), `trainscout.runtime.hf.prepare` applies the measured transforms (unless
--no-hook: training_args.json alone, as a user without trainscout loads it), and TrainingArguments come from the
export. Synthetic token sequences (a step's throughput does not depend on their values). Every optimizer step
ends with a device synchronisation in a TrainerCallback; the median of the timed steps is the step time. Rank 0
prints one JSON line (and writes it to --out).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

from trainscout.trial.records import TOKENS_PER_S


class Tokens:
    """A map-style dataset of random token sequences, each the same for the same index."""

    def __init__(self, n: int, seq: int, vocab: int):
        self.n, self.seq, self.vocab = n, seq, vocab

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        import torch
        x = torch.randint(0, self.vocab, (self.seq,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": x, "labels": x}


def run(export: str, *, steps: int = 20, warmup: int = 3, hook: bool = True, extra: dict | None = None) -> dict:
    """Train the export for warmup + steps optimizer steps in a stock HF Trainer; the timing as a dict."""
    import torch
    from transformers import AutoModelForCausalLM, Trainer, TrainerCallback, TrainingArguments

    from trainscout.runtime import hf
    exp = hf.load(export)
    recipe = exp["recipe"]
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(hf.model_config(exp), attn_implementation="sdpa")
    if hook:
        model = hf.prepare(model, exp)
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    times: list[float] = []

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            sync()
            self.t = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            sync()
            times.append(time.perf_counter() - self.t)

    total = warmup + steps
    with tempfile.TemporaryDirectory() as out:
        over = dict(output_dir=out, max_steps=total, logging_steps=10**6, save_strategy="no", **(extra or {}))
        if hook:
            args = hf.training_arguments(export, **over)
        else:  # every field as written (spelled for the installed version, paths against the folder)
            args = TrainingArguments(**{**hf.read_arguments(export), **hf.for_installed(over)})
        per_step = args.per_device_train_batch_size * args.gradient_accumulation_steps * args.world_size
        data = Tokens(total * per_step, recipe["seq_len"], int(exp["model_config"]["vocab_size"]))
        t0 = time.perf_counter()
        result = Trainer(model=model, args=args, train_dataset=data, callbacks=[Clock()]).train()
        wall = time.perf_counter() - t0
    timed = sorted(times[warmup:])
    step = timed[len(timed) // 2]
    measured = (exp.get("metrics") or {}).get(TOKENS_PER_S)
    tokens_per_s = per_step * recipe["seq_len"] / step
    return {"runner": "hf", "hook": hook, "world_size": args.world_size, "steps": len(timed), "step_s": step,
            "mean_step_s": sum(timed) / len(timed), TOKENS_PER_S: tokens_per_s, "trainscout_tokens_per_s": measured,
            "ratio": tokens_per_s / measured if measured else None, "loss": result.training_loss,
            "wall_s": round(wall, 1), "torch_compile": args.torch_compile,
            "global_batch": per_step, "recipe_global_batch": recipe["global_batch"]}


def main(argv: list[str] | None = None) -> int:
    """Command line of this module: run the export, print its JSON row on rank 0 (and write --out); returns 0."""
    p = argparse.ArgumentParser(prog="python -m trainscout.analysis.hf_run", description=__doc__.splitlines()[0])
    p.add_argument("export", help="a folder written by trainscout export")
    p.add_argument("--steps", type=int, default=20, help="timed optimizer steps")
    p.add_argument("--warmup", type=int, default=3, help="untimed optimizer steps first (compile happens here)")
    p.add_argument("--no-hook", action="store_true", help="TrainingArguments alone, without hf.prepare")
    p.add_argument("--out", default=None, help="write the JSON row here (rank 0)")
    p.add_argument("--arg", action="append", default=[], metavar="FIELD=JSON",
                   help="override a TrainingArguments field (repeatable), e.g. --arg logging_nan_inf_filter=false")
    a = p.parse_args(argv)
    extra = {k: json.loads(v) for k, _, v in (x.partition("=") for x in a.arg)}
    row = run(a.export, steps=a.steps, warmup=a.warmup, hook=not a.no_hook, extra=extra) | {"args": extra}
    if int(os.environ.get("RANK", "0")) == 0:
        print(json.dumps(row), flush=True)
        if a.out:
            with open(a.out, "w", encoding="utf-8") as f:
                json.dump(row, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
