"""The memory model against measured peaks: for every successful GPU measurement in the given stores, the
analytic prediction and the calibrated one (leave-one-out: fitted on all other measurements of that GPU, never
on the row itself), the measured peak (torch.cuda.max_memory_allocated, the fullest rank), and their errors.

Usage: python bench/memory_error.py STORE_DIR [STORE_DIR ...]   (no GPU needed: it reads stored measurements)
"""
import argparse
import sys

from trainscout.analysis.table import store_of
from trainscout.predictor import memory


def label(r) -> str:
    c = r.config
    parts = [r.model.replace("pythia-", ""), f"x{r.world_size}"]
    if c.get("zero_stage"):
        parts.append(f"zero{c['zero_stage']}")
    for k, short in (("offload_optimizer", "off_opt"), ("offload_params", "off_par")):
        if c.get(k):
            parts.append(short)
    if c.get("fsdp", "off") != "off":
        parts.append(f"fsdp-{c['fsdp']}")
    if c.get("pipeline_stages", 1) > 1:
        parts.append(f"pp{c['pipeline_stages']}-{c['pipeline_schedule']}-m{c['pipeline_microbatches']}")
    if c.get("activation_checkpointing", "none") != "none":
        parts.append(f"ckpt-{c['activation_checkpointing']}")
    if c.get("compile"):  # what else changes the peak: compile (its scope), the loss kernel, attention, fp8
        parts.append(f"compile-{c.get('compile_scope', 'model')}")
    if c.get("loss_kernel", "eager") != "eager":
        parts.append(f"loss-{c['loss_kernel']}")
    for k in ("attention", "precision", "fp8"):
        if c.get(k, getattr(r.plan, k, None)) not in (None, "sdpa", "bf16-mixed", "off"):
            parts.append(f"{k}-{c[k]}")
    parts.append(f"mbs{r.plan.micro_batch_size}")  # the micro-batch run ("max" resolved)
    return " ".join(parts)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("stores", nargs="+")
    a = p.parse_args()
    records = [r for s in a.stores for r in store_of(s).measurements()]
    pairs = memory.calibration_pairs(records, None)
    if not pairs:
        print("no successful GPU measurement with a peak in these stores")
        return 1
    rows = []
    for i, (rec, peak) in enumerate(pairs):
        others = [q for j, q in enumerate(pairs) if j != i and q[0].metrics.get("gpu") == rec.metrics.get("gpu")]
        cal = memory.fit(others)
        ana, loo = memory.predict(rec), memory.predict(rec, cal)
        rows.append((label(rec), peak, ana, loo))
    rows.sort()
    print(f"{'configuration':64} {'measured':>9} {'analytic':>9} {'err':>7} {'calibr.':>9} {'err':>7}   (GiB per rank)")
    for name, peak, ana, loo in rows:
        print(f"{name:64} {peak / memory.GiB:9.2f} {ana / memory.GiB:9.2f} {100 * (ana / peak - 1):+6.1f}% "
              f"{loo / memory.GiB:9.2f} {100 * (loo / peak - 1):+6.1f}%")
    for what, idx in (("analytic", 2), ("calibrated (leave-one-out)", 3)):
        errs = sorted(abs(r[idx] / r[1] - 1) for r in rows)
        med = errs[len(errs) // 2] if len(errs) % 2 else 0.5 * (errs[len(errs) // 2 - 1] + errs[len(errs) // 2])
        worst = max(rows, key=lambda r: abs(r[idx] / r[1] - 1))
        print(f"{what}: n={len(rows)}  median |error| {100 * med:.1f} %  worst "
              f"{100 * (worst[idx] / worst[1] - 1):+.1f} % ({worst[0]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
