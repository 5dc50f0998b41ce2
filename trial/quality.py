"""The quality gate: does a configuration whose knobs change the numerics (Knob.numerics: FP8 products, another
precision, an approximate kernel, 16-bit compute without autocast) train the same model as its reference, the same
configuration with those knobs at their reference values?

One step, where it is cheap: after a trial's timed steps, in the same process (rank 0), the reference and the
candidate are built from the same seed (the same weights) and take one forward and backward on the same batch.
The verdict, as torchao gates its float8 linears (a signal-to-noise ratio above 20 dB): every linear's output in the
candidate's forward against what the reference's op (bf16 autocast) computes from the same input, the worst
SQNR = 10·log10(|y_ref|² / |y_ref - y|²) over the linears must be >= THRESHOLD_DB, and the loss must be within
LOSS_TOLERANCE of the reference's. Neither sees what the step changes (a knob that zeroes, freezes or halves the
gradients leaves every output and the loss as they were), so the gradients are compared too: per decoder layer and per
parameter, the candidate's gradient's gain along the reference's, <g, g_ref> / |g_ref|², must be within LAYER_GAIN
and PARAM_GAIN of 1 (the reason names the layer or parameter and its ratio); a parameter the reference moves and the
candidate does not (frozen) fails. The gradients' SQNR is recorded beside it, not gated: a whole model's gradients at
initialisation carry every op's error through every layer, so a fixed line on them would be a line on depth
(measured on the H200, one step: fp8 tensorwise 16.2 dB on Pythia-1B and 6.5 dB on the Llama-1B shape, with the loss
within 0.01 %; docs/BENCHMARKS.md), while noise that large leaves the gain at 1. Gradients, not the optimizer's
update: AdamW's first update is about lr·sign(g), blind to a gradient's scale. 20 dB is an op's error a tenth of its output's amplitude: bf16
keeps 8 mantissa bits (~48 dB a rounding), e4m3 FP8 3 (~25 dB), a one-bit rounding fails it (tests/test_quality.py).
A step at initialisation cannot show what many steps do (FP8 rowwise passed it and failed a 30-step convergence
check on a 128k-vocabulary model): `trainscout verify --quality STEPS` trains both on real text
(analysis/quality.py) and its verdict ("verified" or "failed") outranks this one ("passed" or "failed").

The candidate runs its knobs' model transforms of the stages that change numbers (process settings, module swaps,
the loss), a changed knob's transform at any stage and its wrap_step around the step, and its engine's compute (autocast over fp32 weights, or 16-bit weights without autocast as FSDP2's
param_dtype and DeepSpeed's bf16 model compute), on one rank: an engine's sharding, checkpointing and compile are
left out, as they change no numbers beyond rounding order (a transform's torch.compile runs eager there: graphs for
the gate's batch would be compiled for its one step alone, no timed step runs them).
"""
from __future__ import annotations

import hashlib
import json
import math
import time

THRESHOLD_DB = 20.0
LOSS_TOLERANCE = 0.01  # relative to the reference's loss
# What the step changes: the candidate's gradient projected on the reference's, gain = <g, g_ref> / |g_ref|^2, is 1
# for the same gradient plus rounding noise of any size (the noise is not aligned with the gradient), 0.5 for a
# halved one, 0 for one zeroed or frozen. Measured on this CPU box (one step, batch 2, against bf16 autocast; tiny at
# 64 tokens, Pythia-14M and 8-layer Llama (GQA, tied) and 4-layer Mixtral (8 experts) shapes at 256, Pythia-70M at
# 128), the worst |gain - 1| of any decoder layer (its parameters together; an embedding, head or final norm on its
# own): fp32 0.004, FSDP2's and DeepSpeed's bf16 compute 0.004, fp8 tensorwise 0.022 and rowwise 0.014 (Mixtral
# layers); of any single parameter: fp32 0.038, 16-bit compute 0.057 (a NeoX layer norm bias), fp8 tensorwise 0.065
# and rowwise 0.149 (Mixtral's routers, whose gradients' SQNR is 5-8 dB; the H200 saw 1.8 dB on one with FSDP2), while
# their norm ratios reached 1.22 and their cosines 0.85. A layer's gain outside 1 +- LAYER_GAIN (4.5x the worst
# measured) or a parameter's outside 1 +- PARAM_GAIN (3x the worst, 1 away from frozen) fails the gate; rescaling
# by 0.9 passes it, by 0.5 or 2 fails. The fused linear loss (liger, CUDA only) and fp16 (refused on the CPU) were
# not measured here; both compute the same gradients up to rounding.
LAYER_GAIN = 0.1
PARAM_GAIN = 0.5
GATE_STAGES = ("process", "modules", "loss")  # the transform stages that change numbers
GATE_BATCH = 2  # sequences of the gate's step (of the recipe's length)
GATE_SEED = 1234
# what a best is, quality-wise (the search summary, results, the report and the export show it)
SAME, PASSED, VERIFIED, FAILED, UNVERIFIED = "same", "passed", "verified", "failed", "unverified"
GOOD = (SAME, PASSED, VERIFIED)  # what `search --quality strict` may call best


