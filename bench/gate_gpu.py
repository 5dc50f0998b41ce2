"""The quality gate on the H200 (issue 27): bf16, fp8 tensorwise and fp8 rowwise trained STEPS steps on the shipped
real-text corpus (analysis/corpus/) from the same seed and batches, in trainscout's workers, for Pythia-1B and the
Llama-1B shape (bench/models/llama-1b.json); each fp8 run compared with bf16 by analysis.quality.compare (loss over
the last tenth with its 95 % interval, tokens to equal loss). Eager layers (no compile: its warm-up would cost more
than the steps), micro-batch 8 x 256 tokens, lr as the recipe (1e-4, AdamW), one seed. Each run's losses are written
to OUT_DIR/gate.jsonl as it ends (a first attempt at 8 x 512 ran out of its 420 s before writing anything).
Usage: python bench/gate_gpu.py OUT_DIR [STEPS [MODEL [CONFIG,CONFIG]]]   (MODEL: pythia-1b or llama-1b; a run of
some configurations only, the others' losses read from OUT_DIR/gate.jsonl)
"""
import json
import os
import sys
import time

from trainscout.analysis.quality import compare, corpus_tokens
from trainscout.trial import execute, prepare

OUT = sys.argv[1]
STEPS = int(sys.argv[2]) if len(sys.argv) > 2 else 500
HERE = os.path.dirname(os.path.abspath(__file__))
MODELS = ("pythia-1b", os.path.join(HERE, "models", "llama-1b.json"))
CONFIGS = {"bf16": {}, "fp8 tensorwise": {"fp8": "tensorwise"}, "fp8 rowwise": {"fp8": "rowwise"}}
COMMON = {"micro_batch_size": 8, "compile": False, "activation_checkpointing": "none", "zero_stage": 0}

if len(sys.argv) > 3:
    MODELS = tuple(m for m in MODELS if os.path.basename(m).replace(".json", "") == sys.argv[3])
ONLY = sys.argv[4].split(",") if len(sys.argv) > 4 else list(CONFIGS)
data, n = corpus_tokens(OUT)
SEQ = 256
out = {"steps": STEPS, "corpus_tokens": n, "batch": [8, SEQ], "runs": {}, "compare": {}}
log = open(os.path.join(OUT, "gate.jsonl"), "a")
for model in MODELS:
    name = os.path.basename(model).replace(".json", "")
    for label, sets in CONFIGS.items():
        if label not in ONLY:
            continue
        t0 = time.time()
        spec = prepare(model, dict(COMMON, **sets), device="cuda", steps=STEPS, warmup=0, measure_accum=0, seed=0,
                       gate=False, global_batch=8, seq_len=SEQ).replace(data=data, data_dtype="uint16")
        r = execute(spec, timeout=900)
        m = r.metrics or {}
        out["runs"][f"{name} {label}"] = {"status": str(r.status), "error": r.error, "losses": m.get("losses"),
                                          "tokens_per_s": m.get("tokens_per_s"), "wall_s": round(time.time() - t0, 1)}
        log.write(json.dumps({"run": f"{name} {label}", **out["runs"][f"{name} {label}"]}) + "\n")
        log.flush()
        print(f"{name:14} {label:15} {r.status} {m.get('tokens_per_s', 0):>10,.0f} tok/s  final loss "
              f"{(m.get('losses') or [float('nan')])[-1]:.4f}  {time.time() - t0:.0f} s {r.error or ''}", flush=True)
    if os.path.exists(os.path.join(OUT, "gate.jsonl")):  # runs of an earlier call
        for line in open(os.path.join(OUT, "gate.jsonl")):
            row = json.loads(line)
            out["runs"].setdefault(row.pop("run"), row)
    ref = out["runs"][f"{name} bf16"]
    for label in ("fp8 tensorwise", "fp8 rowwise"):
        c = out["runs"][f"{name} {label}"]
        if ref["losses"] and c["losses"]:
            cmp = compare([c["losses"]], [ref["losses"]])
            cmp.pop("curves")
            cmp["speed_ratio_these_runs"] = c["tokens_per_s"] / ref["tokens_per_s"]
            out["compare"][f"{name} {label}"] = cmp
            lo, hi = cmp["loss"]["ci95"]
            print(f"{name:14} {label:15} vs bf16: loss {cmp['loss']['candidate']:.4f} vs {cmp['loss']['reference']:.4f}"
                  f" ({cmp['loss']['rel_diff']:+.2%}, 95 % {lo:+.2%} .. {hi:+.2%}) -> {cmp['verdict']}; tokens to "
                  f"equal loss {cmp['token_efficiency']}; tokens/s ratio (eager, these runs) "
                  f"{cmp['speed_ratio_these_runs']:.3f}", flush=True)
with open(os.path.join(OUT, "gate.json"), "w") as f:
    json.dump(out, f, indent=1)
