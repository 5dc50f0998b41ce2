"""Predicted peak GPU memory per rank of a configuration, before anything is launched.

The analytic part counts bytes the way the engines hold them (N parameters, D data-parallel ranks, P pipeline
stages; b micro-batch, s sequence, h hidden, L layers, V vocabulary), mixed precision with fp32 weights:
- model states: plain/DDP/pipeline 4N weights + 4N gradients + 8N AdamW states + 2N autocast weight copies
  (+ 4N DDP buckets on several ranks); FSDP2 (4+4+8)N/D + bf16 copies of two layers; DeepSpeed ZeRO-s: 2N bf16
  weights (stage 3: 2N/D + the live gathered layers), 2N bf16 gradients (stages 2-3: 2N/D), (4+8)N/D fp32
  master and AdamW states unless offloaded to the CPU, and a reduce bucket of min(N, 5e8) elements;
- activations of one micro-batch: 34·s·b·h bytes per layer (Korthikanti et al. 2022 with a fused attention
  kernel: no s² term), only the 4·s·b·h layer input for a checkpointed layer plus one layer recomputed in backward;
  a pipeline rank holds the activations of its layers for every micro-batch in flight (GPipe: all of them, and
  the last stage all their logits; 1F1B: the stage count; interleaved: one more; zero-bubble: stages - 1 more
  again, for the deferred weight gradients — fitted to the 2-stage Pythia-1B measurements, not derived);
- logits: 10·b·s·V bytes at the start of backward (fp32 log-softmax output and its gradient, bf16 logits' grad);
  8·b·s·V fewer with loss_kernel=compiled, which keeps no fp32 copy (measured on the H200: Pythia-160M per-layer
  compile at micro-batch 64 peaked 119.8 GiB with the loss eager, 70.7 GiB compiled; 49.1 GiB = 8.0·b·s·V).
A calibration fitted on measured peaks of the same GPU (least squares: peak = a·states + b·activations + c)
absorbs what the counts miss (allocator rounding, workspace, temporaries); with fewer than 3 measurements the
analytic sum is used with a 1 GiB allowance for workspaces.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

from .status import Status

if TYPE_CHECKING:
    from .records import Record, TrialSpec

GiB = 2**30


def _counts(config: dict) -> dict:
    from .models import sizes
    z = sizes(config)  # through transformers: GPT-2 and BLOOM spell the sizes n_layer, n_embd, n_head
    h, L, V, inter, tied = z.hidden, z.layers, z.vocab, z.intermediate, z.tied
    per_layer = 4 * h * h + 2 * h * inter + 9 * h + inter  # qkv + out + mlp weights and biases, 2 layer norms
    embed = V * h
    return {"h": h, "L": L, "V": V, "per_layer": per_layer, "embed": embed,
            "N": L * per_layer + embed * (1 if tied else 2) + 2 * h}


def components(spec: TrialSpec | Record) -> dict[str, float]:
    """Bytes per rank by component for a prepared trial spec or a stored record (the rank that holds the most):
    the engine's model states, then one micro-batch's activations and logits (which knobs adjust) scaled to what
    is in flight. The knobs' memory hooks read the spec by key: they get its to_dict()."""
    from trainscout.spaces import all_knobs

    from . import engines
    if spec.model_config is None:  # a stored record of a named model
        from .models import resolve_model
        spec = spec.replace(model_config=resolve_model(spec.model).config)
    c, plan, recipe = _counts(spec.model_config), spec.plan, spec.recipe
    engine = engines.get(plan["engine"])
    mixed = plan["precision"] != "fp32"
    N, layers = engine.held(c, plan)
    out = engine.model_states(c, plan, N, engine.data_ranks(plan, spec.world_size), mixed)
    b, s, h, V = plan["micro_batch_size"], recipe["seq_len"], c["h"], c["V"]
    every = plan.get("checkpoint_every", 0)
    ckpt = math.ceil(layers / every) if every else 0
    act_bytes = 34 if mixed else 60  # fp32 activations hold every tensor in 4 bytes
    terms = {"activations": (layers - ckpt) * act_bytes * s * b * h + ckpt * 4 * s * b * h
                            + (act_bytes * s * b * h if ckpt else 0),
             "logits": (10 if mixed else 12) * b * s * V}
    view = spec.to_dict()
    for knob in all_knobs():
        knob.memory(terms, plan, view)
    out["activations"], out["logits"] = engine.in_flight(plan, terms["activations"], terms["logits"])
    return out


def analytic(spec: TrialSpec | Record) -> float:
    """The analytic sum of components(): bytes per rank, uncalibrated and without predict's 1 GiB allowance."""
    return sum(components(spec).values())


def _features(spec: TrialSpec | Record) -> tuple[float, float]:
    comp = components(spec)
    return (comp["weights"] + comp["gradients"] + comp["optimizer"] + comp["buffers"],
            comp["activations"] + comp["logits"])