def changes(cfg: dict, ctx) -> dict[str, str]:
    """The knobs of a concretised configuration whose values change the numerics, with why."""
    from trainscout.spaces import all_knobs
    return {k.name: why for k in all_knobs() if k.name in cfg and (why := k.numerics(cfg[k.name], cfg, ctx))}


def reference(cfg: dict, changed: dict) -> dict:
    """The reference configuration: cfg with the changed knobs at their reference values, and a knob whose
    requirements then no longer hold at its default (offload_optimizer once zero_stage is 0)."""
    from trainscout.spaces import all_knobs, get
    out = dict(cfg, **{name: get(name).reference_value() for name in changed})
    for k in all_knobs():
        if k.name in out and not k.applies(out):
            out[k.name] = k.default
    return out


def differences(cfg: dict, ref: dict) -> dict:
    """The settings of the reference that differ from the configuration's (what a record shows of it)."""
    return {k: v for k, v in ref.items() if cfg.get(k) != v}


def failed_settings(verdict: dict | None, config: dict) -> dict | None:
    """The settings ({knob: value}, read from config) whose numerics changes failed a quality verdict: one_step's
    (gate FAILED, with the `changes` it judged); None where it did not fail or names no change."""
    v = verdict or {}
    if v.get("gate") != FAILED or not v.get("changes"):
        return None
    return {k: config.get(k) for k in v["changes"]}


def gate_key(spec) -> str:
    """What a gate's verdict depends on: the model, the sequence length, the changed settings and the reference's,
    the GPU kind and the library versions (one verdict serves every trial of a search that changes the same)."""
    from . import hardware
    q = spec.quality
    ident = {"model": spec.model_config, "seq_len": spec.recipe["seq_len"], "changes": q["changes"],
             "settings": {k: spec.config[k] for k in q["changes"]}, "reference": q["reference"],
             "device": spec.device, "gpu": (spec.hardware or {}).get("gpu"), "versions": hardware.versions()}
    return hashlib.sha256(json.dumps(ident, sort_keys=True, default=str).encode()).hexdigest()[:32]


