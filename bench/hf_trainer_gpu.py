"""A stock HF Trainer runs an export (with and without trainscout.runtime.hf.prepare) and is timed against the
tokens/s trainscout measured for it: does the user's own trainer reach the measured speed?

Usage: python bench/hf_trainer_gpu.py EXPORT_DIR [--steps 20] [--warmup 3] [--no-hook] [--out results.jsonl]
EXPORT_DIR is what `trainscout export --format all` wrote. Synthetic token sequences (the throughput of a step does
not depend on their values); every optimizer step ends with torch.cuda.synchronize() in a TrainerCallback, the
median of the timed steps is the step time. Prints one JSON line and a table row.
"""
import argparse
import json
import os
import sys
import tempfile
import time


class Tokens:
    """A map-style dataset of random token sequences, each the same for the same index."""

    def __init__(self, n, seq, vocab):
        self.n, self.seq, self.vocab = n, seq, vocab

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        import torch
        x = torch.randint(0, self.vocab, (self.seq,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": x, "labels": x}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("export")
    p.add_argument("--steps", type=int, default=20, help="timed optimizer steps")
    p.add_argument("--warmup", type=int, default=3, help="untimed optimizer steps first (compile happens here)")
    p.add_argument("--no-hook", action="store_true", help="TrainingArguments alone, without hf.prepare")
    p.add_argument("--out", default=None)
    a = p.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, Trainer, TrainerCallback

    from trainscout.runtime import hf
    exp = hf.load(a.export)
    recipe = exp["recipe"]
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(hf.model_config(exp), attn_implementation="sdpa")
    if not a.no_hook:
        model = hf.prepare(model, exp)
    times = []

    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            sync()
            self.t = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            sync()
            times.append(time.perf_counter() - self.t)

    steps = a.warmup + a.steps
    with tempfile.TemporaryDirectory() as run:
        if a.no_hook:  # the export as a user without the hook loads it: every field as written
            from transformers import TrainingArguments
            args = json.load(open(os.path.join(a.export, "training_args.json")))
            args = TrainingArguments(**hf.for_installed(dict(args, output_dir=run, max_steps=steps, logging_steps=10**6)))
        else:
            args = hf.training_arguments(a.export, output_dir=run, max_steps=steps, logging_steps=10**6)
        n = steps * args.per_device_train_batch_size * args.gradient_accumulation_steps
        data = Tokens(n, recipe["seq_len"], int(exp["model_config"]["vocab_size"]))
        t0 = time.perf_counter()
        Trainer(model=model, args=args, train_dataset=data, callbacks=[Clock()]).train()
        wall = time.perf_counter() - t0
    timed = sorted(times[a.warmup:])
    step = timed[len(timed) // 2]
    tokens = args.per_device_train_batch_size * args.gradient_accumulation_steps * recipe["seq_len"]
    measured = (exp.get("metrics") or {}).get("tokens_per_s")
    row = {"export": a.export, "hook": not a.no_hook, "steps": len(timed), "step_s": step,
           "tokens_per_s": tokens / step, "trainscout_tokens_per_s": measured,
           "ratio": tokens / step / measured if measured else None, "wall_s": round(wall, 1),
           "torch_compile": args.torch_compile, "config": exp.get("config")}
    print(json.dumps(row), flush=True)
    if a.out:
        with open(a.out, "a") as f:
            f.write(json.dumps(row) + "\n")
    print(f"{os.path.basename(a.export.rstrip('/')):30} hook={'yes' if row['hook'] else 'no '} "
          f"HF Trainer {row['tokens_per_s']:>10,.0f} tokens/s  trainscout {measured or 0:>10,.0f}  "
          f"ratio {row['ratio'] or 0:.3f}  ({len(timed)} steps, median {step:.3f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
