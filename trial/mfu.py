"""The one place the atlas, lookup and the contribution checks (store/contrib.py) read a measurement's MFU.

Recomputed from the measured tokens/s, the model's own modules (trainscout.predictor.flops, CONVENTION: matrix products
only, the input embedding not counted, a mixture of experts at its routed share) and the GPU's peak from
trial/gpus.py's table, never from the record's own figures: a record's MFU, FLOPs per token or peak may be wrong
(DeepSpeed ZeRO-3 partitions its parameters, which a count from the live model misses: docs/trial.md) or forged (a
contribution that claims the current convention with a figure of its own).
"""
from __future__ import annotations

from trainscout.predictor import flops
from .records import Record, TOKENS_PER_S

CONVENTION = (f"{flops.CONVENTION}: matrix-product FLOPs from the model's modules (the input embedding not counted, "
              "experts at top_k), against the GPU's bf16 dense peak")
# what a record's metrics may claim about its own FLOPs: dropped before recounting
CLAIMED = ("flops_convention", "flops_per_token", "hardware_flops_per_token", "active_params", "mfu", "hfu",
           "peak_tflops", "flops_note")


def mfu(record: Record) -> float | None:
    """MFU of an ok GPU record under CONVENTION, recounted (predictor.flops.recount); None where the GPU's peak or the
    model is unknown."""
    from . import gpus
    m, hw = record.m, record.hardware or {}
    peak = gpus.gpu_peak_tflops(hw.get("gpu") or m.get("gpu"))
    if not record.ok or not m.get(TOKENS_PER_S) or not peak or record.device != "cuda":
        return None
    clean = {k: v for k, v in m.items() if k not in CLAIMED and not k.endswith("_dense_v0")}
    fresh = flops.recount(record.replace(metrics={**clean, "peak_tflops": peak}))
    return fresh.m.get("mfu") if fresh.m.get("flops_convention") == flops.CONVENTION else None
