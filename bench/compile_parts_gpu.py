"""Issue 30: where a trial's cold torch.compile goes, by torch's own timers, on one GPU. One process, one rank
(a warm worker group's rank, without Ray): the trial worker's own loop (trial.worker.train_loop) runs each case,
then reset_process() as between a search's trials. Cases in order: bf16 (cold), fp8 tensorwise (a new graph),
fp8 tensorwise again (its graphs in inductor's on-disk cache), each with the quality gate where it applies. Per
case: the trial's phases and dynamo's compilation_time_metrics for the phases of torch.compile.
Usage: python bench/compile_parts_gpu.py [MODEL] [OUT]   (MODEL: a config.json or a built-in name)
"""
import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch._dynamo.utils import compilation_time_metrics as timers
from torch._inductor import config as inductor

from trainscout.trial.runner import prepare
from trainscout.trial.worker import reset_process, train_loop

MODEL = sys.argv[1] if len(sys.argv) > 1 else "bench/models/stablelm2-1.6b.json"
OUT = sys.argv[2] if len(sys.argv) > 2 else None
BASE = {"compile": True, "compile_scope": "layers", "loss_kernel": "compiled", "micro_batch_size": 8,
        "precision": "bf16-mixed", "activation_checkpointing": "none", "zero_stage": 0, "fsdp": "off"}
CASES = [("bf16", {"fp8": "off"}), ("fp8 new", {"fp8": "tensorwise"}), ("fp8 cached", {"fp8": "tensorwise"})]
PARTS = {  # dynamo's timer names (torch 2.11-2.13) -> what they are
    "bytecode_tracing": "dynamo trace", "aot_trace_joint_graph": "aot joint", "min_cut_rematerialization_partition":
    "partition", "compile_fx.<locals>.fw_compiler_base": "fw inductor", "compile_fx.<locals>.bw_compiler":
    "bw inductor", "GraphLowering.run": "lowering", "Scheduler.__init__": "sched init", "Scheduler.codegen":
    "sched codegen", "PyCodeCache.load_by_key_path": "load module", "async_compile.wait": "triton wait",
    "_compile.compile_inner": "compile total"}

os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29533")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # cpu: a smoke run of this script
dist.init_process_group("nccl" if DEVICE == "cuda" else "gloo", rank=0, world_size=1)
print(json.dumps({"compile_threads": inductor.compile_threads, "worker_start_method": inductor.worker_start_method,
                  "cpus": len(os.sched_getaffinity(0)), "fx_graph_cache": inductor.fx_graph_cache,
                  "torch": torch.__version__, "gpu": DEVICE == "cuda" and torch.cuda.get_device_name()}), flush=True)
if DEVICE == "cpu":  # no FP8 here: the smoke run takes a precision change for the gate instead
    CASES = [("bf16", {"fp8": "off"}), ("fp32 new", {"precision": "fp32"}), ("fp32 cached", {"precision": "fp32"})]
rows = []
for name, settings in CASES:
    spec = prepare(MODEL, dict(BASE, **settings), device=DEVICE, steps=3, warmup=2)
    t0 = time.perf_counter()
    out = train_loop(spec, 0, 1, 0)
    wall = time.perf_counter() - t0
    r = out["rank"]
    parts = {label: round(sum(timers.get(k, ())), 2) for k, label in PARTS.items()}
    gate = (r.get("quality") or {}).get("seconds")
    row = {"case": name, "wall_s": round(wall, 2), "build_s": round(r["build_s"], 2), "model_s": round(r["model_s"], 2),
           "compile_s": round(r["compile_s"], 2), "warmup_s": round(r["warmup_s"], 2),
           "timed_s": round(r["timed_s"], 2), "gate_s": gate,
           "micro_s": round(sum(s["micro"][0] for s in r["steps"]) / len(r["steps"]), 3), **parts}
    rows.append(row)
    print(json.dumps(row), flush=True)
    reset_process()  # as between a search's trials; it clears dynamo's timers too
cols = list(rows[0])
print("\n" + " | ".join(cols))
for row in rows:
    print(" | ".join(str(row[c]) for c in cols))
if OUT:
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "compile_parts.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
dist.destroy_process_group()