def _loss_and_grads(spec, plan, batch, device, reference_dtype=None, changed=(), lean=None, host_grads=False):
    """Loss and gradients (fp32, on the host) of one step of the model built from GATE_SEED under a plan, and, with
    reference_dtype, the worst SQNR of its linears' outputs against the reference op (autocast to reference_dtype,
    None: fp32) on the same inputs: (loss, grads, (worst dB, its module) or None, {parameter: its decoder layer}).
    The knobs of GATE_STAGES transform the model; a changed knob (one whose numerics the gate compares) also runs
    its transform at any other stage and its wrap_step around the step (on one rank: dims of one).
    lean (None: on a GPU whose free memory the weights and gradients would crowd, see _lean): each decoder layer
    recomputed in the backward (the same numbers: torch's non-reentrant checkpoint) and, with host_grads (the
    reference's, compared a tensor at a time on the device: step_changes), each gradient moved to the host as it is
    accumulated. A 7B's reference step (fp32 weights and gradients, 2 x 4096 tokens) ran out of an H100's memory
    (2026-12-06)."""
    import torch

    from trainscout.runtime import STAGES, transforms
    from trainscout.spaces import Knob, ParallelDims, get, plugins
    from trainscout.spaces.layers import decoder_layers

    from . import engines
    from .engines.base import autocast_dtype, causal_lm_loss
    from .models import build_model
    torch.manual_seed(GATE_SEED)
    with torch.device(device):
        model = build_model(spec.model_config, plan.attn_implementation, spec.recipe["seq_len"], plan.master_dtype)
    model.config.use_cache = False
    model.train()
    dims = ParallelDims(world=1)
    for knob in transforms():
        if knob.stage in GATE_STAGES or knob.name in changed:
            model = plugins.transform(knob, model, plan, dims)  # a plugin's failure names the plugin
    paths = {id(m): n for n, m in model.named_modules()}
    layer_of = {id(p): paths.get(id(layer), f"layer {i}") for i, layer in enumerate(decoder_layers(model))
                for p in layer.parameters()}
    layers = {n: layer_of.get(id(p), n) for n, p in model.named_parameters()}
    dtype = autocast_dtype(plan.precision)
    sixteen = dtype is not None and engines.get(plan.engine).compute == "16-bit"
    if sixteen:
        model.to(dtype)
    if lean is None:
        lean = _lean(model, device)
    held: dict = {}
    if lean:
        enable = getattr(model, "activation_checkpointing_enable", None)  # transformers 5.2x; before: gradient_
        if enable is not None:
            enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        for n, p in model.named_parameters() if host_grads else ():
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(lambda p, n=n: _to_host(held, n, p))
    ops, hooks = [], []
    if reference_dtype is not False:
        def compare(module, args, out, name=None):
            with torch.no_grad(), torch.autocast(device.type, dtype=reference_dtype or torch.float32,
                                                 enabled=reference_dtype is not None):
                # from the same input (in fp32: an fp16 candidate's input meets CPU autocast's bf16 as it is)
                ref = torch.nn.functional.linear(args[0].float(), module.weight, module.bias).float()
            ops.append((_db(float(ref.pow(2).sum()), float((ref - out.detach().float()).pow(2).sum())), name))
        for name, m in model.named_modules():  # after the transforms' own hooks: their outputs are compared
            if isinstance(m, torch.nn.Linear) and isinstance(m.weight, torch.Tensor):
                hooks.append(m.register_forward_hook(lambda mod, a, o, n=name: compare(mod, a, o, n)))

    def step(model, batch, scale, **loss_kwargs):
        with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None and not sixteen):
            loss = causal_lm_loss(model, batch, **loss_kwargs) * scale
        for h in hooks:  # the forward's linears only (a recomputing wrapper's second forward is not compared)
            h.remove()
        loss.backward()
        return loss
    wrappers = [get(n) for n in changed if type(get(n)).wrap_step is not Knob.wrap_step]
    for knob in sorted(wrappers, key=lambda k: STAGES.index(k.stage) if k.stage in STAGES else len(STAGES),
                       reverse=True):  # as runtime.wrap_step orders them: the first stage's outermost
        step = knob.wrap_step(step, plan, dims)
    loss = step(model, batch, 1.0)
    for h in hooks:
        h.remove()
    # kept where they are: copied to the host (and compared there) they cost most of the gate's 20-24 s at 1.7B
    grads = held or {n: p.grad.detach() for n, p in model.named_parameters() if p.grad is not None}
    out = float(loss.detach().float().item())
    del model, loss
    return out, grads, min(ops) if ops else None, layers


def _lean(model, device) -> bool:
    """Whether a gate step on this device should recompute its layers and keep its gradients on the host: on a GPU
    where the gradients (the size of the weights) and the weights would take over half of its free memory."""
    if device.type != "cuda":
        return False
    import torch
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    return 2 * size > 0.5 * torch.cuda.mem_get_info(device)[0]


def _to_host(held: dict, name: str, p) -> None:
    """A parameter's accumulated gradient, moved to the host and freed on the device (a post-accumulate hook)."""
    held[name] = p.grad.detach().to("cpu")
    p.grad = None


