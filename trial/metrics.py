"""MFU (with the GPU kinds' peaks of trial/gpus.py), and the projection of a full training run.

FLOPs per token are counted from the model's modules (predictor/flops.py, convention flops.CONVENTION). The dense
count of the first records, 6·N over every parameter (embeddings included) + 12·L·d·s (PaLM appendix B, the
yardstick's ../shared/bench/gpu_baseline.py and the seed paper's), stays here as dense_flops_per_token, to compare
with them and to label the figures stored under it.
"""
from __future__ import annotations


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
