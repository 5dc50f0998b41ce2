"""Where a training step's GPU time goes (issue 7: why an MFU target is out of reach).

Builds a Pythia model the way ../shared/bench/gpu_baseline.py does (plain transformers, bf16 autocast, SDPA,
fused AdamW), runs warm-up steps, times 3 steps with CUDA events, then profiles one step with torch.profiler and
groups the GPU kernels: matrix products, attention, loss (softmax / cross-entropy over the vocabulary), layer norm,
optimizer, fused (Triton, from torch.compile), other element-wise. "MFU if only GEMMs ran" is the measured MFU
divided by the share of matrix products and attention: the ceiling left when all else took no time.

    python bench/profile_gpu.py --case pythia-160m:32 --case pythia-1b:16 --case pythia-160m:64:compile
    python bench/profile_gpu.py --device cpu --case pythia-14m:2 --seq 128    # smoke test without a GPU
"""
import argparse
import re
import sys
import time

import torch
from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

SIZES = {"pythia-14m": (128, 6, 4), "pythia-160m": (768, 12, 12), "pythia-410m": (1024, 24, 16),
         "pythia-1b": (2048, 16, 8)}
GROUPS = [  # first match wins
    ("attention", r"flash|fmha|attention|sdpa|attn"),
    ("fused (triton)", r"^triton|triton_"),
    ("gemm", r"gemm|cutlass|nvjet|xmma|cublas|matmul|\bmm\b|addmm|bmm|sm90_|sm100_"),
    ("loss", r"softmax|nll|cross_entropy|logsumexp"),
    ("layer_norm", r"layer_norm|layernorm"),
    ("optimizer", r"adam|multi_tensor|foreach"),
]


def build(name: str, seq: int) -> GPTNeoXForCausalLM:
    d, L, h = SIZES[name]
    cfg = GPTNeoXConfig(hidden_size=d, num_hidden_layers=L, num_attention_heads=h, intermediate_size=4 * d,
                        vocab_size=50304, max_position_embeddings=seq, rotary_pct=0.25, use_parallel_residual=True,
                        tie_word_embeddings=False, attn_implementation="sdpa")
    return GPTNeoXForCausalLM(cfg)


def group(name: str) -> str:
    low = name.lower()
    return next((g for g, pat in GROUPS if re.search(pat, low)), "other element-wise")


def run(case: str, device: str, seq: int, peak: float) -> dict:
    name, mbs, *rest = case.split(":")
    mbs, compiled = int(mbs), "compile" in rest
    torch.manual_seed(0)
    dev = torch.device(device)
    model = build(name, seq).to(dev)
    n = sum(p.numel() for p in model.parameters())
    d, L, _ = SIZES[name]
    flops_per_step = (6 * n + 12 * L * d * seq) * mbs * seq
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=dev.type == "cuda")
    fwd = torch.compile(model) if compiled else model
    x = torch.randint(0, 50304, (mbs, seq), device=dev)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)

    def step():
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            loss = fwd(input_ids=x, labels=x).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(3):
        step()
    sync()
    t = time.perf_counter()
    for _ in range(3):
        step()
    sync()
    step_s = (time.perf_counter() - t) / 3
    acts = [torch.profiler.ProfilerActivity.CPU]
    acts += [torch.profiler.ProfilerActivity.CUDA] if dev.type == "cuda" else []
    with torch.profiler.profile(activities=acts) as prof:
        step()
        sync()
    kind = "cuda" if dev.type == "cuda" else "cpu"
    times: dict[str, float] = {}
    top: dict[str, float] = {}
    for e in prof.key_averages():
        if kind == "cuda" and "CUDA" not in str(getattr(e, "device_type", "")):
            continue
        us = getattr(e, "self_device_time_total", None) if kind == "cuda" else e.self_cpu_time_total
        if us is None:
            us = getattr(e, "self_cuda_time_total", 0)
        times[group(e.key)] = times.get(group(e.key), 0.0) + us / 1e6
        top[e.key[:60]] = top.get(e.key[:60], 0.0) + us / 1e6
    busy = sum(times.values())
    mfu = flops_per_step / step_s / peak
    row = {"case": case, "step_s": step_s, "tokens_per_s": mbs * seq / step_s, "mfu": mfu, "kernel_s": busy,
           "shares": {g: s / busy for g, s in sorted(times.items(), key=lambda kv: -kv[1])}}
    gemm = times.get("gemm", 0.0)
    products = gemm + times.get("attention", 0.0)
    row["mfu_if_only_gemm"] = mfu * step_s / products if products else float("nan")
    row["gemm_tflops"] = 6 * n * mbs * seq / gemm / 1e12 if gemm else float("nan")  # 6N: the products' share
    print(case, {k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items() if k != "shares"},
          {g: f"{s:.1%}" for g, s in row["shares"].items()}, flush=True)
    for k, s in sorted(top.items(), key=lambda kv: -kv[1])[:8]:
        print(f"    {s / busy:6.1%}  [{group(k)}] {k}", flush=True)
    model = fwd = opt = None  # their memory back before empty_cache (not del: step reads fwd and opt)
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--case", action="append", help="MODEL:MICRO_BATCH[:compile] (repeatable)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--peak-tflops", type=float, default=989.0, help="dense bf16 peak of the GPU (H200: 989)")
    a = p.parse_args(argv)
    for c in a.case or []:
        if c.split(":")[0] not in SIZES or len(c.split(":")) < 2 or not c.split(":")[1].isdigit():
            print(f"error: --case {c!r}: want MODEL:MICRO_BATCH[:compile], MODEL one of {sorted(SIZES)}",
                  file=sys.stderr)
            return 2
    rows = [run(c, a.device, a.seq, a.peak_tflops * 1e12) for c in a.case or ["pythia-160m:32"]]
    groups = [g for g, _ in GROUPS] + ["other element-wise"]
    print("\n| case | step s | tokens/s | MFU | MFU if only GEMMs + attention ran | GEMM TFLOP/s | "
          + " | ".join(groups) + " |")
    print("|---" * (6 + len(groups)) + "|")
    for r in rows:
        print(f"| {r['case']} | {r['step_s']:.4f} | {r['tokens_per_s']:,.0f} | {r['mfu']:.3f} | "
              f"{r['mfu_if_only_gemm']:.3f} | {r['gemm_tflops']:.0f} | "
              + " | ".join(f"{r['shares'].get(g, 0):.1%}" for g in groups) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
