"""Predicted time of one training step of a configuration, before anything is launched: a roofline sum per rank
that a search uses to rank candidates against each other (search/ranked.py), never to report a speed.

Per micro-batch of b·s tokens, summed over the step's micro-batches (the plan's grad_accum):
- compute: the FLOPs of its tokens with one forward again for each checkpointed layer (flops.Count's
  hardware_per_token: MFU's count, a mixture of experts' active parameters), at the GPU's dense bf16 peak (the LM
  head's at a measured fraction of it where the vocabulary is not a multiple of 8: HEAD_UNALIGNED)
  (gpus.KINDS); a dense model's decoder linears at `linear_rate` times it where a knob set in the plan
  declares one (fp8: an FP8 GPU's dense FP8 peak is twice its bf16 one; the head and attention's products stay); fp32 at half of it with tf32 and 1/16 without (H100 datasheet: 495 dense tf32, 67 fp32, against 989 bf16 TFLOP/s);
- memory traffic, at the GPU's memory bandwidth (GPU_HBM_TBPS): the activations the memory model holds for it
  (memory.components, which the knobs adjust), written once and read once, and read and written once more by eager
  elementwise kernels that compiled layers fuse; a checkpointed layer's activations as if it kept them, once more
  for its recomputed forward; the logits' bytes per token and vocabulary entry that the loss's kernel declares
  (logits_bytes: loss_kernel's, measured: eager 52, compiled 9.4), or the head as the knob runs it (head_s: liger's
  chunks); the weights' and gradients' bytes of every micro-batch (weight_bytes: casts and accumulation);
- launches: a few dozen kernels per layer, forward and backward, of LAUNCH_S each; compiled layers launch fewer;
- not in step_s but beside it, a host floor (host_s): where the engine's hooks run host work per micro-batch and
  per module (ZeRO-3's parameter fetches), a step is never shorter than that host work (the atlas compares it with
  the calibrated GPU time);
- offload (offload_s, per optimizer step, not overlapped with the GPU's work): what an engine keeps in host memory
  (Engine.offloaded) moves over the GPU's PCIe link at pcie_bps, and the CPU's optimizer steps its parameters at
  its engine's host optimizer's rate (HOST_OPTIMIZER_PARAMS_PER_S), which all the box's ranks share; what the knobs' hooks keep on the host
  (memory.host_held: activation offload's saved tensors) goes down in every micro-batch's forward and comes back in
  its backward.
- the optimizer step (optimizer_s, once per step): torch's fused AdamW over fp32 weights, gradients and states moves
  ADAMW_BYTES per parameter the rank steps (its share of the optimizer states: memory.components) at the GPU's
  memory bandwidth, times the step's measured cost against that fused step where a knob changes the optimizer (its
  `optimizer` hook's "step_cost": optimizer_impl=foreach, torchao's states, precision=bf16's AdamW; declared in the
  knob's file from bench/optimizer_gpu.py); an optimizer on the host is offload_s';
- a pipeline (Engine.schedule): the fullest rank, the last stage (its share of the decoder layers and the whole
  head), runs each micro_step's micro-batches and idles for the schedule's bubble (spaces/knobs/pipeline.py
  BUBBLE: stages - 1 micro-batch slots for GPipe and 1F1B, fewer interleaved); the activations between stages cross
  NVLink in a negligible time (4 x 2048 x 2048 bf16: 34 MB, well under a millisecond).
Its constants are round first-principles figures, not fitted (but for two host-side rates read off one H100
measurement each: PCIe's and torch's CPU AdamW's): only the order it puts configurations in is used,
and measured trials outrank it. Not modelled, so such knobs rank as neither faster nor slower: communication
between ranks (ZeRO, FSDP and DDP on several GPUs), fp8's scaling kernels.
"""
from __future__ import annotations

import functools
import json
from typing import TYPE_CHECKING

from . import flops, gpus, memory, metrics

if TYPE_CHECKING:
    from .records import TrialSpec