def fit(pairs: list[tuple[TrialSpec | Record, float]]) -> dict | None:
    """Calibrate on (spec, measured peak bytes) pairs of one GPU: peak = a·states + b·activations + c."""
    if len(pairs) < 3:
        return None
    import numpy as np
    X = np.array([[*(f / GiB for f in _features(sp)), 1.0] for sp, _ in pairs])
    y = np.array([peak / GiB for _, peak in pairs])
    coef, *_ = np.linalg.lstsq(X, y, rcond=None)
    a, b, c = (float(v) for v in coef)
    if a <= 0 or b <= 0:  # too few distinct configurations to separate the terms: scale the analytic sum instead
        k = float(np.median(y / X[:, :2].sum(axis=1)))
        a, b, c = k, k, 0.0
    return {"a": a, "b": b, "c": c * GiB, "n": len(pairs)}


def predict(spec: TrialSpec | Record, calibration: dict | None = None) -> float:
    """Predicted peak allocated bytes per rank (what torch.cuda.max_memory_allocated reports)."""
    states, acts = _features(spec)
    if not calibration:
        return states + acts + 1.0 * GiB
    return calibration["a"] * states + calibration["b"] * acts + calibration["c"]


def calibration_pairs(records: list[Record], gpu: str | None) -> list[tuple[Record, float]]:
    """(record, measured peak) from stored ok records of a GPU (the record carries what the spec needs)."""
    pairs = []
    for r in records:
        m = r.m
        if r.status != Status.OK or r.device != "cuda" or not m.get("peak_allocated_mib"):
            continue
        if gpu and m.get("gpu") != gpu:
            continue
        pairs.append((r, max(m["peak_allocated_mib"]) * 2**20))
    return pairs


HOST_PROCESS = 1.5 * GiB  # a rank's process before its model: Python, torch, transformers, Ray's worker
OFFLOAD_BYTES = 18  # host bytes per offloaded parameter under DeepSpeed's CPU optimizer (see host_peak)


def host_peak(spec: TrialSpec | Record) -> dict[str, float]:
    """Predicted peak host (CPU) memory of a whole trial, all ranks together (they share the host), by component.

    On the CPU every rank's training state lives there: the analytic sum per rank. On a GPU: each rank's process,
    then the larger of the model build (each rank builds its fp32 model on the host before moving it, unless its
    engine builds it on the GPU: Engine.builds_on_device) and what
    ZeRO offload keeps there: 18 bytes per offloaded parameter for the optimizer (fp32 master weights, gradients
    and AdamW states, 16 B, plus DeepSpeed's pinned 16-bit buffers; fitted to the one measurement there is:
    Pythia-6.9B ZeRO-2 + optimizer offload on one H200 was killed for host memory at 120.7 of 125 GB, issue 18),
    2 bytes per offloaded 16-bit parameter shard."""
    from . import engines
    world = spec.world_size
    if spec.device == "cpu":
        return {"processes": world * HOST_PROCESS, "ranks": world * analytic(spec)}
    if spec.model_config is None:
        from .models import resolve_model
        spec = spec.replace(model_config=resolve_model(spec.model).config)
    c, plan = _counts(spec.model_config), spec.plan
    engine = engines.get(plan["engine"])
    N, D = c["N"], engine.data_ranks(plan, world)
    zero = plan.get("zero") or {}
    offload = world * ((OFFLOAD_BYTES * N / D if "offload_optimizer" in zero else 0)
                       + (2 * N / D if "offload_param" in zero else 0))
    out = {"processes": world * HOST_PROCESS}
    if not engine.builds_on_device:
        out["build"] = world * 4 * N
    if offload:
        out["offload"] = offload
    return out


def host_refusal(spec: TrialSpec | Record, capacity: float, margin: float = 0.10) -> str | None:
    """Why a trial would not fit the host's memory (None: it fits): the predicted peak against the capacity less a
    margin for the OS and the driver."""
    comp = host_peak(spec)
    need = comp["processes"] + max((v for k, v in comp.items() if k != "processes"), default=0.0)
    if need <= capacity * (1 - margin):
        return None
    return (f"predicted {need / GiB:.1f} GiB of host memory for the trial's {spec.world_size} rank(s) > "
            f"{capacity / GiB:.0f} GiB less {margin:.0%} (" + ", ".join(f"{k} {v / GiB:.1f}" for k, v in comp.items())
            + " GiB)")


def parse_size(text: str) -> float:
    """'80GiB', '80GB', '141 GiB', '8e10' -> bytes."""
    t = str(text).strip().lower().replace(" ", "")
    for unit, mult in (("gib", GiB), ("gb", 1e9), ("mib", 2**20), ("mb", 1e6), ("g", GiB)):
        if t.endswith(unit):
            return float(t[: -len(unit)]) * mult
    return float(t)
