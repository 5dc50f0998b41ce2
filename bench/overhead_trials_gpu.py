"""Issue 27/30: what a model's trials cost outside their timed steps, trial after trial in one warm worker group (as
a search runs them, without ASHA stopping any: a search keeps no record of a stopped trial's phases, so an MoE
search whose trials ASHA stopped gave one sample). Each trial's overhead (wall − timed steps) and its parts from the
record: model and engine, torch.compile, probe or warm-up steps, the quality gate, the rest; then the median after
the first trial. One JSON line per trial on stdout and in OUT/overhead_trials.jsonl.
Usage: python bench/overhead_trials_gpu.py OUT MODEL [SETTINGS ...]   (SETTINGS: knob=value,knob=value per trial;
default: the start points' path, bf16 -> fp8 tensorwise -> + fused linear CE -> + FSDP2 full_shard)
"""
import json
import os
import statistics
import sys

import torch

from trainscout.trial import run_trial

OUT, MODEL = sys.argv[1], sys.argv[2]
BASE = {"compile": True, "loss_kernel": "compiled", "micro_batch_size": "max", "activation_checkpointing": "none"}
DEFAULT = ["fp8=off", "fp8=tensorwise", "fp8=tensorwise,loss_kernel=fused_linear",
           "fp8=tensorwise,loss_kernel=fused_linear,fsdp=full_shard"]
device = "cuda" if torch.cuda.is_available() else "cpu"
if device == "cpu":  # a smoke run of this script: no FP8, no inductor
    BASE, DEFAULT = {"compile": False, "precision": "fp32"}, ["micro_batch_size=2", "micro_batch_size=4"]
os.makedirs(OUT, exist_ok=True)
rows = []
with open(os.path.join(OUT, "overhead_trials.jsonl"), "a") as log:
    for text in sys.argv[3:] or DEFAULT:
        settings = dict(BASE, **dict(kv.split("=", 1) for kv in text.split(",")))
        r = run_trial(MODEL, settings, device=device, steps=3, warmup=2)
        m = r.metrics or {}
        row = {"model": MODEL, "settings": text, "status": str(r.status), "reused": r.reused, "wall_s": r.wall_s,
               "error": (r.error or "")[:300] or None, "tokens_per_s": m.get("tokens_per_s")}
        if r.ok:
            timed, gate = m["timed_s"], m.get("gate_s") or 0.0
            steps = m["build_s"] - m["model_s"] + m["warmup_s"] - (m.get("compile_s") or 0.0)
            row.update(overhead_s=round(r.wall_s - timed, 2), model_s=round(m["model_s"], 2),
                       compile_s=round(m.get("compile_s") or 0.0, 2), steps_s=round(steps, 2), gate_s=gate,
                       rest_s=round(r.wall_s - timed - m["build_s"] - m["warmup_s"] - gate, 2),
                       micro_batch_size=r.plan.micro_batch_size)
        rows.append(row)
        print(json.dumps(row), flush=True)
        log.write(json.dumps(row) + "\n")
        log.flush()
later = [r["overhead_s"] for r in rows[1:] if "overhead_s" in r]
if later:
    print(f"{MODEL}: overhead after the first trial, median {statistics.median(later):.1f} s over {len(later)} "
          f"trials ({', '.join(f'{x:.1f}' for x in later)})")
