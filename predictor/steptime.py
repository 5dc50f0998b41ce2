"""Predicted time of one training step of a configuration, before anything is launched: a roofline sum per rank
that a search uses to rank candidates against each other (search/ranked.py), never to report a speed.

step_s = grad_accum x (micro-batches + pipeline bubble) x (compute + memory traffic + kernel launches)
         + optimizer_s + offload_s,
with host_s beside it, a floor under the step (host work of the engine's hooks). Communication between ranks and
fp8's scaling kernels are not modelled: such knobs rank as neither faster nor slower. The equations and the
sources of the constants: docs/predictor.md (the constants' rows: docs/constants.csv).
"""
from __future__ import annotations

import functools
import json
from typing import TYPE_CHECKING

from trainscout.trial import gpus
from . import flops, memory

if TYPE_CHECKING:
    from trainscout.trial.records import TrialSpec

# memory bandwidth per GPU kind in TB/s (the datasheets' figures of trial/gpus.py)
GPU_HBM_TBPS: dict[str, float] = {k.name: k.hbm_tbps for k in gpus.KINDS}
DEFAULT_TFLOPS, DEFAULT_TBPS = 989.0, 3.35  # an unknown GPU: the ratios between configurations are what counts
PASSES_EAGER, PASSES_COMPILED = 4, 2  # traffic over the held bytes: write + read, + an eager kernel's own pass
WEIGHT_BYTES = {4: 18.0, 2: 8.0}  # per parameter and micro-batch, by the master weights' bytes (weight_bytes)
LOGITS_BYTES = 52.0  # the logits' bytes per token and vocabulary entry where no knob declares them (an eager loss)
LAUNCH_S = 5e-6  # one kernel launch
KERNELS_EAGER, KERNELS_COMPILED = 40, 10  # per layer, forward and backward
FP32_RATE = {True: 0.5, False: 1 / 16}  # of the bf16 peak, by tf32 (the datasheet's ratios)
# host <-> device bytes/s per GPU and direction: a round effective figure for a PCIe link of Gen4
PCIE_BPS = 25e9
# the same for GPUs in Gen5 hosts, matched like GPU_HBM_TBPS (read off activation offload on one)
GPU_PCIE_BPS: dict[str, float] = {kind: 50e9 for kind in ("H100", "H100 PCIe", "H100 NVL", "H200", "H200 NVL",
                                                           "GH200", "H20", "H800", "B200", "B100")}
# a CPU optimizer's state traffic, bytes/s for the whole host (ZeRO-Offload's CPU-Adam, published)
HOST_MEMORY_BPS = 90e9
# bytes per parameter of a CPU AdamW step: fp32 weight, gradient and two moments read, weight and moments written,
# the 16-bit copy the GPU gets back
CPU_ADAM_BYTES = 30
# bytes per parameter of torch's fused AdamW step on the GPU: fp32 weight, gradient and two moments read, weight and
# moments written (the ideal: the calibration's measured/roofline ratio carries the rest)
ADAMW_BYTES = 28
# parameters/s of torch's CPU AdamW over the host's fp32 shards (FSDP2's CPUOffloadPolicy, gradient clipping
# included) for the whole host, shared by its ranks: read off one measured step
TORCH_CPU_ADAMW_PARAMS_PER_S = 1.6e8
# parameters per second of the host's optimizer step, by the engine's Engine.host_optimizer
HOST_OPTIMIZER_PARAMS_PER_S = {"deepspeed_cpu_adam": HOST_MEMORY_BPS / CPU_ADAM_BYTES,
                               "torch_adamw": TORCH_CPU_ADAMW_PARAMS_PER_S}


# The LM head's time over an aligned vocabulary's where the vocabulary is not a multiple of 8 (cuBLAS's aligned
# tensor-core tiles do not fit the logits' rows): by hidden width, then by the vocabulary's largest power-of-two
# divisor up to 8; other GPU kinds are counted as the one measured.
HEAD_UNALIGNED: dict[int, dict[int, float]] = {2048: {4: 1.86, 2: 3.45, 1: 3.45}, 4096: {4: 1.86, 2: 4.13, 1: 4.13}}