def one_step(spec, device) -> dict:
    """The gate for a spec whose `quality` names its changes and reference plan (runs in a trial's process)."""
    import torch

    from trainscout.spaces import Plan

    from .models import sizes
    t0 = time.perf_counter()
    q = spec.quality
    cuda = device.type == "cuda"
    if cuda:  # what the gate found held (the trial's leftovers) and what it took at most: said in its verdict
        held_gib = torch.cuda.memory_allocated(device) / 2 ** 30
        torch.cuda.reset_peak_memory_stats(device)
    gen = torch.Generator(device="cpu").manual_seed(GATE_SEED)
    batch = torch.randint(0, sizes(spec.model_config).vocab, (GATE_BATCH, spec.recipe["seq_len"]), generator=gen)
    batch = batch.to(device)
    from .engines.base import autocast_dtype
    changed = tuple(q["changes"])
    with torch.compiler.set_stance("force_eager"):  # compile left out (see above): no graph for the gate's shape
        ref_loss, ref, _, layers = _loss_and_grads(spec, Plan.from_dict(q["reference_plan"]), batch, device,
                                                   reference_dtype=False, changed=changed, host_grads=True)
        if cuda:
            torch.cuda.empty_cache()
            size = sum(g.numel() * g.element_size() for g in ref.values())
            if torch.cuda.mem_get_info(device)[0] < 2.5 * size:  # the candidate's weights and gradients need ~2x
                ref = {n: g.cpu() for n, g in ref.items()}
        ref_dtype = autocast_dtype(q["reference_plan"]["precision"])
        t_ref = time.perf_counter()
        loss, grads, op, _ = _loss_and_grads(spec, spec.plan, batch, device, reference_dtype=ref_dtype,
                                             changed=changed)
    t_cand = time.perf_counter()
    steps = step_changes(ref, grads, layers)
    del ref, grads
    signal, noise = steps.pop("signal"), steps.pop("noise")
    sqnr = _db(signal, noise)
    rel = abs(loss - ref_loss) / max(abs(ref_loss), 1e-12)
    op_db, op_name = op if op else (math.inf, None)
    why = None
    if not (op_db >= THRESHOLD_DB):
        why = f"{op_name}'s output SQNR {op_db:.1f} dB < {THRESHOLD_DB:g} dB"
    elif not (rel <= LOSS_TOLERANCE and math.isfinite(loss)):
        why = f"loss {loss:.4f} vs the reference's {ref_loss:.4f} ({rel:.1%} > {LOSS_TOLERANCE:.0%})"
    elif steps["why"]:
        why = steps["why"]
    ok = why is None
    return {"gate": PASSED if ok else FAILED, "why": why, "op_sqnr_db": _rounded(op_db), "worst_op": op_name,
            "grad_sqnr_db": _rounded(sqnr), **{k: v for k, v in steps.items() if k != "why"},
            "loss": loss, "reference_loss": ref_loss, "loss_rel_diff": rel, "changes": q["changes"],
            "reference": q["reference"], "threshold_db": THRESHOLD_DB, "loss_tolerance": LOSS_TOLERANCE,
            "gain_tolerance": [LAYER_GAIN, PARAM_GAIN],
            "batch": [GATE_BATCH, spec.recipe["seq_len"]], "seconds": round(time.perf_counter() - t0, 2),
            "parts_s": {"reference": round(t_ref - t0, 3), "candidate": round(t_cand - t_ref, 3),
                        "compare": round(time.perf_counter() - t_cand, 3)},
            **({"memory_gib": {"held": round(held_gib, 2), "peak": round(torch.cuda.max_memory_allocated(device)
                                                                         / 2 ** 30, 2)}} if cuda else {})}


