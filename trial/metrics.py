"""MFU, peak rates, memory and capability of common GPUs, and the projection of a full training run.

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


# GPU memory (GiB, as torch reports it) and compute capability, from datasheets: what a prediction for a GPU kind
# never measured assumes; a measured kind uses its records' own figures. Matched like GPU_BF16_TFLOPS.
GPUS: list[tuple[str, float, str]] = [
    ("GH200", 94.5, "9.0"), ("H200", 139.8, "9.0"), ("H100 NVL", 87.5, "9.0"), ("H100", 79.1, "9.0"),
    ("H800", 79.1, "9.0"), ("B200", 178.4, "10.0"), ("B100", 178.4, "10.0"), ("A100-SXM4-40GB", 39.4, "8.0"),
    ("A100 40GB", 39.4, "8.0"), ("A100", 79.1, "8.0"), ("A800", 79.1, "8.0"), ("L40S", 44.4, "8.9"),
    ("L40", 44.4, "8.9"), ("L4", 22.0, "8.9"), ("A10G", 22.0, "8.6"), ("A10", 22.0, "8.6"),
    ("RTX 6000 Ada", 47.5, "8.9"), ("A6000", 47.5, "8.6"), ("RTX 4090", 23.6, "8.9"), ("RTX 3090", 23.6, "8.6"),
    ("V100", 31.7, "7.0"),
]


def gpu_kind(name: str | None) -> str | None:
    """The kind of a GPU name ("NVIDIA H200" -> "H200"): the first GPUS entry found in it, case-insensitive."""
    for key, _, _ in GPUS:
        if name and key.lower() in name.lower():
            return key
    return None


def gpu_facts(name: str) -> tuple[float, str] | None:
    """(memory GiB, capability) of a GPU kind from GPUS; None for one not listed."""
    kind = gpu_kind(name)
    return next(((mem, cap) for key, mem, cap in GPUS if key == kind), None)


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


def phases(ranks_steps: list[list[dict]]) -> list[list[list[float]]]:
    """Each rank's timed steps as [median accumulating micro-batch, last micro-batch, optimizer] (a record keeps
    them: project_at re-derives the step at another accumulation exactly as the record's step was derived)."""
    return [[[median(st["micro"][:-1]) if len(st["micro"]) > 1 else 0.0, st["micro"][-1], st["optim"]]
             for st in steps] for steps in ranks_steps]


def project_at(phase: list[list[list[float]]], grad_accum: int) -> float:
    """The projected full step at `grad_accum` micro-batches from a record's phases: per step the slowest rank's
    (A-1) x its median accumulating micro-batch + its last + its optimizer step, then the median over the steps
    (runner.derive's step_s, at another A)."""
    per_rank = [[(grad_accum - 1) * nl + last + opt if grad_accum > 1 else last + opt for nl, last, opt in steps]
                for steps in phase]
    return median([max(col) for col in zip(*per_rank)])
