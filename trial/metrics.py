"""MFU, peak rates of common GPUs, and the projection of a full training run.

FLOPs per token are counted from the model's modules (trial/flops.py, convention flops.CONVENTION). The dense
count of the first records, 6·N over every parameter (embeddings included) + 12·L·d·s (PaLM appendix B, the
yardstick's ../shared/bench/gpu_baseline.py and the seed paper's), stays here as dense_flops_per_token, to compare
with them and to label the figures stored under it.
"""
from __future__ import annotations

# Dense bf16 tensor-core peak per GPU in TFLOP/s (vendor datasheets, without sparsity). Matched against
# torch.cuda.get_device_name() in order: the first substring found wins. Unknown GPU -> None (MFU null).
GPU_BF16_TFLOPS: list[tuple[str, float]] = [
    ("GH200", 989.0), ("H200", 989.0), ("H100 PCIe", 756.0), ("H100 NVL", 835.0), ("H100", 989.0), ("H800", 989.0),
    ("B200", 2250.0), ("B100", 1750.0), ("A100", 312.0), ("A800", 312.0), ("L40S", 362.0), ("L40", 181.0),
    ("L4", 121.0), ("A10G", 70.0), ("A10", 125.0), ("A6000", 155.0), ("RTX 6000 Ada", 364.0),
    ("RTX 4090", 165.0), ("RTX 3090", 71.0), ("V100", 125.0),  # V100 has no bf16: fp16 tensor-core peak
]


def gpu_peak_tflops(device_name: str | None) -> float | None:
    """Dense bf16 peak TFLOP/s of a GPU by device name (first GPU_BF16_TFLOPS substring found); None if unknown."""
    if not device_name:
        return None
    for key, tflops in GPU_BF16_TFLOPS:
        if key.lower() in device_name.lower():
            return tflops
    return None


def dense_flops_per_token(n_params: int, num_layers: int, hidden: int, seq_len: int) -> float:
    """The dense count (flops.OLD): 6·N over every parameter + 12·L·d·s, forward and backward. Not MFU's count any
    more (it counts embedding lookups as products and every expert of a mixture): for the yardstick's and the seed
    paper's figures, which use it."""
    return 6.0 * n_params + 12.0 * num_layers * hidden * seq_len


def mfu(tokens_per_s: float, fpt: float, peak_tflops: float | None, n_gpus: int) -> float | None:
    """FLOPs utilisation as a fraction: tokens/s × FLOPs per token over the n_gpus' combined peak; None when the
    peak is unknown or tokens/s is 0 (MFU with flops.Count.per_token, HFU with its hardware_per_token)."""
    if not peak_tflops or not tokens_per_s:
        return None
    return tokens_per_s * fpt / (peak_tflops * 1e12 * n_gpus)


def median(xs: list[float]) -> float:
    """The median of xs (the mean of the middle two for an even count); xs must not be empty."""
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def project_step(micro_non_last: list[float], micro_last: list[float], optim: list[float], grad_accum: int) -> float:
    """A full optimizer step from measured phases: (A-1) accumulating micro-batches, the last one (which
    carries the gradient synchronisation) and the optimizer. Medians, so one slow step does not skew it."""
    if grad_accum > 1 and not micro_non_last:
        raise ValueError("a step with accumulation needs at least one measured non-last micro-batch")
    rest = (grad_accum - 1) * median(micro_non_last) if grad_accum > 1 else 0.0
    return rest + median(micro_last) + median(optim)
