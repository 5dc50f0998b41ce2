"""GPU trials: yardstick rows, engines on Pythia-410M, projection vs a full step, the memory model's
calibration set (Pythia-160M/410M/1B), and Pythia-1B spread over all GPUs of a box (ZeRO, FSDP2, pipeline).

Usage: python bench/trial_gpu.py
       [--group yardstick|engines|projection|memory|kernels|loss|fp8_lce|handset_llama|multi|pipeline|all]
       [--case TEXT] [--out results.jsonl] [--store DIR] [--parallel K]
Each case is a real `trainscout trial` (fresh Ray Train worker processes); prints one JSON line per case and a
table last. --parallel runs K one-GPU cases at once (one per GPU); --store also keeps every record in a results
store (for `trainscout estimate --calibrate DIR` and bench/memory_error.py). The yardstick rows use its settings:
one micro-batch per optimizer step, no gradient clipping.
"""
import argparse
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from trainscout.trial import execute, hardware, prepare

MODELS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "models")
LLAMA = os.path.join(MODELS, "llama-1b.json")
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
    "memory": [  # one GPU: engines, offload, checkpointing and micro-batches of three sizes
        (f"{m[7:]} {name}", m, s, {}) for m, name, s in [
            ("pythia-160m", "mbs32", {"micro_batch_size": 32}),
            ("pythia-160m", "ckpt full mbs64", {"micro_batch_size": 64, "activation_checkpointing": "full"}),
            ("pythia-410m", "mbs16", {"micro_batch_size": 16}),
            ("pythia-410m", "zero3 mbs8", {"micro_batch_size": 8, "zero_stage": 3}),
            ("pythia-410m", "fsdp mbs8", {"micro_batch_size": 8, "fsdp": "full_shard"}),
            ("pythia-410m", "ckpt 2 mbs32", {"micro_batch_size": 32, "activation_checkpointing": 2}),
            ("pythia-1b", "mbs8", {"micro_batch_size": 8}),
            ("pythia-1b", "ckpt full mbs32", {"micro_batch_size": 32, "activation_checkpointing": "full"}),
        ]
    ],
    "pipeline": [  # Pythia-1B, 2 pipeline stages over 2 GPUs, each schedule
        (f"1b x{{n}} pipeline 2 {sch} mbs4x8", "pythia-1b",
         {"pipeline_stages": 2, "pipeline_schedule": sch, "micro_batch_size": 4, "pipeline_microbatches": 8},
         {"workers": "all"})
        for sch in ("gpipe", "1f1b", "interleaved_1f1b", "zero_bubble")
    ],
    "kernels": [  # Pythia-160M at the search's best (compiled, mbs 64): attention kernel and compile scope
        (f"160m compile mbs64 {name}", "pythia-160m", {"micro_batch_size": 64, "compile": True, **s}, {})
        for name, s in [
            ("model sdpa auto", {"compile_scope": "model"}),
            ("model sdpa efficient", {"compile_scope": "model", "sdpa_backend": "efficient"}),
            ("layers", {"compile_scope": "layers"}),
            ("layers sdpa flash", {"compile_scope": "layers", "sdpa_backend": "flash"}),
        ]
    ] + [("410m compile mbs32 layers", "pythia-410m", {"micro_batch_size": 32, "compile": True,
                                                        "compile_scope": "layers"}, {})],
    "loss": [  # the loss compiled on its own (loss_kernel) beside per-layer compile, at the micro-batches above
        (f"{m[7:]} compile layers mbs{mbs} loss {k}", m, {"micro_batch_size": mbs, "compile": True,
                                                      "compile_scope": "layers", "loss_kernel": k}, {})
        for m, mbs, k in [("pythia-160m", 64, "eager"), ("pythia-160m", 64, "compiled"),
                          ("pythia-410m", 32, "compiled"), ("pythia-1b", 16, "compiled")]
    ],
    # fp8 (torchao float8 linears) and loss_kernel=fused_linear (liger-kernel) against the best without them (each
    # layer and the loss compiled), on Pythia-1B and on a Llama-3.2-1B-shaped config.json (GQA, SwiGLU, 128k tied vocab)
    "fp8_lce": [
        (f"{name} mbs{mbs} {label}", model, {"micro_batch_size": mbs, "compile": True, "compile_scope": "layers",
                                             "loss_kernel": "compiled", **s}, {})
        for name, model, mbs, label, s in [
            ("pythia-1b", "pythia-1b", 16, "loss compiled", {}),
            ("pythia-1b", "pythia-1b", 16, "fused_linear", {"loss_kernel": "fused_linear"}),
            ("pythia-1b", "pythia-1b", 16, "fp8 tensorwise", {"fp8": "tensorwise"}),
            ("pythia-1b", "pythia-1b", 16, "fp8 rowwise", {"fp8": "rowwise"}),
            ("pythia-1b", "pythia-1b", 32, "fused_linear", {"loss_kernel": "fused_linear"}),
            ("llama-1b", LLAMA, 16, "loss compiled", {}),
            ("llama-1b", LLAMA, 16, "fused_linear", {"loss_kernel": "fused_linear"}),
            ("llama-1b", LLAMA, 16, "fp8 tensorwise", {"fp8": "tensorwise"}),
            ("llama-1b", LLAMA, 32, "fused_linear", {"loss_kernel": "fused_linear"}),
            ("llama-1b", LLAMA, 32, "fp8 tensorwise + fused_linear",
             {"fp8": "tensorwise", "loss_kernel": "fused_linear"}),
        ]
    ],
    # the hand-set best of the Llama-1B shape beside a search of it (bench/search_vs_handset_gpu.sh): the search's
    # recipe (global batch 256), each layer and the loss compiled, fp8 tensorwise, at the two micro-batches that fit
    "handset_llama": [
        (f"llama-1b mbs{mbs} {label}", LLAMA, {"micro_batch_size": mbs, "compile": True, "compile_scope": "layers",
                                               "loss_kernel": "compiled", **s}, {"global_batch": 256})
        for mbs, label, s in [(16, "fp8 tensorwise", {"fp8": "tensorwise"}),
                              (32, "fp8 tensorwise", {"fp8": "tensorwise"}), (16, "loss compiled", {})]
    ],
    # the hand-set best of two mixture-of-experts configs of our own (issue 27) beside a search of each: grouped_mm
    # experts (the fastest kernel, bench/data/gpu-2026-12-02-s11/moe_probe_ABC.log), each layer and the loss compiled
    # at two micro-batches, and FSDP2 (bf16 compute) at one; no fp8 (it leaves the experts bf16)
    **{f"handset_{name.split('-')[0]}": [
        (f"{name} mbs{mbs} {label}", os.path.join(MODELS, f"{name}.json"),
         {"micro_batch_size": mbs, "experts": "grouped_mm", "compile": True, "compile_scope": "layers",
          "loss_kernel": "compiled", **s}, {"global_batch": 256})
        for mbs, label, s in [(16, "layers compiled", {}), (32, "layers compiled", {}),
                              (16, "fsdp layers compiled", {"fsdp": "full_shard"})]
    ] for name in ("qwen3-moe-2b", "mixtral-1.5b")},
    "multi": [  # Pythia-1B over every GPU of the box (workers = GPU count)
        (f"1b x{{n}} {name}", "pythia-1b", s, {"workers": "all"}) for name, s in [
            ("ddp mbs8", {"micro_batch_size": 8}),
            ("zero1 mbs8", {"micro_batch_size": 8, "zero_stage": 1}),
            ("zero2 mbs8", {"micro_batch_size": 8, "zero_stage": 2}),
            ("zero3 mbs8", {"micro_batch_size": 8, "zero_stage": 3}),
            ("zero2+offload_opt mbs8", {"micro_batch_size": 8, "zero_stage": 2, "offload_optimizer": True}),
            ("zero3+offload_opt mbs8", {"micro_batch_size": 8, "zero_stage": 3, "offload_optimizer": True}),
            ("zero3+offload_opt+params mbs8", {"micro_batch_size": 8, "zero_stage": 3, "offload_optimizer": True,
                                               "offload_params": True}),
            ("fsdp full_shard mbs8", {"micro_batch_size": 8, "fsdp": "full_shard"}),
        ]
    ],
}


