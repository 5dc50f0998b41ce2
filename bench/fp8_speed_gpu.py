"""Issue 27: the compiled speed of Pythia-1B under bf16, fp8 rowwise and fp8 tensorwise, on one lease (one process,
warm workers), for the "speed at equal loss" column of docs/BENCHMARKS.md (the 500-step losses are
bench/data/gpu-2026-12-02-s11/gate.jsonl). Layers and loss compiled, micro-batch 16, 3 timed steps after 2 of
warm-up; the configurations interleaved (bf16, rowwise, tensorwise, then bf16 and rowwise again) so that drift over
the lease shows. One JSON line per trial on stdout and in OUT/fp8_speed.jsonl.
Usage: python bench/fp8_speed_gpu.py OUT [MODEL]
"""
import json
import os
import sys

from trainscout.trial import run_trial

OUT, MODEL = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "pythia-1b"
BASE = {"compile": True, "compile_scope": "layers", "loss_kernel": "compiled", "micro_batch_size": 16,
        "precision": "bf16-mixed", "activation_checkpointing": "none", "zero_stage": 0, "fsdp": "off"}
os.makedirs(OUT, exist_ok=True)
with open(os.path.join(OUT, "fp8_speed.jsonl"), "a") as log:
    for fp8 in ("off", "rowwise", "tensorwise", "off", "rowwise"):
        r = run_trial(MODEL, dict(BASE, fp8=fp8), device="cuda", steps=3, warmup=2)
        m = r.metrics or {}
        row = {"model": MODEL, "fp8": fp8, "status": str(r.status), "tokens_per_s": m.get("tokens_per_s"),
               "mfu": m.get("mfu"), "step_spread": m.get("step_spread"), "peak_memory_gib": m.get("peak_memory_gib"),
               "wall_s": r.wall_s, "error": (r.error or "")[:300] or None}
        print(json.dumps(row), flush=True)
        log.write(json.dumps(row) + "\n")
        log.flush()
