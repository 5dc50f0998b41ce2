"""GPU checks of the trial core (issue 2): yardstick rows, engines on Pythia-410M, projection vs a full step.

Usage: python bench/trial_gpu.py [--group yardstick|engines|projection|all] [--out results.jsonl]
Each case is a real `trainscout trial` (fresh Ray Train worker processes); prints one JSON line per case and a
table last. The yardstick rows use its settings: one micro-batch per optimizer step, no gradient clipping.
"""
import argparse
import json
import sys
import time

from trainscout.trial import run_trial

YARDSTICK = {  # ../shared/bench/README.md, H200, tokens/s
    ("pythia-160m", 32, False): 291_439, ("pythia-160m", 32, True): 359_212,
    ("pythia-410m", 16, False): 120_700, ("pythia-1b", 16, False): 69_690,
}
GROUPS = {
    "yardstick": [
        (f"{m} mbs{mbs}{' compile' if c else ''}", m, {"micro_batch_size": mbs, "compile": c},
         dict(global_batch=mbs, grad_clip=0.0)) for (m, mbs, c) in YARDSTICK
    ],
    "engines": [
        (name, "pythia-410m", {"micro_batch_size": 16, **s}, dict(global_batch=64)) for name, s in [
            ("410m zero1", {"zero_stage": 1}), ("410m zero2", {"zero_stage": 2}), ("410m zero3", {"zero_stage": 3}),
            ("410m zero2+offload_opt", {"zero_stage": 2, "offload_optimizer": True}),
            ("410m zero3+offload_params", {"zero_stage": 3, "offload_params": True}),
            ("410m ckpt full mbs32", {"activation_checkpointing": "full", "micro_batch_size": 32}),
            ("410m fsdp full_shard", {"fsdp": "full_shard"}),
        ]
    ],
    "projection": [
        ("410m gb64 mbs8 projected (2 of 8 measured)", "pythia-410m", {"micro_batch_size": 8},
         dict(global_batch=64, measure_accum=2)),
        ("410m gb64 mbs8 full step measured", "pythia-410m", {"micro_batch_size": 8},
         dict(global_batch=64, measure_accum=0)),
    ],
}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--group", default="all", choices=[*GROUPS, "all"])
    p.add_argument("--out", default=None, help="append JSON lines here")
    p.add_argument("--steps", type=int, default=6)
    a = p.parse_args()
    cases = [c for g, cs in GROUPS.items() if a.group in (g, "all") for c in cs]
    rows = []
    for label, model, settings, kw in cases:
        t = time.time()
        r = run_trial(model, settings, device="cuda", workers=1, steps=a.steps, warmup=2, **kw)
        m = r.get("metrics") or {}
        row = {"case": label, "status": r["status"], "error": (r.get("error") or "")[:300],
               "tokens_per_s": m.get("tokens_per_s"), "mfu": m.get("mfu"), "step_s": m.get("step_s"),
               "measured_step_s": m.get("measured_step_s"), "spread": m.get("step_spread"),
               "peak_gib": m.get("peak_memory_gib"), "reserved_mib": (m.get("peak_reserved_mib") or [None])[0],
               "warmup_s": m.get("warmup_s"), "build_s": m.get("build_s"), "wall_s": round(time.time() - t, 1),
               "yardstick": YARDSTICK.get((model, settings["micro_batch_size"], settings.get("compile", False)))
               if "yardstick" in label or kw.get("grad_clip") == 0.0 else None, "record": r}
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "record"}), flush=True)
        if a.out:
            with open(a.out, "a") as f:
                f.write(json.dumps(row) + "\n")
    print(f"\n{'case':48} {'status':7} {'tokens/s':>10} {'MFU':>6} {'step s':>8} {'meas s':>8} {'peak GiB':>8} {'vs yard':>8}")
    for r in rows:
        ok = r["status"] == "ok"
        ratio = f"{r['tokens_per_s'] / r['yardstick']:.3f}" if ok and r["yardstick"] else ""
        print(f"{r['case']:48} {r['status']:7} {r['tokens_per_s'] or 0:>10,.0f} {r['mfu'] or 0:>6.3f} "
              f"{r['step_s'] or 0:>8.4f} {r['measured_step_s'] or 0:>8.4f} {r['peak_gib'] or 0:>8.1f} {ratio:>8}")
    return 0 if all(r["status"] == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