def step_changes(ref: dict, grads: dict, layers: dict) -> dict:
    """What the step changes, the candidate's gradients against the reference's: per parameter and per decoder
    layer (its parameters together; a parameter outside the layers is its own), the gain <g, g_ref> / |g_ref|^2 (the
    candidate's gradient projected on the reference's: 1 for the same gradient plus rounding noise of any size, 0.5
    halved, 0 zeroed or frozen), the norm ratio |g| / |g_ref| and the cosine. why: the first layer, then parameter,
    whose gain is out of its tolerance (LAYER_GAIN, PARAM_GAIN), naming it and its ratio; None when none is.
    A parameter the reference has a gradient for and the candidate none (frozen) has gain and ratio 0 and is named
    first; one whose shape the candidate's transforms changed is left out (none of ours: FP8 keeps the weights)."""
    import torch
    names = [n for n, g_ref in ref.items() if n not in grads or grads[n].shape == g_ref.shape]
    # each sum in fp32 on the candidate's device, one parameter at a time: |g_ref|^2, |g|^2, <g, g_ref>, |g_ref - g|^2.
    # A reference kept on the host (the GPU too full for both) comes to the device a tensor at a time: summed on the
    # host, a 7B's comparison took 112 s of its gate's 134.5 on an H100 (2026-12-06)
    rows = []
    for n in names:
        g = grads.get(n)
        r = ref[n].to(g.device if g is not None else ref[n].device).float()
        g = g.float() if g is not None else torch.zeros_like(r)
        rows.append(torch.stack([r.pow(2).sum(), g.pow(2).sum(), (r * g).sum(), (r - g).pow(2).sum()]))
    sums = torch.stack(rows).cpu().double() if rows else torch.zeros(0, 4, dtype=torch.float64)
    per = dict(zip(names, sums.tolist()))
    groups: dict[str, list[float]] = {}
    for n, row in per.items():
        acc = groups.setdefault(layers.get(n, n), [0.0] * 4)
        for i, v in enumerate(row):
            acc[i] += v
    worst_db, worst_tensor = math.inf, None
    for n, (s, c, d, e) in per.items():
        if s > 0 and _db(s, e) < worst_db:
            worst_db, worst_tensor = _db(s, e), n

    def stats(rows: dict, moved: set) -> list[tuple[float, str, float, float, bool]]:
        out = []  # (gain, name, ratio, cosine, frozen: no gradient at all), over those the reference moves
        for n, (s, c, d, e) in rows.items():
            if s > 0:
                out.append((d / s, n, math.sqrt(c / s), d / math.sqrt(s * c) if c > 0 else 0.0, n not in moved))
        return out
    by_layer = stats(groups, {layers.get(n, n) for n in names if n in grads})
    by_param = stats(per, set(grads))
    why = next((f"{r[1]} gets no gradient (frozen), the reference's does" for r in by_param if r[4]), None)
    for what, rows, tol in (("layer", by_layer, LAYER_GAIN), ("parameter", by_param, PARAM_GAIN)):
        bad = [r for r in rows if not abs(r[0] - 1) <= tol]
        if bad and why is None:
            gain, name, ratio, cos, _ = max(bad, key=lambda r: abs(r[0] - 1) if math.isfinite(r[0]) else math.inf)
            why = (f"{name}'s gradient is {gain:.3g}x the reference's (norm ratio {ratio:.3g}, cosine {cos:.3f}; "
                   f"per {what} it must be within 1 +- {tol:g})")
    low = lambda rows, i: min(rows, key=lambda r: r[i], default=None)  # noqa: E731
    far = max(by_param, key=lambda r: abs(r[0] - 1), default=None)
    lfar = max(by_layer, key=lambda r: abs(r[0] - 1), default=None)
    cos = low(by_param, 3)
    return {"why": why, "signal": float(sums[:, 0].sum()), "noise": float(sums[:, 3].sum()),
            "worst_grad_sqnr_db": _rounded(worst_db), "worst_tensor": worst_tensor,
            "grad_gain": _r(far[0]) if far else None, "grad_gain_tensor": far[1] if far else None,
            "layer_grad_gain": _r(lfar[0]) if lfar else None, "layer_grad_gain_at": lfar[1] if lfar else None,
            "grad_norm_ratio": _r(max(by_param, key=lambda r: abs(r[2] - 1))[2]) if by_param else None,
            "grad_cosine": _r(cos[3]) if cos else None, "grad_cosine_tensor": cos[1] if cos else None}


def _r(x: float) -> float | None:
    return round(x, 4) if math.isfinite(x) else None


def _rounded(db: float) -> float | None:
    return round(db, 2) if math.isfinite(db) else None


def _db(signal: float, noise: float) -> float:
    if noise == 0:
        return math.inf if signal > 0 else 0.0
    return 10 * math.log10(signal / noise) if signal > 0 else -math.inf


def status(metrics: dict | None, verified: dict | None = None, config: dict | None = None,
           device: str | None = None) -> tuple[str, str]:
    """(status, why) of a measurement: SAME (no knob changes the numerics), PASSED/FAILED (the one-step gate),
    VERIFIED/FAILED (`verify --quality`: outranks the gate), UNVERIFIED (changed, and no verdict: why). With its
    config (and device), a record stored before the gate existed is told from one whose knobs change nothing."""
    q = (metrics or {}).get("quality")
    if verified is not None:
        return (VERIFIED if verified["verdict"] == VERIFIED else FAILED), verified.get("why") or \
            f"trained {verified['steps']} steps against its reference"
    if not q and config is not None:
        from trainscout.spaces import Context
        changed = changes(config, Context(device=device or "cuda"))
        if changed:
            verb = "changes" if len(changed) == 1 else "change"
            return UNVERIFIED, (f"{', '.join(changed)} {verb} the numerics and the record has no verdict (measured "
                                "before the quality gate)")
    if not q:
        return SAME, "no knob changes the numerics"
    if q.get("gate") in (PASSED, FAILED):
        what = ", ".join(f"{k}" for k in q["changes"])
        op = "exact" if q.get("op_sqnr_db") is None else f"{q['op_sqnr_db']:.1f} dB"
        gain = q.get("layer_grad_gain")  # recorded since the gate compares gradients (a verdict before: None)
        grads = "" if gain is None else f", gradients' gain {gain:.3f} (worst layer)"
        return q["gate"], q.get("why") or (f"one step against its reference ({what}): linear outputs' SQNR {op}, "
                                           f"loss within {q['loss_rel_diff']:.2%}{grads}")
    return UNVERIFIED, q.get("why") or "no verdict"
