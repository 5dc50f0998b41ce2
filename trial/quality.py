"""The quality gate: does a configuration whose knobs change the numerics (Knob.numerics: FP8 products, another
precision, an approximate kernel, 16-bit compute without autocast) train the same model as its reference, the same
configuration with those knobs at their reference values?

One step, where it is cheap: after a trial's timed steps, in the same process (rank 0), the reference and the
candidate are built from the same seed (the same weights) and take one forward and backward on the same batch.
The verdict, as torchao gates its float8 linears (a signal-to-noise ratio above 20 dB): every linear's output in the
candidate's forward against what the reference's op (bf16 autocast) computes from the same input, the worst
SQNR = 10·log10(|y_ref|² / |y_ref - y|²) over the linears must be >= THRESHOLD_DB, and the loss must be within
LOSS_TOLERANCE of the reference's. The SQNR of all gradients together is recorded beside it, not gated: a whole
model's gradients at initialisation carry every op's error through every layer, so a fixed line on them would be a
line on depth (measured on the H200, one step: fp8 tensorwise 16.2 dB on Pythia-1B and 6.5 dB on the Llama-1B shape,
with the loss within 0.01 %; docs/BENCHMARKS.md). 20 dB is an op's error a tenth of its output's amplitude: bf16
keeps 8 mantissa bits (~48 dB a rounding), e4m3 FP8 3 (~25 dB), a one-bit rounding fails it (tests/test_quality.py).
A step at initialisation cannot show what many steps do (FP8 rowwise passed it and failed a 30-step convergence
check on a 128k-vocabulary model): `trainscout verify --quality STEPS` trains both on real text
(analysis/quality.py) and its verdict ("verified" or "failed") outranks this one ("passed" or "failed").

The candidate runs its knobs' model transforms of the stages that change numbers (process settings, module swaps,
the loss) and its engine's compute (autocast over fp32 weights, or 16-bit weights without autocast as FSDP2's
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


def gate_key(spec) -> str:
    """What a gate's verdict depends on: the model, the sequence length, the changed settings and the reference's,
    the GPU kind and the library versions (one verdict serves every trial of a search that changes the same)."""
    from . import hardware
    q = spec.quality
    ident = {"model": spec.model_config, "seq_len": spec.recipe["seq_len"], "changes": q["changes"],
             "settings": {k: spec.config[k] for k in q["changes"]}, "reference": q["reference"],
             "device": spec.device, "gpu": (spec.hardware or {}).get("gpu"), "versions": hardware.versions()}
    return hashlib.sha256(json.dumps(ident, sort_keys=True, default=str).encode()).hexdigest()[:32]


def _loss_and_grads(spec, plan, batch, device, reference_dtype=None):
    """Loss and gradients (fp32, on the host) of one step of the model built from GATE_SEED under a plan, and, with
    reference_dtype, the worst SQNR of its linears' outputs against the reference op (autocast to reference_dtype,
    None: fp32) on the same inputs: (loss, grads, (worst dB, its module) or None)."""
    import torch

    from trainscout.runtime import transforms

    from . import engines
    from .engines.base import autocast_dtype, causal_lm_loss
    from .models import build_model
    torch.manual_seed(GATE_SEED)
    with torch.device(device):
        model = build_model(spec.model_config, plan.attn_implementation, spec.recipe["seq_len"], plan.master_dtype)
    model.config.use_cache = False
    model.train()
    for knob in transforms(GATE_STAGES):
        model = knob.transform(model, plan)
    dtype = autocast_dtype(plan.precision)
    sixteen = dtype is not None and engines.get(plan.engine).compute == "16-bit"
    if sixteen:
        model.to(dtype)
    ops, hooks = [], []
    if reference_dtype is not False:
        def compare(module, args, out, name=None):
            with torch.no_grad(), torch.autocast(device.type, dtype=reference_dtype or torch.float32,
                                                 enabled=reference_dtype is not None):
                ref = torch.nn.functional.linear(args[0], module.weight, module.bias).float()
            ops.append((_db(float(ref.pow(2).sum()), float((ref - out.detach().float()).pow(2).sum())), name))
        for name, m in model.named_modules():  # after the transforms' own hooks: their outputs are compared
            if isinstance(m, torch.nn.Linear) and isinstance(m.weight, torch.Tensor):
                hooks.append(m.register_forward_hook(lambda mod, a, o, n=name: compare(mod, a, o, n)))
    with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None and not sixteen):
        loss = causal_lm_loss(model, batch)
    for h in hooks:
        h.remove()
    loss.backward()
    # kept where they are: copied to the host (and compared there) they cost most of the gate's 20-24 s at 1.7B
    grads = {n: p.grad.detach() for n, p in model.named_parameters() if p.grad is not None}
    out = float(loss.detach().float().item())
    del model, loss
    return out, grads, min(ops) if ops else None


def one_step(spec, device) -> dict:
    """The gate for a spec whose `quality` names its changes and reference plan (runs in a trial's process)."""
    import torch

    from trainscout.spaces import Plan

    from .models import sizes
    t0 = time.perf_counter()
    q = spec.quality
    gen = torch.Generator(device="cpu").manual_seed(GATE_SEED)
    batch = torch.randint(0, sizes(spec.model_config).vocab, (GATE_BATCH, spec.recipe["seq_len"]), generator=gen)
    batch = batch.to(device)
    from .engines.base import autocast_dtype
    with torch.compiler.set_stance("force_eager"):  # compile left out (see above): no graph for the gate's shape
        ref_loss, ref, _ = _loss_and_grads(spec, Plan.from_dict(q["reference_plan"]), batch, device,
                                           reference_dtype=False)
        if device.type == "cuda":
            torch.cuda.empty_cache()
            size = sum(g.numel() * g.element_size() for g in ref.values())
            if torch.cuda.mem_get_info(device)[0] < 2.5 * size:  # the candidate's weights and gradients need ~2x
                ref = {n: g.cpu() for n, g in ref.items()}
        ref_dtype = autocast_dtype(q["reference_plan"]["precision"])
        t_ref = time.perf_counter()
        loss, grads, op = _loss_and_grads(spec, spec.plan, batch, device, reference_dtype=ref_dtype)
    t_cand = time.perf_counter()
    names = [n for n, g_ref in ref.items() if n in grads and grads[n].shape == g_ref.shape]  # not a parameter the
    # candidate's transforms replaced (none of ours: FP8 keeps the weights); each sum in fp32 on the device, one copy
    sums = torch.stack([torch.stack([ref[n].float().pow(2).sum(),
                                     (ref[n].float() - grads[n].to(ref[n].device).float()).pow(2).sum()])
                        for n in names]).cpu().double() if names else torch.zeros(0, 2, dtype=torch.float64)
    del ref, grads
    signal, noise = float(sums[:, 0].sum()), float(sums[:, 1].sum())
    worst, worst_name = math.inf, None
    for name, (s, e) in zip(names, sums.tolist()):
        if s > 0:
            db = _db(s, e)
            if db < worst:
                worst, worst_name = db, name
    sqnr = _db(signal, noise)
    rel = abs(loss - ref_loss) / max(abs(ref_loss), 1e-12)
    op_db, op_name = op if op else (math.inf, None)
    ok = op_db >= THRESHOLD_DB and rel <= LOSS_TOLERANCE and math.isfinite(loss)
    why = None if ok else (f"{op_name}'s output SQNR {op_db:.1f} dB < {THRESHOLD_DB:g} dB" if op_db < THRESHOLD_DB
                           else f"loss {loss:.4f} vs the reference's {ref_loss:.4f} ({rel:.1%} > {LOSS_TOLERANCE:.0%})")
    return {"gate": PASSED if ok else FAILED, "why": why, "op_sqnr_db": _rounded(op_db), "worst_op": op_name,
            "grad_sqnr_db": _rounded(sqnr), "worst_grad_sqnr_db": _rounded(worst), "worst_tensor": worst_name,
            "loss": loss, "reference_loss": ref_loss, "loss_rel_diff": rel, "changes": q["changes"],
            "reference": q["reference"], "threshold_db": THRESHOLD_DB, "loss_tolerance": LOSS_TOLERANCE,
            "batch": [GATE_BATCH, spec.recipe["seq_len"]], "seconds": round(time.perf_counter() - t0, 2),
            "parts_s": {"reference": round(t_ref - t0, 3), "candidate": round(t_cand - t_ref, 3),
                        "compare": round(time.perf_counter() - t_cand, 3)}}


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
        return q["gate"], q.get("why") or (f"one step against its reference ({what}): linear outputs' SQNR {op}, "
                                           f"loss within {q['loss_rel_diff']:.2%}")
    return UNVERIFIED, q.get("why") or "no verdict"
