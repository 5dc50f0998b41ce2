"""The optimizer knobs measured on one GPU, as trials (trainscout.trial.prepare/execute: the real workers and engines).

Usage: python bench/optimizer_gpu.py [--model pythia-1b|bench/models/llama-1b.json|tiny] [--device cuda|cpu]
       [--micro-batch 4] [--steps 5] [--out results.jsonl]
- optimizer_impl foreach vs fused: the record's optimizer phase (metrics optimizer_s, the median optimizer step) and
  tokens/s, same model, batch and everything else.
- optimizer_state fp32 / bf16 / 8bit / 4bit (and precision=bf16): the measured peak memory (max_memory_allocated; on
  the CPU the peak RSS, which holds the whole process) against the memory model's estimate (predictor.memory.predict,
  uncalibrated) and its optimizer term, and the record's optimizer dtypes.
Prints one markdown table per part; each row's record is appended to --out as JSON (one line each).
Smoke run on the CPU: python bench/optimizer_gpu.py --model tiny --device cpu --steps 2
"""
import argparse
import json
import sys

from trainscout.predictor import memory
from trainscout.trial import execute, prepare

GiB = 2**30
IMPLS = ("foreach", "fused")
STATES = ({"optimizer_state": "fp32"}, {"optimizer_state": "bf16"}, {"optimizer_state": "8bit"},
          {"optimizer_state": "4bit"}, {"optimizer_state": "fp8"}, {"precision": "bf16"})


def measure(args, settings: dict):
    """One trial of the model with the settings; (record, its spec)."""
    spec = prepare(args.model, {"micro_batch_size": args.micro_batch, **settings}, device=args.device, workers=1,
                   steps=args.steps, warmup=2, global_batch=args.micro_batch * 2, measure_accum=2)
    rec = execute(spec, timeout=args.timeout)
    if args.out:
        with open(args.out, "a", encoding="utf-8") as f:
            f.write(json.dumps({"settings": settings, "record": rec.to_dict()}, default=str) + "\n")
    return rec, spec


def label(settings: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in settings.items())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="pythia-1b")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    failed = 0

    print(f"\n### optimizer_impl, {args.model} on {args.device}, micro-batch {args.micro_batch}\n")
    print("| optimizer_impl | optimizer_s (median) | tokens/s | step_s | vs foreach |")
    print("|---|---|---|---|---|")
    base = None
    for impl in IMPLS:
        rec, _ = measure(args, {"optimizer_impl": impl})
        if not rec.ok:
            failed += 1
            print(f"| {impl} | {rec.status}: {(rec.error or '')[:120]} | | | |")
            continue
        m = rec.metrics
        base = base or m["optimizer_s"]
        print(f"| {impl} | {m['optimizer_s'] * 1e3:.2f} ms | {m['tokens_per_s']:,.0f} | {m['step_s']:.4f} | "
              f"{m['optimizer_s'] / base:.2f}x |")
        sys.stdout.flush()

    what = "peak allocated" if args.device == "cuda" else "peak RSS (the whole process)"
    print(f"\n### optimizer states, {args.model} on {args.device}: {what} vs the memory model\n")
    print("| settings | measured peak GiB | estimate GiB | estimate / measured | optimizer term GiB | "
          "saved vs fp32 GiB: measured / estimated | optimizer dtypes |")
    print("|---|---|---|---|---|---|---|")
    ref = None
    for settings in STATES:
        rec, spec = measure(args, settings)
        est = memory.predict(spec) / GiB
        opt = memory.components(spec)["optimizer"] / GiB
        if not rec.ok:
            failed += 1
            print(f"| {label(settings)} | {rec.status}: {(rec.error or '')[:120]} | {est:.2f} | | {opt:.3f} | | |")
            continue
        peak = rec.metrics["peak_memory_gib"]
        ref = ref or (peak, est)  # fp32 states, the first row
        saved = f"{ref[0] - peak:.3f} / {ref[1] - est:.3f}"
        print(f"| {label(settings)} | {peak:.3f} | {est:.3f} | {est / peak:.3f} | {opt:.3f} | {saved} | "
              f"{rec.metrics['dtypes']['optimizer']} |")
        sys.stdout.flush()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
