"""The one place the atlas, lookup and the contribution checks read a measurement's MFU.

Recomputed from the measured tokens/s and the model's own parameter count (trial/model_tree.py, on the meta
device), never taken from the record: a record's figure may be wrong (DeepSpeed ZeRO-3 partitions its parameters,
and the early trials counted those: Pythia-410M ZeRO-3 recorded MFU 0.040 for 65,894 tokens/s, 0.20 recomputed)
or forged (a contribution). The FLOP count is trial/metrics.py's (6N + 12·L·d·s per token); issue 27 replaces it
by FLOPs from the model's modules (trainscout.trial.flops.recount): switch `mfu` to it, and CONVENTION to its
name, then rebuild the shipped set (python bench/build_atlas.py).
"""
from __future__ import annotations

from trainscout.trial.records import Record

CONVENTION = "dense_v0: 6N + 12·L·d·s FLOPs per token (N every parameter, embeddings included), bf16 dense peak"


def mfu(record: Record) -> float | None:
    """MFU of an ok GPU record under CONVENTION, recomputed; None where the GPU's peak or the model is unknown."""
    from trainscout.trial import memory, metrics
    from trainscout.trial.models import sizes
    m, hw = record.m, record.hardware or {}
    tokens, recipe = m.get("tokens_per_s"), record.recipe or {}
    peak = metrics.gpu_peak_tflops(hw.get("gpu") or m.get("gpu"))
    if not record.ok or not tokens or not peak or not recipe.get("seq_len") or record.device != "cuda":
        return None
    spec = memory._with_config(record)
    z = sizes(spec.model_config)
    n = memory._counts(spec.model_config)["N"]
    fpt = metrics.flops_per_token(n, z.layers, z.hidden, recipe["seq_len"])
    return metrics.mfu(tokens, fpt, peak, record.world_size or 1)
