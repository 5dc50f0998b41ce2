"""Issue 17, item 2: the same configurations measured in fresh worker processes and in a reused (warm) group, on
one GPU: tokens/s of each (reused / fresh, median), and each trial's overhead outside its timed steps (wall - timed).

    python bench/warm_workers_gpu.py [--model pythia-160m] [--reused 10] [--llama bench/models/llama-1b.json]

The reused group runs the configurations in turn, more times than dynamo's recompile limit (8), so a compiled
configuration that fell back to eager in a reused process would show here. Prints a table; --out writes the rows.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from trainscout.trial import execute, prepare
from trainscout.trial.ray_cluster import ensure_ray

FIXED = {"precision": "bf16-mixed", "tf32": True, "attention": "sdpa", "sdpa_backend": "auto", "zero_stage": 0,
         "fsdp": "off", "pipeline_stages": 1, "activation_checkpointing": "none", "fp8": "off"}
CONFIGS = {
    "compiled": dict(FIXED, compile=True, compile_scope="layers", loss_kernel="compiled", micro_batch_size=16),
    "eager": dict(FIXED, compile=False, loss_kernel="eager", micro_batch_size=16),
}


def one(model, name, settings, reuse, rows, out):
    spec = prepare(model, settings, device="cuda", steps=5, warmup=2)
    t = time.perf_counter()
    r = execute(spec, reuse=reuse, timeout=900)
    m = r.m
    row = {"model": os.path.basename(model), "config": name, "reuse": reuse, "reused": r.reused,
           "status": str(r.status), "tokens_per_s": m.get("tokens_per_s"), "wall_s": round(time.perf_counter() - t, 2),
           "timed_s": m.get("timed_s"), "build_s": m.get("build_s"), "warmup_s": m.get("warmup_s"),
           "peak_gib": m.get("peak_memory_gib"), "error": r.error}
    row["overhead_s"] = round(row["wall_s"] - (row["timed_s"] or 0), 2)
    rows.append(row)
    print(json.dumps(row), flush=True)
    if out:
        with open(out, "a") as f:
            f.write(json.dumps(row) + "\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="pythia-160m")
    ap.add_argument("--reused", type=int, default=10, help="reused trials per configuration")
    ap.add_argument("--llama", default=None, help="a second model: 1 fresh + 2 reused trials of the compiled config")
    ap.add_argument("--llama-only", action="store_true", help="only the second model's trials")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    ensure_ray()
    rows = []
    for name, s in CONFIGS.items() if not a.llama_only else ():  # fresh: a group of its own, killed after
        one(a.model, name, s, False, rows, a.out)
    for _ in range(0 if a.llama_only else a.reused):  # one warm group, the configurations in turn
        for name, s in CONFIGS.items():
            one(a.model, name, s, True, rows, a.out)
    for name, s in CONFIGS.items() if not a.llama_only else ():
        one(a.model, name, s, False, rows, a.out)
    if a.llama:
        llama = os.path.abspath(a.llama)
        for reuse in (False, True, True):
            one(llama, "compiled", dict(CONFIGS["compiled"], micro_batch_size=8), reuse, rows, a.out)
    print("\nmodel | config | fresh tok/s (median) | reused tok/s (median) | reused/fresh | overhead fresh s | "
          "overhead reused s (after the first) | n fresh / reused")
    for model in dict.fromkeys(r["model"] for r in rows):
        for name in CONFIGS:
            ok = [r for r in rows if r["model"] == model and r["config"] == name and r["status"] == "ok"]
            fresh = [r for r in ok if not r["reuse"]]
            warm = [r for r in ok if r["reuse"] and r["reused"]]
            if not fresh or not warm:
                continue
            f = statistics.median(r["tokens_per_s"] for r in fresh)
            w = statistics.median(r["tokens_per_s"] for r in warm)
            print(f"{model} | {name} | {f:,.0f} | {w:,.0f} | {w / f:.3f} | "
                  f"{statistics.median(r['overhead_s'] for r in fresh):.1f} | "
                  f"{statistics.median(r['overhead_s'] for r in warm):.1f} | {len(fresh)} / {len(warm)}")
    bad = [r for r in rows if r["status"] != "ok"]
    print(f"{len(rows)} trials, {len(bad)} not ok" + "".join(f"\n  {r['config']} reuse={r['reuse']}: {r['error']}"
                                                             for r in bad))


if __name__ == "__main__":
    main()