# Memory bandwidth per GPU kind in TB/s (the datasheets' figures of trial/gpus.py).
GPU_HBM_TBPS: dict[str, float] = {k.name: k.hbm_tbps for k in gpus.KINDS}
DEFAULT_TFLOPS, DEFAULT_TBPS = 989.0, 3.35  # an unknown GPU: the ratios between configurations are what counts
PASSES_EAGER, PASSES_COMPILED = 4, 2  # traffic over the held bytes: write + read, + an eager kernel's own pass
WEIGHT_BYTES = {4: 18.0, 2: 8.0}  # per parameter and micro-batch, by the master weights' bytes (weight_bytes)
LOGITS_BYTES = 52.0  # the logits' bytes per token and vocabulary entry where no knob declares them (an eager loss)
LAUNCH_S = 5e-6  # one kernel launch
KERNELS_EAGER, KERNELS_COMPILED = 40, 10  # per layer, forward and backward
FP32_RATE = {True: 0.5, False: 1 / 16}  # of the bf16 peak, by tf32
# Host <-> device over PCIe, bytes/s per GPU and direction: an x16 link of Gen4 is 32 GB/s on paper, Gen5 64; about
# 25 GB/s is what pinned copies of Gen4 reach (and what a Gen5 GPU behind a Gen4 host gets): a round effective figure.
PCIE_BPS = 25e9
# Gen5 GPUs in Gen5 hosts, matched like GPU_HBM_TBPS: activation offload on an H100 SXM moved 2 x 22.0 GB a
# micro-batch in 0.83 s more than without it (53 GB/s, bench/data/gpu-2026-12-06-s23/probe_act.log); the other
# Hoppers and the Blackwells are counted as it, unmeasured.
GPU_PCIE_BPS: dict[str, float] = {kind: 50e9 for kind in ("H100", "H100 PCIe", "H100 NVL", "H200", "H200 NVL",
                                                           "GH200", "H20", "H800", "B200", "B100")}
# The CPU optimizer's state traffic, bytes/s for the whole host: ZeRO-Offload's CPU-Adam stepped 8 B parameters in
# 2.4 s on a two-socket Xeon (Ren et al. 2021, table 4), ~3.3e9 parameters/s at CPU_ADAM_BYTES each: ~90 GB/s.
HOST_MEMORY_BPS = 90e9
# per parameter of a CPU AdamW step: fp32 weight, gradient, two moments read (16 B), weight and moments written
# (12 B) and the 16-bit copy the GPU gets back (2 B)
CPU_ADAM_BYTES = 30
# per parameter of torch's fused AdamW step on the GPU over fp32 weights, gradients and two moments: 16 B read, 12 B
# written (the ideal: the H100 measured 15.35 ms for Pythia-1B's 1.012e9 parameters, 1.8x these 8.5 ms; the
# calibration's measured/roofline ratio carries such factors, as it does the compute's)
ADAMW_BYTES = 28
# FSDP2's CPUOffloadPolicy steps torch's own AdamW (fused CPU kernel) over the fp32 shards on the host, with the
# gradient clipping over the host's DTensors before it: far slower than DeepSpeedCPUAdam. From the measured row
# (bench/data/gpu-2026-12-06-s22/savers_h100.log, one H100 SXM with 16 host cores, Pythia-1B 1.012e9 parameters,
# 2 micro-batches of 8 x 2048 a step): 4,764 tokens/s is 32,768 / 4,764 = 6.88 s a step; this model's other terms
# for it are 0.28 s on the GPU and 0.24 s over PCIe, leaving 6.35 s for the host's step: 1.012e9 / 6.35 = 1.6e8
# parameters/s for the whole host (shared by its ranks, as HOST_MEMORY_BPS). A fresh process's step was ~4.9 s
# (bench/data/gpu-2026-12-06-s23/probe_fsdp.log, steps 1-3: ~4.4 s on the host), the trial's warm worker slower.
# One measurement, one host: no per-core scaling is claimed (torch's fused CPU AdamW stepped 25M parameters in
# 0.12 s on 2 cores, trial/engines/fsdp.py: 2e8/s, so the H100 host's 16 cores did not buy 8x).
TORCH_CPU_ADAMW_PARAMS_PER_S = 1.6e8
# parameters per second of the host's optimizer step, by the engine's Engine.host_optimizer
HOST_OPTIMIZER_PARAMS_PER_S = {"deepspeed_cpu_adam": HOST_MEMORY_BPS / CPU_ADAM_BYTES,
                               "torch_adamw": TORCH_CPU_ADAMW_PARAMS_PER_S}


# The LM head's GEMMs at a vocabulary that is not a multiple of 8: cuBLAS cannot use its aligned tensor-core tiles for
# the logits' rows. Time of the head's forward and backward (its three GEMMs and the fp32 cross-entropy) per FLOP,
# against an aligned vocabulary's, bf16, 16,384 tokens, one NVIDIA H100 SXM (python bench/atlas_gaps_gpu.py --parts A,
# bench/data/gpu-2026-12-06-s25/gaps_h100.log): hidden 2048: 49,155 3.45x and 49,156 1.86x the time of 49,152
# (49,160 and 49,216: 1.0x); hidden 4096: 50,257 4.15x against 50,304, 32,001 4.11x against 32,000. By the
# vocabulary's largest power-of-two divisor up to 8 (2, unmeasured, is counted as odd), per hidden width (the nearest
# measured one); other GPUs are counted as the H100, unmeasured.
HEAD_UNALIGNED: dict[int, dict[int, float]] = {2048: {4: 1.86, 2: 3.45, 1: 3.45}, 4096: {4: 1.86, 2: 4.13, 1: 4.13}}


