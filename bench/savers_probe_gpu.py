"""Where the memory of two savers goes on one GPU, phase by phase (issue 46's terms, session 23): standalone (torch and
transformers only, no trainscout import) so it runs on a device machine's own Python.

  python bench/savers_probe_gpu.py fsdp     FSDP2 CPUOffloadPolicy as trial/engines/fsdp.py builds and steps it: the
                                            host's RSS (VmRSS, VmHWM) and the pinned host allocator's bytes after each
                                            phase (build on the GPU, model.to(cpu), fully_shard, each micro-batch, step)
  python bench/savers_probe_gpu.py seq [empty]
                                            act, then fsdp in the same process after what trial/worker.reset_process
                                            does between trials (gc, empty_cache, malloc_trim), with "empty" also the
                                            pinned host allocator's cache emptied: what a warm trial worker carries
  python bench/savers_probe_gpu.py act      activation offload (save_on_cpu around each decoder layer, as
                                            spaces/knobs/activation_offload.py) against none under autocast: the GPU's
                                            peak, what is allocated after the forward, and the step's seconds

Pythia-1B (GPT-NeoX), micro-batch 8 x 2048, two micro-batches a step, bf16, as bench/savers_gpu.py measured it.
Prints one JSON line per phase.
"""
import json
import os
import sys
import time

import torch

GiB = 2**30
CFG = dict(hidden_size=2048, num_hidden_layers=16, num_attention_heads=8, intermediate_size=8192, vocab_size=50304,
           max_position_embeddings=2048, rotary_pct=0.25, use_parallel_residual=True, tie_word_embeddings=False)
B, S, ACCUM = 8, 2048, 2


def status() -> dict:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                out[line.split(":")[0]] = round(int(line.split()[1]) / 2**20, 2)  # GiB
    try:
        hs = torch.cuda.host_memory_stats()
        out["pinned_GiB"] = round(hs.get("allocated_bytes.current", hs.get("allocated_bytes", 0)) / GiB, 2) \
            if isinstance(hs, dict) else None
        out["pinned_reserved_GiB"] = round(hs.get("reserved_bytes.current", 0) / GiB, 2)
    except Exception as e:  # noqa: BLE001 - an older torch without host_memory_stats
        out["pinned_GiB"] = f"n/a ({type(e).__name__})"
    out["gpu_alloc_GiB"] = round(torch.cuda.memory_allocated() / GiB, 2)
    out["gpu_peak_GiB"] = round(torch.cuda.max_memory_allocated() / GiB, 2)
    return out


def log(phase, **kw):
    print(json.dumps({"phase": phase, **status(), **kw}), flush=True)


def build():
    from transformers import AutoModelForCausalLM, GPTNeoXConfig
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(GPTNeoXConfig(**CFG), attn_implementation="sdpa",
                                                 dtype=torch.float32)
    model.config.use_cache = False
    model.train()
    return model


def fsdp():
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29531")
    dist.init_process_group("nccl", rank=0, world_size=1)
    torch.cuda.set_device(0)
    with open("/proc/self/clear_refs", "w") as f:  # the worker's reset of VmHWM before the build
        f.write("5")
    log("start")
    model = build()
    n = sum(p.numel() for p in model.parameters())
    log("built on the GPU", N=n)
    model.to(torch.device("cpu"))
    log("model.to(cpu)")
    mesh = init_device_mesh("cuda", (1,))
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model.gpt_neox.layers:
        fully_shard(layer, mesh=mesh, mp_policy=mp, offload_policy=CPUOffloadPolicy(pin_memory=True))
    fully_shard(model, mesh=mesh, mp_policy=mp, offload_policy=CPUOffloadPolicy(pin_memory=True))
    log("fully_shard")
    params = [p for p in model.parameters()]
    opt = torch.optim.AdamW(params, lr=1e-4, fused=True)
    log("optimizer made")
    batch = torch.randint(0, CFG["vocab_size"], (B, S), device="cuda")
    for step in range(4):
        t = time.perf_counter()
        for i in range(ACCUM):
            model.set_requires_gradient_sync(True)
            loss = model(input_ids=batch, labels=batch).loss / ACCUM
            loss.backward()
            log(f"step {step} micro-batch {i}")
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        log(f"step {step} optimizer", step_s=round(time.perf_counter() - t, 3))


def act():
    model = build()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    batch = torch.randint(0, CFG["vocab_size"], (B, S), device="cuda")
    handles = []

    def run(label, steps=3):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        times = []
        for step in range(steps):
            t = time.perf_counter()
            for i in range(ACCUM):
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = model(input_ids=batch, labels=batch).loss / ACCUM
                after_forward = torch.cuda.memory_allocated()
                loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t)
        log(label, after_forward_GiB=round(after_forward / GiB, 2), step_s=[round(x, 3) for x in times],
            tokens_per_s=round(ACCUM * B * S / min(times)))

    run("defaults")
    for layer in model.gpt_neox.layers:  # as spaces/knobs/activation_offload.offload_saved_tensors
        open_ = []

        def enter(mod, args, kwargs, open_=open_):
            ctx = torch.autograd.graph.save_on_cpu(pin_memory=True)
            ctx.__enter__()
            open_.append(ctx)

        def leave(mod, args, kwargs, out, open_=open_):
            open_.pop().__exit__(None, None, None)
        handles += [layer.register_forward_pre_hook(enter, with_kwargs=True),
                    layer.register_forward_hook(leave, with_kwargs=True, always_call=True)]
    run("activation_offload=on")


def empty_host_cache() -> str:
    """The pinned host allocator's cached blocks back to the OS; the name of the call that did it."""
    for name in ("empty_host_cache",):
        if hasattr(torch.accelerator, name):
            getattr(torch.accelerator, name)()
            return f"torch.accelerator.{name}"
    for name in ("_accelerator_emptyHostCache", "_host_emptyCache", "_cuda_hostEmptyCache"):
        if hasattr(torch._C, name):
            getattr(torch._C, name)()
            return f"torch._C.{name}"
    return "none found"


def seq(empty: bool):
    import ctypes
    import gc
    act()
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    log("after act, as reset_process leaves it")
    if empty:
        log("host cache emptied", by=empty_host_cache())
    fsdp()


if __name__ == "__main__":
    if sys.argv[1] == "seq":
        seq(len(sys.argv) > 2 and sys.argv[2] == "empty")
    else:
        {"fsdp": fsdp, "act": act}[sys.argv[1]]()