def head_alignment(vocab: int | None, hidden: int | None) -> float:
    """How many times an aligned vocabulary's time the LM head's GEMMs take at this one (HEAD_UNALIGNED; 1 for a
    multiple of 8 or an unknown size)."""
    if not vocab or not hidden or vocab % 8 == 0:
        return 1.0
    width = min(HEAD_UNALIGNED, key=lambda h: abs(h - hidden))
    return HEAD_UNALIGNED[width][4 if vocab % 4 == 0 else 2 if vocab % 2 == 0 else 1]


def _lookup(table: dict[str, float], name: str | None, default: float) -> float:
    """table's value for the kind of a GPU name (gpus.gpu_kind: exact identity), default for a name no kind."""
    return table.get(gpus.gpu_kind(name), default)


def step_s(spec: TrialSpec) -> float:
    """Predicted seconds of one optimizer step of spec per rank (what is counted: docs/predictor.md)."""
    from trainscout.trial import engines
    from trainscout.trial.models import sizes
    plan, recipe, z = spec.plan, spec.recipe, sizes(spec.model_config)
    engine = engines.get(plan.engine)
    gpu = (spec.hardware or {}).get("gpu")
    tflops = gpus.gpu_peak_tflops(gpu) or DEFAULT_TFLOPS
    if plan.precision == "fp32":
        tflops *= FP32_RATE[plan.tf32]
    tbps = _lookup(GPU_HBM_TBPS, gpu, DEFAULT_TBPS)
    tokens = plan.micro_batch_size * recipe["seq_len"]
    # the fullest rank's decoder layers (a pipeline stage's share; the head's products stay whole: the last stage)
    layers = engine.held(memory.counts(spec.model_config), plan)[1]
    # the hardware FLOPs: checkpointed layers run their forward twice
    count = flops.count(spec.model_config)
    fpt = count.hardware_per_token(recipe["seq_len"], plan.checkpoint_every, selective=flops.selective(plan))
    head = 6.0 * count.outside
    body = (fpt - head) * layers / z.layers
    align = head_alignment(spec.model_config.get("vocab_size"), spec.model_config.get("hidden_size"))
    rate, cast = linear_rate(spec)
    if rate != 1.0 and not z.experts:  # the decoder linears' share of the layers' products (not attention's)
        lw, aw = sum(count.layer_weights), sum(count.attention_width)
        share = 6.0 * lw / (6.0 * lw + 12.0 * aw * recipe["seq_len"])
        body *= 1.0 - share + share / rate
    compute = tokens * body / (tflops * 1e12) + head_s(spec, tokens, head * align / (tflops * 1e12), tbps)
    if cast and not z.experts:  # the casts into 8 bits: once more for a recomputed forward; eager: unfused, twice
        again_fwd = (-(-layers // plan.checkpoint_every) / layers) * 5 / cast if plan.checkpoint_every else 0.0
        edges = _linear_edges(json.dumps(spec.model_config, sort_keys=True, default=repr)) * layers / z.layers
        compute += tokens * edges * cast * (1.0 + again_fwd) * (1 if plan.compile else 2) / (tbps * 1e12)
    held = memory.components(spec)
    in_acts = engine.in_flight(plan, 1.0, 1.0)[0]  # what the peak holds over one micro-batch's
    passes = PASSES_COMPILED if plan.compile else PASSES_EAGER
    every = plan.checkpoint_every
    # a checkpointed layer still writes and reads its activations (in its recomputed forward, once more): the bytes
    # its forward produces move, not the input it keeps
    made = (memory.components(spec.replace(plan=plan.replace(checkpoint_every=0)))["activations"] if every else
            held["activations"]) / in_acts
    again = -(-layers // every) / layers if every else 0.0
    traffic = made * (passes + again) / (tbps * 1e12)
    traffic += weight_bytes(spec, layers / z.layers) / (tbps * 1e12)  # every micro-batch's, whatever its tokens
    launches = layers * (KERNELS_COMPILED if plan.compile else KERNELS_EAGER) * LAUNCH_S
    # a pipeline's micro_step runs its micro-batches through the rank and waits out the bubble (Engine.schedule)
    micro, idle = engine.schedule(plan)
    return plan.grad_accum * (micro + idle) * (compute + traffic + launches) + optimizer_s(spec, held, tbps) + \
        offload_s(spec)


def weight_bytes(spec: TrialSpec, share: float = 1.0) -> float:
    """Bytes the weights and their gradients move in every micro-batch, whatever its tokens (share: the fraction of
    the decoder the rank runs): the master weights' casts to 16 bits and the gradients' accumulation, by the masters'
    bytes (WEIGHT_BYTES; docs/predictor.md)."""
    from trainscout.trial.engines.base import master_bytes
    n = memory.counts(memory.with_config(spec).model_config)["N"] * share
    return n * WEIGHT_BYTES.get(master_bytes(spec.plan), WEIGHT_BYTES[4])


def host_s(spec: TrialSpec) -> float:
    """Seconds per optimizer step of host work the engine's hooks add (Engine.hook_s: a fixed part and a part per
    module holding parameters, per micro-batch: ZeRO-3's fetch and release), which the GPU's queued work hides until
    the GPU runs out of it: a floor under the step, not a term of step_s (whose GPU time the atlas calibrates to
    measured time before it compares: atlas/predict's step = max(step_s x ratio, host_s)). 0 where the engine
    declares none (or on the CPU, where the host does the compute too and the measured rows carry it)."""
    from trainscout.trial import engines
    fixed, per = engines.get(spec.plan.engine).hook_s(spec.plan)
    if not (fixed or per) or spec.device != "cuda":
        return 0.0
    modules = _param_modules(json.dumps(spec.model_config, sort_keys=True, default=repr)) if per else 0
    return spec.plan.grad_accum * (fixed + per * modules)


@functools.lru_cache(maxsize=64)
def _param_modules(key: str) -> int:
    """Modules that hold parameters of their own (the model on the meta device): what ZeRO-3's hooks fetch."""
    from .model_tree import meta_model
    model = meta_model(key, "eager", seq_len=1)
    return sum(1 for m in model.modules() if any(True for _ in m.parameters(recurse=False)))


def head_s(spec: TrialSpec, tokens: int, product_s: float, tbps: float) -> float:
    """Seconds of the LM head's products and its loss in one micro-batch of tokens (product_s: the products'
    seconds per token at the GPU's peak, the vocabulary's alignment counted): where a knob set in the plan declares
    its own (its Costs.head_s: loss_kernel=fused_linear's chunks), that; else the products and the logits' bytes
    (logits_bytes) at the GPU's memory bandwidth."""
    from trainscout.spaces import all_knobs
    from trainscout.spaces.model_config import sizes
    from trainscout.spaces.roles import Costs
    for k in all_knobs():
        if type(k.costs).head_s is Costs.head_s:
            continue
        if (got := k.costs.head_s(_value(spec.plan, k), spec, tokens, product_s, tbps * 1e12)) is not None:
            return got
    return tokens * (product_s + sizes(spec.model_config).vocab * logits_bytes(spec) / (tbps * 1e12))


def logits_bytes(spec: TrialSpec) -> float:
    """Bytes the head's logits move per token and vocabulary entry under spec's plan: the Costs.logits_bytes (by
    value) a knob set in the plan declares (loss_kernel's); the model compiled whole fuses its loss as a compiled one
    does (its "compiled" figure where the loss would run eager). LOGITS_BYTES where no knob declares one."""
    from trainscout.spaces import all_knobs
    plan = spec.plan
    for k in all_knobs():
        declared = k.costs.logits_bytes
        if declared and (value := _value(plan, k)) in declared:
            if plan.compile and plan.compile_scope == "model" and "compiled" in declared:
                return min(declared[value], declared["compiled"])
            return declared[value]
    return LOGITS_BYTES


def _value(plan, knob):
    """knob's setting in plan: its `knobs` entry, else the Plan field of its name (loss_kernel), else its default."""
    return plan.knobs.get(knob.name, getattr(plan, knob.name, knob.default))


def linear_rate(spec: TrialSpec) -> tuple[float, float]:
    """(how many times the GPU's bf16 peak a dense model's decoder linears run at, the bytes per token and element of
    their input and output widths their casts move) under spec's plan: the Costs.linear_rate and cast_bytes (by
    value) a knob set in the plan declares (fp8's FP8 tensor cores; 1 and 0: none), on a GPU."""
    from trainscout.spaces import all_knobs
    rate, cast = 1.0, 0.0
    for k in all_knobs():
        value = spec.plan.knobs.get(k.name)
        declared = k.costs.linear_rate
        if declared and value and spec.device == "cuda":
            rate *= declared.get(value, 1.0)
            cast += k.costs.cast_bytes.get(value, 0.0)
    return rate, cast


@functools.lru_cache(maxsize=64)
def _linear_edges(key: str) -> float:
    """The sum over the decoder layers' nn.Linear modules of their input and output widths (the model on the meta
    device): what a cast into FP8 moves per token, over bytes per element."""
    from torch import nn

    from trainscout.spaces.layers import decoder_layers

    from .model_tree import meta_model
    return float(sum(m.in_features + m.out_features for layer in decoder_layers(meta_model(key, "eager", seq_len=1))
                     for m in layer.modules() if isinstance(m, nn.Linear)))


def optimizer_s(spec: TrialSpec, held: dict | None = None, tbps: float | None = None) -> float:
    """Seconds of the rank's optimizer step on the GPU: the parameters it steps (its optimizer states' bytes over
    the bytes per parameter the optimizer keeps: a ZeRO or FSDP shard, a pipeline stage's, none where the states
    are offloaded) x ADAMW_BYTES at the GPU's memory bandwidth x the optimizer's step_cost (trial.engines.base
    optimizer_spec: what the knobs' optimizer hooks declare; 1: torch's fused AdamW)."""
    from trainscout.trial.engines.base import optimizer_spec
    opt = optimizer_spec(spec.plan)
    held = held if held is not None else memory.components(spec)
    if not held.get("optimizer") or not opt.bytes:
        return 0.0
    if tbps is None:
        tbps = _lookup(GPU_HBM_TBPS, (spec.hardware or {}).get("gpu"), DEFAULT_TBPS)
    return held["optimizer"] / opt.bytes * ADAMW_BYTES * opt.step_cost / (tbps * 1e12)


def pcie_bps(spec: TrialSpec) -> float:
    """The host <-> GPU bandwidth per direction of spec's GPU (PCIE_BPS where GPU_PCIE_BPS names it not)."""
    return _lookup(GPU_PCIE_BPS, (spec.hardware or {}).get("gpu"), PCIE_BPS)


def offload_s(spec: TrialSpec) -> float:
    """Seconds per optimizer step a rank spends on what its engine or its knobs keep in host memory (0: nothing):
    offloaded optimizer states (gradient shards down every micro-batch, the host's optimizer step, the updated
    shard back), offloaded parameter shards (fetched for every forward and backward) and what the knobs' memory
    hooks moved to the host, as PCIe bytes at pcie_bps with no overlap assumed (docs/predictor.md)."""
    from trainscout.trial import engines
    plan = spec.plan
    engine = engines.get(plan.engine)
    optimizer, params = engine.offloaded(plan)
    accum = plan.grad_accum
    pcie = accum * 2 * memory.host_held(spec) if spec.device == "cuda" else 0.0
    host = 0.0
    if optimizer or params:
        n = memory.counts(memory.with_config(spec).model_config)["N"]
        shard = n / engine.data_ranks(plan, spec.world_size)
        pcie += accum * 2 * shard  # the gradient shards down, every micro-batch
        if optimizer:
            host = n / HOST_OPTIMIZER_PARAMS_PER_S[engine.host_optimizer]
            if not params:
                pcie += 2 * shard  # the updated 16-bit shard back
        if params:
            passes = 2 + (1 if plan.checkpoint_every else 0)  # forward, backward, the recomputed forward
            pcie += accum * passes * 2 * shard
    return pcie / pcie_bps(spec) + host
