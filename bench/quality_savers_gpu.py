"""The quality verdict of issue 46's numerics-changing memory savers: pure bf16 weights (precision=bf16, torchao's
stochastic-rounding AdamW) and the low-precision AdamW states (optimizer_state=bf16 | 8bit | 4bit | fp8), each
trained STEPS steps on the shipped real-text corpus from the same seed and batches as its reference (bf16-mixed with
fp32 states: the reference `verify --quality` trains for these knobs, trial.quality.reference), in trainscout's
workers, compared by analysis.quality.compare (the comparison `verify --quality` stores: loss over the last tenth with
its 95 % interval, tokens to equal loss). The reference is trained once and compared with every candidate (verify
--quality would train it again beside each). Each run's peak memory is printed beside the memory model's estimate.

Usage: python bench/quality_savers_gpu.py OUT_DIR [--model pythia-160m] [--steps 400] [--batch 16] [--seq 512]
       python bench/quality_savers_gpu.py /tmp/q --model tiny --device cpu --steps 20 --batch 4 --seq 64  (CPU smoke)
Writes OUT_DIR/quality.jsonl (each run as it ends) and prints a markdown table.
"""
import argparse
import json
import os
import time

from trainscout.analysis.quality import compare, corpus_tokens
from trainscout.predictor import memory
from trainscout.trial import execute, prepare
from trainscout.trial.models import sizes

GiB = 2**30
CANDIDATES = {"precision=bf16": {"precision": "bf16"}, "optimizer_state=bf16": {"optimizer_state": "bf16"},
              "optimizer_state=8bit": {"optimizer_state": "8bit"}, "optimizer_state=4bit": {"optimizer_state": "4bit"},
              "optimizer_state=fp8": {"optimizer_state": "fp8"}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--model", default="pythia-160m")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--only", default=",".join(CANDIDATES))
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    common = {"micro_batch_size": a.batch, "compile": False, "activation_checkpointing": "none"}
    if a.device == "cpu":
        common["precision"] = "fp32"
    runs = {}
    log = open(os.path.join(a.out, "quality.jsonl"), "a", encoding="utf-8")

    def run(label: str, sets: dict):
        spec = prepare(a.model, dict(common, **sets), device=a.device, steps=a.steps, warmup=0, measure_accum=0,
                       seed=0, gate=False, global_batch=a.batch, seq_len=a.seq)
        data, n = corpus_tokens(a.out, sizes(spec.model_config).vocab)
        t0 = time.time()
        r = execute(spec.replace(data=data, data_dtype="uint16"), timeout=900)
        m = r.metrics or {}
        row = {"run": label, "status": str(r.status), "error": r.error, "losses": m.get("losses"),
               "tokens_per_s": m.get("tokens_per_s"), "peak_gib": m.get("peak_memory_gib"),
               "estimate_gib": memory.predict(spec) / GiB, "dtypes": m.get("dtypes"), "corpus_tokens": n,
               "wall_s": round(time.time() - t0, 1)}
        log.write(json.dumps(row) + "\n")
        log.flush()
        print(f"{label:22} {r.status} {row['tokens_per_s'] or 0:>10,.0f} tok/s  peak {row['peak_gib'] or 0:.2f} GiB "
              f"(estimate {row['estimate_gib']:.2f})  final loss {(row['losses'] or [float('nan')])[-1]:.4f}  "
              f"{row['wall_s']:.0f} s {r.error or ''}", flush=True)
        runs[label] = row

    run("reference (bf16-mixed)", {})
    for label in a.only.split(","):
        run(label, CANDIDATES[label])
    ref = runs["reference (bf16-mixed)"]
    print(f"\n{a.model}, {a.steps} steps of {a.batch} x {a.seq} tokens on {a.device}, seed 0\n")
    print("| candidate | loss | reference | rel. diff (95 %) | verdict | tokens to equal loss | tokens/s ratio | "
          "peak GiB (estimate) | weights/grads/optimizer |")
    print("|---|---|---|---|---|---|---|---|---|")
    for label in a.only.split(","):
        c = runs[label]
        if not (c["losses"] and ref["losses"]):
            print(f"| {label} | {c['status']}: {(c['error'] or '')[:100]} | | | | | | | |")
            continue
        cmp = compare([c["losses"]], [ref["losses"]])
        lo, hi = cmp["loss"]["ci95"]
        states = "/".join(str(v) for v in (c["dtypes"] or {}).values())
        print(f"| {label} | {cmp['loss']['candidate']:.4f} | {cmp['loss']['reference']:.4f} | "
              f"{cmp['loss']['rel_diff']:+.2%} ({lo:+.2%} .. {hi:+.2%}) | {cmp['verdict']} | "
              f"{cmp['token_efficiency'] if cmp['token_efficiency'] is None else round(cmp['token_efficiency'], 3)} | "
              f"{c['tokens_per_s'] / ref['tokens_per_s']:.3f} | {c['peak_gib']:.2f} ({c['estimate_gib']:.2f}) | "
              f"{states} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
