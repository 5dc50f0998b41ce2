"""The memory savers of issue 46 (item 1) on one GPU: each measured as a real trial (trainscout.trial.prepare +
execute, the trial workers' own peak and throughput) against the memory model's prediction (what `trainscout
estimate` prints: memory.predict uncalibrated, and the host's need by the search's rule).

Usage: python bench/savers_gpu.py [--model pythia-1b] [--micro-batch 8] [--steps 5]
       python bench/savers_gpu.py --model tiny          (a smoke run on the CPU: fp32, peak RSS instead of the GPU's)
Prints a markdown table: per configuration the measured peak (GPU: max_memory_allocated; CPU: the ranks' peak RSS),
the predicted peak, their ratio, the host's measured peak RSS and predicted need, and tokens/s. A configuration that
fails (OOM, crash) is a row with its status and error. Exit 1 if any trial did not finish.
"""
import argparse
import sys
import time

# each new value beside the configuration it is the alternative to
CONFIGS = [
    ("defaults", {}),
    ("activation_checkpointing=full", {"activation_checkpointing": "full"}),
    ("activation_checkpointing=selective", {"activation_checkpointing": "selective"}),
    ("activation_offload=on", {"activation_offload": "on"}),
    ("fsdp=full_shard", {"fsdp": "full_shard"}),
    ("fsdp=full_shard_offload", {"fsdp": "full_shard_offload"}),
    ("fsdp=full_shard_offload + selective", {"fsdp": "full_shard_offload", "activation_checkpointing": "selective"}),
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="pythia-1b", help="a named model or a config.json (bench/models/llama-1b.json)")
    ap.add_argument("--micro-batch", type=int, default=None, help="default: 8 on a GPU, 4 on the CPU")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--only", default="", help="comma-separated labels (substrings) of CONFIGS to run")
    a = ap.parse_args()

    from trainscout.predictor import memory
    from trainscout.trial import execute, hardware, prepare
    from trainscout.trial.ray_cluster import ensure_ray
    from trainscout.trial.runner import detect_device
    device = detect_device("auto")
    gpu = device == "cuda"
    hw = hardware.fingerprint(device, 1)
    mbs = a.micro_batch or (8 if gpu else 4)
    base = {"micro_batch_size": mbs, "precision": "bf16-mixed" if gpu else "fp32"}
    kw = {"workers": 1, "steps": a.steps, "warmup": 2, "global_batch": 2 * mbs, "measure_accum": 2, "hw": hw,
          "gate": False}
    if not gpu:
        kw.update(seq_len=64, steps=2, warmup=1)
    ensure_ray()
    rows, failed = [], 0
    for label, settings in CONFIGS:
        if a.only and not any(o.strip() in label for o in a.only.split(",")):
            continue
        spec = prepare(a.model, {**base, **settings}, **kw)
        predicted = memory.predict(spec)
        host_need = memory.host_need(memory.host_peak(spec))
        t = time.perf_counter()
        r = execute(spec, timeout=600)
        wall = time.perf_counter() - t
        m = r.metrics or {}
        peak = max(m.get("peak_allocated_mib") or [0]) * 2**20 if gpu else max(m.get("peak_rss_mib") or [0]) * 2**20
        rss = max(m.get("peak_rss_mib") or [0]) * 2**20
        if r.status != "ok":
            failed += 1
        rows.append((label, str(r.status), peak, predicted, rss, host_need, m.get("tokens_per_s"), wall,
                     (r.error or "").splitlines()[0][:80] if r.status != "ok" else ""))
        print(f"{label}: {r.status} in {wall:.0f} s", file=sys.stderr, flush=True)
    G = memory.GiB
    what = "GPU peak (max_memory_allocated)" if gpu else "peak RSS"
    print(f"\n{a.model}, one {hw.get('gpu') or 'CPU'}, micro-batch {mbs} x {spec.recipe['seq_len']} tokens, "
          f"{base['precision']}; predicted: trainscout estimate's (memory.predict, uncalibrated)\n")
    print(f"| configuration | status | measured {what} GiB | predicted GiB | measured/predicted | host peak RSS GiB "
          "| host predicted GiB | tokens/s | note |")
    print("|---|---|---|---|---|---|---|---|---|")
    for label, status, peak, pred, rss, host, tps, wall, err in rows:
        ratio = f"{peak / pred:.2f}" if peak and pred else "-"
        print(f"| {label} | {status} | {peak / G:.2f} | {pred / G:.2f} | {ratio} | {rss / G:.2f} | {host / G:.2f} | "
              f"{tps:.0f} | {err} |" if tps else
              f"| {label} | {status} | {peak / G:.2f} | {pred / G:.2f} | {ratio} | {rss / G:.2f} | {host / G:.2f} | - "
              f"| {err} |")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
