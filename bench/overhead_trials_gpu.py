"""Issue 27/30: what a model's trials cost outside their timed steps, trial after trial in one warm worker group (as
a search runs them, without ASHA stopping any: a search keeps no record of a stopped trial's phases, so an MoE
search whose trials ASHA stopped gave one sample). Each trial's overhead (wall − timed steps) and its parts from the
record; then the median after the first trial and where it went, as a search's summary says them. One JSON line
per trial on stdout and in OUT/overhead_trials.jsonl.
Usage: python bench/overhead_trials_gpu.py OUT MODEL [SETTINGS ...]   (SETTINGS: knob=value,knob=value per trial;
default: the start points' path, bf16 -> fp8 tensorwise -> + fused linear CE -> + FSDP2 full_shard)
"""
import json
import os
import statistics
import sys

import torch

from trainscout.search.summary import overhead_parts, overhead_s
from trainscout.trial import run_trial

OUT, MODEL = sys.argv[1], sys.argv[2]
BASE = {"compile": True, "loss_kernel": "compiled", "micro_batch_size": "max", "activation_checkpointing": "none"}
DEFAULT = ["fp8=off", "fp8=tensorwise", "fp8=tensorwise,loss_kernel=fused_linear",
           "fp8=tensorwise,loss_kernel=fused_linear,fsdp=full_shard"]
device = "cuda" if torch.cuda.is_available() else "cpu"
if device == "cpu":  # a smoke run of this script: no FP8, no inductor
    BASE, DEFAULT = {"compile": False, "precision": "fp32"}, ["micro_batch_size=2", "micro_batch_size=4"]
os.makedirs(OUT, exist_ok=True)
ran = []
with open(os.path.join(OUT, "overhead_trials.jsonl"), "a") as log:
    for text in sys.argv[3:] or DEFAULT:
        settings = dict(BASE, **dict(kv.split("=", 1) for kv in text.split(",")))
        r = run_trial(MODEL, settings, device=device, steps=3, warmup=2)
        m = r.metrics or {}
        row = {"model": MODEL, "settings": text, "status": str(r.status), "reused": r.reused, "wall_s": r.wall_s,
               "error": (r.error or "")[:300] or None, "tokens_per_s": m.get("tokens_per_s")}
        if r.ok:
            ran.append(r)
            row.update(overhead_s=round(overhead_s(r), 2), micro_batch_size=r.plan.micro_batch_size,
                       **{k: m.get(k) for k in ("model_s", "compile_s", "autotune_s", "build_s", "warmup_s",
                                                "gate_s", "timed_s", "gc_s", "reset_s", "handoff_s")},
                       gate_parts_s=(m.get("quality") or {}).get("parts_s"))
        print(json.dumps(row), flush=True)
        log.write(json.dumps(row) + "\n")
        log.flush()
if len(ran) > 1:  # the search summary's own lines, over these trials
    later = [overhead_s(r) for r in ran[1:]]
    print(f"{MODEL}: overhead after the first trial, median {statistics.median(later):.1f} s over {len(later)} "
          f"trials ({', '.join(f'{x:.1f}' for x in later)})")
    print(f"  where it went after the first: {overhead_parts(ran[1:], later)}")
