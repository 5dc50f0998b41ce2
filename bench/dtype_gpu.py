"""Measured as labelled, on the GPU: a Hub config.json's "torch_dtype" must not change what a bf16-mixed trial runs.

Cases (each one `trainscout trial` process, its record's tokens/s, peak and the dtypes its optimizer stepped):
  qwen-hub     bench/models/hub/qwen2.5-1.5b.json as published ("torch_dtype": "bfloat16"), compile layers, loss
               compiled, micro-batch 4 (the hand-set of issue 45)
  qwen-nodtype the same config without the key
  mistral-7b   bench/models/hub/mistral-7b-v0.3.json as published, at one setting that fits the GPU (an H200:
               plain + full checkpointing; an H100: ZeRO-2 + optimizer offload + full checkpointing), against
               `trainscout estimate`'s prediction for the same setting

    python bench/dtype_gpu.py [--out DIR] [--only qwen|mistral]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HUB = os.path.join(ROOT, "bench", "models", "hub")
QWEN = ["--set", "compile=true", "--set", "compile_scope=layers", "--set", "loss_kernel=compiled",
        "--set", "micro_batch_size=4", "--set", "precision=bf16-mixed", "--set", "fp8=off"]


def gpu_memory_gib() -> float:
    import torch
    return torch.cuda.get_device_properties(0).total_memory / 2**30


def trial(model: str, flags: list[str], steps: int, warmup: int, timeout: int) -> dict:
    cmd = ["trainscout", "trial", "--model", model, "--device", "cuda", "--steps", str(steps), "--warmup", str(warmup),
           "--timeout", str(timeout), "--json", *flags]
    t = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout + 120)
    try:
        r = json.loads(p.stdout)
    except ValueError:
        r = {"status": "no-json", "error": (p.stderr or "")[-2000:]}
    r["wall"] = time.time() - t
    return r


def estimate(model: str, flags: list[str]) -> dict:
    p = subprocess.run(["trainscout", "estimate", "--model", model, "--json", *flags], capture_output=True, text=True)
    try:
        return json.loads(p.stdout)
    except ValueError:
        return {"error": (p.stderr or "")[-1000:]}


def row(name: str, r: dict, est: float | None = None) -> str:
    m = r.get("metrics") or {}
    peak = m.get("peak_memory_gib")
    d = m.get("dtypes") or {}
    cells = [name, str(r.get("status")), f"{m['tokens_per_s']:,.0f}" if m.get("tokens_per_s") else "-",
             f"{peak:.2f}" if peak else "-", f"{est:.2f}" if est else "-",
             f"{peak / est:.3f}" if peak and est else "-",
             "/".join(d.get(k, "-") for k in ("weights", "gradients", "optimizer")) if d else "-",
             f"{r['wall']:.0f}", (r.get("error") or "")[:160].replace("\n", " ")]
    return "| " + " | ".join(cells) + " |"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--only", choices=("qwen", "mistral", "gate"))
    a = ap.parse_args()
    import torch
    name, mem = torch.cuda.get_device_name(0), gpu_memory_gib()
    print(f"GPU: {name}, {mem:.1f} GiB", flush=True)
    rows, raw = [], {}
    if a.only in (None, "qwen"):
        with open(os.path.join(HUB, "qwen2.5-1.5b.json")) as f:
            cfg = json.load(f)
        tmp = tempfile.mkdtemp()
        plain = os.path.join(tmp, "qwen2.5-1.5b-nodtype.json")
        with open(plain, "w") as f:
            json.dump({k: v for k, v in cfg.items() if k != "torch_dtype"}, f)
        for case, model in (("qwen-hub", os.path.join(HUB, "qwen2.5-1.5b.json")), ("qwen-nodtype", plain),
                            ("qwen-hub (again)", os.path.join(HUB, "qwen2.5-1.5b.json"))):
            r = trial(model, QWEN, steps=4, warmup=2, timeout=420)
            raw[case] = r
            rows.append(row(case, r))
            print(rows[-1], flush=True)
    if a.only in (None, "mistral"):
        model = os.path.join(HUB, "mistral-7b-v0.3.json")
        if mem > 120:  # fp32 masters + AdamW (108 GiB) + bf16 casts fit an H200
            base = ["--set", "precision=bf16-mixed"]
        else:  # nothing with fp32 masters fits an H100 and 128 GiB of host (ZeRO-2 offload: killed at 121 GiB of host
            base = ["--set", "precision=bf16"]  # memory): pure bf16 weights and states, stochastic rounding (8 B/param)
        flags = base + ["--set", "activation_checkpointing=full", "--set", "micro_batch_size=1", "--set",
                        "compile=false"]
        shape = ["--global-batch", "8", "--seq-len", "2048"]
        est = estimate(model, flags + shape + ["--gpu", name])
        r = trial(model, flags + shape + ["--measure-accum", "2"], steps=2, warmup=1, timeout=560)
        raw["mistral-7b"], raw["mistral-7b estimate"] = r, est
        rows.append(row("mistral-7b " + " ".join(flags[1::2]), r, est.get("predicted_gib")))
        print(rows[-1], flush=True)
        if True:  # the 7B at speed: compiled layers and loss, the largest micro-batch that fits
            fast = base + ["--set", "activation_checkpointing=full", "--set", "micro_batch_size=max",
                           "--set", "compile=true", "--set", "compile_scope=layers", "--set", "loss_kernel=compiled"]
            r = trial(model, fast + ["--measure-accum", "2"], steps=3, warmup=2, timeout=400)
            raw["mistral-7b fast"] = r
            rows.append(row("mistral-7b " + " ".join(fast[1::2]), r))
            print(rows[-1], flush=True)
    if a.only in (None, "gate"):  # the gate's gradient margins on the GPU (measured on the CPU only before)
        gates = {"llama-1b fp8 tensorwise": ("llama-1b.json", ["--set", "fp8=tensorwise"]),
                 "llama-1b fp8 rowwise": ("llama-1b.json", ["--set", "fp8=rowwise"]),
                 "mixtral-1.5b fsdp full_shard": ("mixtral-1.5b.json", ["--set", "fsdp=full_shard"])}
        for case, (cfg, extra) in gates.items():
            r = trial(os.path.join(ROOT, "bench", "models", cfg),
                      ["--set", "compile=false", "--set", "micro_batch_size=4", "--global-batch", "8", *extra],
                      steps=2, warmup=1, timeout=300)
            q = (r.get("metrics") or {}).get("quality") or {}
            raw[case] = r
            rows.append(row(case, r) + f" gate {q.get('gate')}: layer gain {q.get('layer_grad_gain')} at "
                        f"{q.get('layer_grad_gain_at')}, parameter gain {q.get('grad_gain')} at "
                        f"{q.get('grad_gain_tensor')}, "
                        f"op SQNR {q.get('op_sqnr_db')} dB; {(q.get('why') or '')[:200]}")
            print(rows[-1], flush=True)
    print(f"\nGPU: {name}\n| case | status | tokens/s | peak GiB | estimate GiB | peak/estimate | dtypes (w/g/opt) | "
          "wall s | error |\n|---|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    with open(os.path.join(a.out, "dtype_gpu.json"), "w") as f:
        json.dump({"gpu": name, "gpu_memory_gib": mem, "cases": raw}, f, indent=1, default=str)


if __name__ == "__main__":
    sys.exit(main())
