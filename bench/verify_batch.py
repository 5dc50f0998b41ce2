"""verify --global-batch: the projection at another global batch, as verify now derives it (the record's per-step
phases at A' micro-batches, metrics.project_at) against the earlier one (step_s + (A' - A) x the median micro-batch),
each against full steps measured at that batch; and a third with the mean accumulating micro-batch in place of the
median (a full step sums its micro-batches: stalls a median leaves out count there).

Measures one configuration at the recipe's batch (A micro-batches per full step, measured_accum of them timed), then
verifies it at --global-batch (A' micro-batches, every one timed) and prints both projections and measured/projected.
The earlier formula mixes two medians (step_s: over each step's own projection; the micro-batch: over every step's)
and multiplies their difference by A - A'.

CPU (a tiny model; this box's load is noise):
  python bench/verify_batch.py --model tiny --device cpu --set precision=fp32 --global-batch 256 --micro-batch 2 \
      --verify-batch 16 --repeat 3
H200 (the issue's case: full checkpointing, eager attention, FSDP full_shard on one GPU, verified at 64):
  python bench/verify_batch.py --model pythia-160m --device cuda --set activation_checkpointing=full \
      --set attention=eager --set fsdp=full_shard --micro-batch 8 --verify-batch 64 --steps 5 --verify-steps 20
"""
import argparse
import json
import tempfile

from trainscout.analysis.verify import verify
from trainscout.store import Store, default_url
from trainscout.trial import run_trial

p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
p.add_argument("--model", default="tiny")
p.add_argument("--device", default="cpu")
p.add_argument("--set", action="append", default=[], metavar="KNOB=VALUE")
p.add_argument("--global-batch", type=int, default=None, help="the measurement's recipe batch (default: the model's)")
p.add_argument("--micro-batch", type=int, default=2)
p.add_argument("--verify-batch", type=int, default=16)
p.add_argument("--steps", type=int, default=5, help="timed steps of the measurement")
p.add_argument("--verify-steps", type=int, default=10, help="full steps of the verification")
p.add_argument("--repeat", type=int, default=1, help="measure and verify this many times")
a = p.parse_args()
settings = dict(kv.split("=", 1) for kv in a.set)
settings["micro_batch_size"] = a.micro_batch
rows = []
for i in range(a.repeat):
    d = tempfile.mkdtemp(prefix="verify-batch-")
    rec = run_trial(a.model, settings, device=a.device, steps=a.steps, warmup=2, global_batch=a.global_batch)
    assert rec.ok, rec.error
    rec.key = f"{i:032d}"
    store = Store(default_url(d))
    store.put(rec.key, rec)
    m, A = rec.metrics, rec.grad_accum
    A2 = A * a.verify_batch // rec.recipe["global_batch"]
    old = m["step_s"] + (A2 - A) * m["micro_batch_s"]
    mean = (A2 - 1) * m["micro_batch_mean_s"] + m["last_micro_batch_s"] + m["optimizer_s"]  # stalls counted
    r = verify(d, steps=a.verify_steps, global_batch=a.verify_batch)
    assert r["status"] == "ok", r["error"]
    row = {"A": A, "A_verify": A2, "measured_s": r["measured_step_s"], "projected_now_s": r["projected_step_s"],
           "ratio_now": r["measured_step_s"] / r["projected_step_s"], "projected_before_s": old,
           "ratio_before": r["measured_step_s"] / old, "projected_mean_s": mean,
           "ratio_mean": r["measured_step_s"] / mean, "verify_spread": r["spread"]}
    rows.append(row)
    print(json.dumps(row), flush=True)
for k in ("ratio_now", "ratio_before", "ratio_mean"):
    xs = [r[k] for r in rows]
    print(f"{k}: {', '.join(f'{x:.3f}' for x in xs)}; worst |1 - ratio| {max(abs(1 - x) for x in xs):.3f}")