def head_alignment(vocab: int | None, hidden: int | None) -> float:
    """How many times an aligned vocabulary's time the LM head's GEMMs take at this one (HEAD_UNALIGNED; 1.0 for a
    multiple of 8 or an unknown size)."""
    if not vocab or not hidden or vocab % 8 == 0:
        return 1.0
    width = min(HEAD_UNALIGNED, key=lambda h: abs(h - hidden))
    return HEAD_UNALIGNED[width][4 if vocab % 4 == 0 else 2 if vocab % 2 == 0 else 1]


def _lookup(table: dict[str, float], name: str | None, default: float) -> float:
    """table's value for the kind of a GPU name (gpus.gpu_kind: exact identity), default for a name no kind."""
    return table.get(gpus.gpu_kind(name), default)


def step_s(spec: TrialSpec) -> float:
    """Predicted seconds of one optimizer step of spec per rank (see the module docstring for what is counted)."""
    from . import engines
    from .models import sizes
    plan, recipe, z = spec.plan, spec.recipe, sizes(spec.model_config)
    engine = engines.get(plan.engine)
    gpu = (spec.hardware or {}).get("gpu")
    tflops = metrics.gpu_peak_tflops(gpu) or DEFAULT_TFLOPS
    if plan.precision == "fp32":
        tflops *= FP32_RATE[plan.tf32]
    tbps = _lookup(GPU_HBM_TBPS, gpu, DEFAULT_TBPS)
    tokens = plan.micro_batch_size * recipe["seq_len"]
    # the fullest rank's decoder layers (a pipeline stage's share; the head's products stay whole: the last stage)
    layers = engine.held(memory._counts(spec.model_config), plan)[1]
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
    the decoder the rank runs): fp32 master weights (bf16-mixed) are cast to 16 bits for the forward (4 read, 2
    written) and their 16-bit gradients written, read and added into fp32 ones (2 + 2, 4 + 4): WEIGHT_BYTES[4]; 16-bit
    masters (precision=bf16) only their gradients accumulated (2 written, then 2 + 2 read and 2 written):
    WEIGHT_BYTES[2]. A micro-batch of few tokens pays it per token most (a 3B model at micro-batch 2)."""
    from .engines.base import master_bytes
    n = memory._counts(memory._with_config(spec).model_config)["N"] * share
    return n * WEIGHT_BYTES.get(master_bytes(spec.plan), WEIGHT_BYTES[4])


def host_s(spec: TrialSpec) -> float:
    """Seconds per optimizer step of host work the engine's hooks add (Engine.hook_s: a fixed part and a part per
    module holding parameters, per micro-batch: ZeRO-3's fetch and release), which the GPU's queued work hides until
    the GPU runs out of it: a floor under the step, not a term of step_s (whose GPU time the atlas calibrates to
    measured time before it compares: atlas/predict's step = max(step_s x ratio, host_s)). 0.0 where the engine
    declares none (or on the CPU, where the host does the compute too and the measured rows carry it)."""
    from . import engines
    fixed, per = engines.get(spec.plan.engine).hook_s(spec.plan)
    if not (fixed or per) or spec.device != "cuda":
        return 0.0
    modules = _param_modules(json.dumps(spec.model_config, sort_keys=True, default=repr)) if per else 0
    return spec.plan.grad_accum * (fixed + per * modules)


@functools.lru_cache(maxsize=64)
def _param_modules(key: str) -> int:
    """Modules that hold parameters of their own (the model on the meta device): what ZeRO-3's hooks fetch."""
    from .model_tree import _build
    return sum(1 for m in _build(key, "eager", seq_len=1).modules() if any(True for _ in m.parameters(recurse=False)))


def head_s(spec: TrialSpec, tokens: int, product_s: float, tbps: float) -> float:
    """Seconds of the LM head's products and its loss in one micro-batch of tokens (product_s: the products'
    seconds per token at the GPU's peak, the vocabulary's alignment counted): where a knob set in the plan declares
    its own (`head_s`: loss_kernel=fused_linear's chunks), that; else the products and the logits' bytes
    (logits_bytes) at the GPU's memory bandwidth."""
    from trainscout.spaces import all_knobs
    from trainscout.spaces.model_config import sizes
    for k in all_knobs():
        own = getattr(k, "head_s", None)
        if own is not None and (got := own(_value(spec.plan, k), spec, tokens, product_s, tbps * 1e12)) is not None:
            return got
    return tokens * (product_s + sizes(spec.model_config).vocab * logits_bytes(spec) / (tbps * 1e12))


def logits_bytes(spec: TrialSpec) -> float:
    """Bytes the head's logits move per token and vocabulary entry under spec's plan: the `logits_bytes` (by value) a
    knob set in the plan declares (loss_kernel's); the model compiled whole fuses its loss as a compiled one does
    (its "compiled" figure where the loss would run eager). LOGITS_BYTES where no knob declares one."""
    from trainscout.spaces import all_knobs
    plan = spec.plan
    for k in all_knobs():
        declared = getattr(k, "logits_bytes", None)
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
    their input and output widths their casts move) under spec's plan: the `linear_rate` and `cast_bytes` (by value)
    a knob set in the plan declares (fp8's FP8 tensor cores; 1.0 and 0: none), on a GPU."""
    from trainscout.spaces import all_knobs
    rate, cast = 1.0, 0.0
    for k in all_knobs():
        value = spec.plan.knobs.get(k.name)
        declared = getattr(k, "linear_rate", None)
        if declared and value and spec.device == "cuda":
            rate *= declared.get(value, 1.0) if isinstance(declared, dict) else declared
            cast += (getattr(k, "cast_bytes", None) or {}).get(value, 0.0)
    return rate, cast


@functools.lru_cache(maxsize=64)
def _linear_edges(key: str) -> float:
    """The sum over the decoder layers' nn.Linear modules of their input and output widths (the model on the meta
    device): what a cast into FP8 moves per token, over bytes per element."""
    from torch import nn

    from trainscout.spaces.layers import decoder_layers

    from .model_tree import _build
    return float(sum(m.in_features + m.out_features for layer in decoder_layers(_build(key, "eager", seq_len=1))
                     for m in layer.modules() if isinstance(m, nn.Linear)))


def optimizer_s(spec: TrialSpec, held: dict | None = None, tbps: float | None = None) -> float:
    """Seconds of the rank's optimizer step on the GPU: the parameters it steps (its optimizer states' bytes over
    the bytes per parameter the optimizer keeps: a ZeRO or FSDP shard, a pipeline stage's, none where the states
    are offloaded) x ADAMW_BYTES at the GPU's memory bandwidth x the optimizer's "step_cost" (trial.engines.base
    optimizer_spec: what the knobs' optimizer hooks declare; 1.0: torch's fused AdamW)."""
    from .engines.base import optimizer_spec
    opt = optimizer_spec(spec.plan)
    held = held if held is not None else memory.components(spec)
    if not held.get("optimizer") or not opt.get("bytes"):
        return 0.0
    if tbps is None:
        tbps = _lookup(GPU_HBM_TBPS, (spec.hardware or {}).get("gpu"), DEFAULT_TBPS)
    return held["optimizer"] / opt["bytes"] * ADAMW_BYTES * opt.get("step_cost", 1.0) / (tbps * 1e12)


def pcie_bps(spec: TrialSpec) -> float:
    """The host <-> GPU bandwidth per direction of spec's GPU (PCIE_BPS where GPU_PCIE_BPS names it not)."""
    return _lookup(GPU_PCIE_BPS, (spec.hardware or {}).get("gpu"), PCIE_BPS)


def offload_s(spec: TrialSpec) -> float:
    """Seconds per optimizer step a rank spends on what its engine or its knobs keep in host memory (0: nothing):
    - optimizer states offloaded (ZeRO-Offload, FSDP2's CPUOffloadPolicy): every micro-batch's reduced 16-bit
      gradient shard goes to the host, where the engine accumulates it (2·N/D bytes each); the CPU steps AdamW over
      the states of every rank's shard (N in all on the host, at the rate of the engine's host_optimizer shared by
      the ranks: DeepSpeedCPUAdam's CPU_ADAM_BYTES per parameter at HOST_MEMORY_BPS, torch's CPU AdamW at
      TORCH_CPU_ADAMW_PARAMS_PER_S); the updated 16-bit shard comes back (2·N/D, unless the parameters live on the
      host too);
    - parameter shards offloaded (ZeRO-3): each is fetched as 16 bits (2·N/D) for every forward and backward of
      every micro-batch, and once more per checkpointed forward recomputed;
    - what the knobs' memory hooks moved to the host (memory.host_held: activation offload's saved tensors): down
      as the forward saves it and up as the backward reads it, every micro-batch (save_on_cpu copies on the compute
      stream: nothing overlaps).
    PCIe bytes at pcie_bps, no overlap with compute assumed (an upper bound on what offload costs a step)."""
    from . import engines
    plan = spec.plan
    engine = engines.get(plan.engine)
    optimizer, params = engine.offloaded(plan)
    accum = plan.grad_accum
    pcie = accum * 2 * memory.host_held(spec) if spec.device == "cuda" else 0.0
    host = 0.0
    if optimizer or params:
        n = memory._counts(memory._with_config(spec).model_config)["N"]
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