def run_case(case, steps, store, warmup=2):
    label, model, settings, kw = case
    kw = dict(kw)
    t = time.time()
    import torch
    n = torch.cuda.device_count()
    workers = n if kw.pop("workers", 1) == "all" else 1
    label = label.replace("{n}", str(n))
    try:
        spec = prepare(model, settings, device="cuda", workers=workers, steps=steps, warmup=warmup, **kw)
        r = execute(spec, timeout=600).to_dict()
    except Exception as e:  # noqa: BLE001 - a bad case must not end the run
        spec, r = None, {"status": "invalid", "error": str(e), "metrics": None}
    if store is not None and spec is not None:
        from trainscout.store import measurement_key
        key = measurement_key(spec, spec.hardware, hardware.versions())
        store.add_measurement(key, dict(r, key=key))
    m = r.get("metrics") or {}
    row = {"case": label, "workers": workers, "status": r["status"], "error": (r.get("error") or "")[:300],
           "tokens_per_s": m.get("tokens_per_s"), "mfu": m.get("mfu"), "step_s": m.get("step_s"),
           "measured_step_s": m.get("measured_step_s"), "spread": m.get("step_spread"),
           "peak_gib": m.get("peak_memory_gib"), "reserved_mib": (m.get("peak_reserved_mib") or [None])[0],
           "projected_days": m.get("projected_days"), "seed_method_step_s": m.get("seed_method_step_s"),
           "warmup_s": m.get("warmup_s"), "build_s": m.get("build_s"), "wall_s": round(time.time() - t, 1),
           "yardstick": YARDSTICK.get((model, settings["micro_batch_size"], settings.get("compile", False)))
           if kw.get("grad_clip") == 0.0 else None, "record": r}
    print(json.dumps({k: v for k, v in row.items() if k != "record"}), flush=True)
    return row


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--group", default="all", help=f"comma-separated: {', '.join(GROUPS)} or all")
    p.add_argument("--out", default=None, help="append JSON lines here")
    p.add_argument("--case", default=None, help="only the cases whose label contains this text")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--store", default=None, help="also keep every record in this results store (a folder)")
    p.add_argument("--parallel", type=int, default=1, help="one-GPU cases run at once (one per GPU)")
    a = p.parse_args()
    groups = a.group.split(",")
    cases = [c for g, cs in GROUPS.items() if "all" in groups or g in groups for c in cs
             if a.case is None or a.case in c[0]]
    store = None
    if a.store:
        from trainscout.store import Store, default_url
        os.makedirs(a.store, exist_ok=True)
        store = Store(default_url(a.store))
    from trainscout.trial.ray_cluster import ensure_ray
    ensure_ray()
    multi = [c for c in cases if c[3].get("workers") == "all"]
    single = [c for c in cases if c not in multi]
    rows = [run_case(c, a.steps, store, a.warmup) for c in multi]  # these take every GPU: one at a time
    with ThreadPoolExecutor(max(1, a.parallel)) as pool:
        rows += list(pool.map(lambda c: run_case(c, a.steps, store, a.warmup), single))
    if store is not None:
        store.checkpoint()
    if a.out:
        with open(a.out, "a") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
    print(f"\n{'case':48} {'status':7} {'tokens/s':>10} {'MFU':>6} {'step s':>8} {'meas s':>8} {'peak GiB':>8} "
          f"{'vs yard':>8} {'days':>6}")
    for r in rows:
        ok = r["status"] == "ok"
        ratio = f"{r['tokens_per_s'] / r['yardstick']:.3f}" if ok and r["yardstick"] else ""
        print(f"{r['case']:48} {r['status']:7} {r['tokens_per_s'] or 0:>10,.0f} {r['mfu'] or 0:>6.3f} "
              f"{r['step_s'] or 0:>8.4f} {r['measured_step_s'] or 0:>8.4f} {r['peak_gib'] or 0:>8.1f} {ratio:>8} "
              f"{r['projected_days'] or 0:>6.1f}")
    return 0 if all(r["status"] == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
