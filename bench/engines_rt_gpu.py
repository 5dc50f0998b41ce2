"""Refactor check on the GPU: each engine after the runtime refactor, with the new knobs where they apply."""
import json
from trainscout.trial import execute, prepare
from trainscout.trial.ray_cluster import ensure_ray
ensure_ray()
CASES = [("160m zero1 compile(model) mbs16", {"zero_stage": 1, "compile": True, "micro_batch_size": 16}),
         ("160m fsdp shard_grad_op compile layers + fused_linear + fp8", {"fsdp": "shard_grad_op", "compile": True,
          "loss_kernel": "fused_linear", "fp8": "tensorwise", "micro_batch_size": 32}),
         ("160m zero2 fused_linear mbs16", {"zero_stage": 2, "loss_kernel": "fused_linear", "micro_batch_size": 16})]
for label, s in CASES:
    r = execute(prepare("pythia-160m", s, device="cuda", steps=3, warmup=2), timeout=300)
    m = r.m
    print(json.dumps({"case": label, "status": str(r.status), "error": (r.error or "")[:300],
                      "tokens_per_s": m.get("tokens_per_s"), "mfu": m.get("mfu"), "peak_gib": m.get("peak_memory_gib"),
                      "wall_s": r.wall_s}), flush=True)
