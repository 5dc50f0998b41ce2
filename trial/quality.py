"""The quality gate: does a configuration whose knobs change the numerics (Numerics.why: FP8 products, another
precision, an approximate kernel, 16-bit compute without autocast) train the same model as its reference, the same
configuration with those knobs at their reference values?

One step, where it is cheap: after a trial's timed steps, in the same process (rank 0), the reference and the
candidate are built from the same seed (the same weights) and each takes a forward and backward on each of the gate's
GATE_BATCHES batches (the same batches for both). What it judges, against LINES (one table: each line's limit and
meaning, what `judge` reads):
- every linear's output in the candidate's forward against what the reference's op computes from the same input: the
  worst SQNR = 10·log10(|y_ref|² / |y_ref - y|²) over the linears, at least torchao's line for float8;
- the loss, on every batch, within a relative tolerance of the reference's;
- what the step changes, per decoder layer (its parameters together; an embedding, a head or a final norm on its
  own) and per parameter, judged against the gradient's own noise: the reference's gradients on two batches at the
  same weights differ by the minibatch noise training takes every step. A group's deviation (the candidate's
  gradient minus the reference's on the same batch, RMS over the batches) over that spread is its noise ratio r: an
  error that is random from batch to batch adds r² of the noise's variance, as a batch 1/(1 + r²) the size would, so
  a small r trains like a slightly smaller batch, and one near or above 1 is an error that dominates the noise. An
  error the same way on every batch is a bias the noise does not average away: the gain along the reference's
  gradient, <g, g_ref> / |g_ref|², off 1 on the same side on every batch by more than a line (a knob that halves,
  zeroes or rescales gradients) fails whatever the noise;
- a parameter the reference moves and the candidate does not (frozen) fails, and so does any value that is not
  finite (a loss, a gradient's sum), at once.
A statistic within its line but in its band near it (Line.band) makes the verdict MARGINAL, never PASSED: the line is
set by measurement, and a verdict that close says to train both (`trainscout verify --quality`). Gradients, not the
optimizer's update: AdamW's first update is about lr·sign(g), blind to a gradient's scale.
A step at initialisation cannot show what many steps do: `trainscout verify --quality STEPS` trains both on real text
(analysis/quality.py) and its verdict ("verified" or "failed") outranks this one ("passed", "marginal" or "failed").

The candidate runs its knobs' model transforms of the stages that change numbers (process settings, module swaps,
the loss), a changed knob's transform at any stage and its wrap_step around the step, and its engine's compute
(autocast over fp32 weights, or 16-bit weights without autocast as FSDP2's param_dtype and DeepSpeed's bf16 model
compute), on one rank: an engine's sharding, checkpointing and compile are left out, as they change no numbers beyond
rounding order (a transform's torch.compile runs eager there: graphs for the gate's batch would be compiled for its
steps alone, no timed step runs them).
"""
from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Line:
    """One line of the one-step gate: the statistic stays at most `limit` (at least, where `least`); one within the
    line but past `band` of the way to it (a share of the limit; None: no band) is marginal."""

    limit: float
    meaning: str
    least: bool = False
    band: float | None = None

    def past(self, value: float) -> bool:
        """Whether value is on the wrong side of the line (a value that is not a number always is)."""
        return not (value >= self.limit if self.least else value <= self.limit)

    def near(self, value: float) -> bool:
        """Whether value, within the line, is in its marginal band."""
        return self.band is not None and not self.past(value) and value > self.band * self.limit


# The lines the gate judges by (judge() reads them; bench/gate_calibration_gpu.py prints every statistic beside its
# line and judges again under other limits). The limits of the gradient lines are set by measurement on GPUs
# (docs/BENCHMARKS.md); their meaning is what the module docstring derives.
LINES = {
    "op_sqnr_db": Line(20.0, "every linear's output against the reference op's from the same input, in dB: an op's "
                             "error a tenth of its output's amplitude (torchao's line for float8)", least=True),
    "loss": Line(0.01, "the loss's difference from the reference's on each batch, relative to it"),
    "layer_noise": Line(1.0, "a decoder layer's (or an embedding's, head's, final norm's) gradient deviation from the "
                             "reference's on the same batch over the reference's own batch-to-batch spread at the "
                             "same weights: r adds r^2 of the minibatch noise", band=0.75),
    "layer_rescale": Line(0.3, "a decoder layer's gain along the reference's gradient off 1 the same way on every "
                               "batch, by the least of them: a rescale no batch's noise averages away", band=0.75),
    "param_noise": Line(3.0, "a single parameter's deviation over its own batch-to-batch spread (looser than a "
                             "layer's: a small tensor's noise is measured on few values)", band=0.75),
    "param_rescale": Line(0.5, "a single parameter's gain off 1 the same way on every batch", band=0.75),
}
THRESHOLD_DB = LINES["op_sqnr_db"].limit
LOSS_TOLERANCE = LINES["loss"].limit
GATE_STAGES = ("process", "modules", "loss")  # the transform stages that change numbers
GATE_BATCH = 2  # sequences of each of the gate's batches (of the recipe's length)
GATE_BATCHES = 2  # batches at the same weights: their reference gradients' spread is the noise the gate judges by
GATE_SEED = 1234
GATE_VERSION = 2  # the rule a verdict was judged by (in its key: a verdict of another rule is not served)
# what a best is, quality-wise (the search summary, results, the report and the export show it)
SAME, PASSED, VERIFIED, FAILED, UNVERIFIED = "same", "passed", "verified", "failed", "unverified"
MARGINAL = "marginal"  # the one-step gate's verdict within its lines but near one: not called the same model
INCONCLUSIVE = "inconclusive"  # a training comparison whose loss interval straddles its tolerance
GOOD = (SAME, PASSED, VERIFIED)  # what `search --quality strict` may call best


def changes(cfg: dict, ctx) -> dict[str, str]:
    """The knobs of a concretised configuration whose values change the numerics, with why."""
    from trainscout.spaces import all_knobs
    return {k.name: why for k in all_knobs() if k.name in cfg and (why := k.numerics.why(cfg[k.name], cfg, ctx))}


def reference(cfg: dict, changed: dict) -> dict:
    """The reference configuration: cfg with the changed knobs at their reference values, and a knob whose
    requirements then no longer hold at its default (offload_optimizer once zero_stage is 0)."""
    from trainscout.spaces import all_knobs, applies, get, reference_value
    out = dict(cfg, **{name: reference_value(get(name)) for name in changed})
    for k in all_knobs():
        if k.name in out and not applies(k, out):
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
    the GPU kind, the library versions and the gate's rule (one verdict serves every trial of a search that changes
    the same)."""
    from . import hardware
    q = spec.quality
    ident = {"model": spec.model_config, "seq_len": spec.recipe["seq_len"], "changes": q["changes"],
             "settings": {k: spec.config[k] for k in q["changes"]}, "reference": q["reference"],
             "device": spec.device, "gpu": (spec.hardware or {}).get("gpu"), "versions": hardware.versions(),
             "gate": GATE_VERSION}
    return hashlib.sha256(json.dumps(ident, sort_keys=True, default=str).encode()).hexdigest()[:32]


def gate_batches(spec, device) -> list:
    """The gate's GATE_BATCHES batches of GATE_BATCH sequences of random tokens, from GATE_SEED, on device (the first
    is the batch a gate of one batch took)."""
    import torch

    from .models import sizes
    gen = torch.Generator(device="cpu").manual_seed(GATE_SEED)
    shape = (GATE_BATCH, spec.recipe["seq_len"])
    vocab = sizes(spec.model_config).vocab
    return [torch.randint(0, vocab, shape, generator=gen).to(device) for _ in range(GATE_BATCHES)]


def gate_steps(spec, plan, batches, device, reference_dtype=None, changed=(), lean=None, host_grads=False):
    """One model built from GATE_SEED under a plan, a forward and backward on each batch in turn: yields per batch
    (loss, grads, op, layers): its gradients (fp32 where the weights are; on the device, or the host, see lean), the
    worst SQNR of its linears' outputs on the first batch against the reference op (autocast to reference_dtype,
    None: fp32) on the same inputs ((worst dB, its module); None without reference_dtype, and on later batches), and
    {parameter: its decoder layer}. A batch's gradients are the consumer's: the next batch's are accumulated afresh.
    The knobs of GATE_STAGES transform the model; a changed knob (one whose numerics the gate compares) also runs
    its transform at any other stage and its wrap_step around the step (on one rank: dims of one).
    lean (None: on a GPU whose free memory the weights and gradients would crowd, see _lean): each decoder layer
    recomputed in the backward (the same numbers: torch's non-reentrant checkpoint) and, with host_grads (the
    reference's, compared a tensor at a time on the device: gradient_sums), each gradient moved to the host as it is
    accumulated: a large model's reference step otherwise runs out of a GPU's memory."""
    from . import engines
    from .engines.base import autocast_dtype
    model, layers, dims = _gate_model(spec, plan, device, changed)
    dtype = autocast_dtype(plan.precision)
    sixteen = dtype is not None and engines.get(plan.engine).compute == "16-bit"
    if sixteen:
        model.to(dtype)
    if lean is None:
        lean = _lean(model, device)
    sink: list[dict] = [{}]  # the gradients a post-accumulate hook moved to the host, this batch's
    if lean:
        _recompute_layers(model, sink if host_grads else None)
    ops = []
    hooks = _compare_linears(model, device, reference_dtype, ops) if reference_dtype is not False else []
    step = _gate_step(plan, dims, changed, device, dtype, sixteen, hooks)
    for i, batch in enumerate(batches):
        loss = step(model, batch, 1.0)
        op = (min(ops) if ops else None) if i == 0 else None
        # kept where they are: copied to the host (and compared there) they cost most of a large model's gate
        grads = sink[0] or {n: p.grad.detach() for n, p in model.named_parameters() if p.grad is not None}
        sink[0] = {}
        for p in model.parameters():
            p.grad = None
        out = float(loss.detach().float().item())
        del loss
        yield out, grads, op, layers
        del grads


def _gate_model(spec, plan, device, changed):
    """(model, {parameter: its decoder layer}, dims): the model built from GATE_SEED on device under a plan, with the
    transforms of GATE_STAGES and of the changed knobs at any stage applied (on one rank: dims of one)."""
    import torch

    from trainscout.runtime import transforms
    from trainscout.spaces import ParallelDims, plugins
    from trainscout.spaces.layers import decoder_layers

    from .models import build_model
    torch.manual_seed(GATE_SEED)
    with torch.device(device):
        model = build_model(spec.model_config, plan.attn_implementation, spec.recipe["seq_len"], plan.master_dtype)
    model.config.use_cache = False
    model.train()
    dims = ParallelDims(world=1)
    for knob in transforms():
        if knob.runtime.stage in GATE_STAGES or knob.name in changed:
            model = plugins.transform(knob, model, plan, dims)  # a plugin's failure names the plugin
    paths = {id(m): n for n, m in model.named_modules()}
    layer_of = {id(p): paths.get(id(layer), f"layer {i}") for i, layer in enumerate(decoder_layers(model))
                for p in layer.parameters()}
    return model, {n: layer_of.get(id(p), n) for n, p in model.named_parameters()}, dims


def _recompute_layers(model, sink: list | None) -> None:
    """Each decoder layer recomputed in the backward (torch's non-reentrant checkpoint: the same numbers); with a
    sink, each gradient moved into sink[0] on the host as it is accumulated."""
    enable = getattr(model, "activation_checkpointing_enable", None)  # transformers 5.2x; before: gradient_
    if enable is not None:
        enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    for n, p in model.named_parameters() if sink is not None else ():
        if p.requires_grad:
            p.register_post_accumulate_grad_hook(lambda p, n=n: _to_host(sink[0], n, p))


def _compare_linears(model, device, reference_dtype, ops: list) -> list:
    """Forward hooks that append to ops each linear's (SQNR dB, module) against the reference op (autocast to
    reference_dtype, None: fp32) on the same input; the hooks, for the step to remove after its first forward."""
    import torch

    def compare(module, args, out, name=None):
        with torch.no_grad(), torch.autocast(device.type, dtype=reference_dtype or torch.float32,
                                             enabled=reference_dtype is not None):
            # from the same input (in fp32: an fp16 candidate's input meets CPU autocast's bf16 as it is)
            ref = torch.nn.functional.linear(args[0].float(), module.weight, module.bias).float()
        ops.append((_db(float(ref.pow(2).sum()), float((ref - out.detach().float()).pow(2).sum())), name))
    hooks = []
    for name, m in model.named_modules():  # after the transforms' own hooks: their outputs are compared
        if isinstance(m, torch.nn.Linear) and isinstance(m.weight, torch.Tensor):
            hooks.append(m.register_forward_hook(lambda mod, a, o, n=name: compare(mod, a, o, n)))
    return hooks


def _gate_step(plan, dims, changed, device, dtype, sixteen: bool, hooks: list):
    """step(model, batch, scale, **loss_kwargs): a forward (autocast to dtype unless the weights are 16-bit) and
    backward, the hooks removed after the first forward, wrapped by the changed knobs' wrap_step."""
    import torch

    from trainscout.runtime import STAGES
    from trainscout.spaces import get
    from trainscout.spaces.roles import Runtime

    from .engines.base import causal_lm_loss

    def step(model, batch, scale, **loss_kwargs):
        with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None and not sixteen):
            loss = causal_lm_loss(model, batch, **loss_kwargs) * scale
        for h in hooks:  # the first forward's linears only (a recomputing wrapper's second forward is not compared)
            h.remove()
        loss.backward()
        return loss
    wrappers = [get(n) for n in changed if type(get(n).runtime).wrap_step is not Runtime.wrap_step]
    for knob in sorted(wrappers, key=lambda k: STAGES.index(k.runtime.stage) if k.runtime.stage in STAGES
                       else len(STAGES), reverse=True):  # as runtime.wrap_step orders them: the first stage's outermost
        step = knob.runtime.wrap_step(step, plan, dims)
    return step


def loss_and_grads(spec, plan, batch, device, reference_dtype=None, changed=(), lean=None, host_grads=False):
    """(loss, grads, op, layers) of one step on one batch (gate_steps' first)."""
    steps = gate_steps(spec, plan, [batch], device, reference_dtype, changed, lean, host_grads)
    try:
        return next(steps)
    finally:
        steps.close()


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


def _bytes(grads: dict) -> int:
    return sum(g.numel() * g.element_size() for g in grads.values() if g is not None and g.device.type == "cuda")


def park_gradients(sets: list, device, room: float) -> None:
    """Moves the gradient sets held on the GPU to the host where its free memory is under room times one set's
    size (what the steps still to run need beside them)."""
    if device.type != "cuda":
        return
    import torch
    size = max((_bytes(s) for s in sets if s), default=0)
    if size and torch.cuda.mem_get_info(device)[0] < room * size:
        for s in sets:
            for n, g in list((s or {}).items()):
                s[n] = g.cpu()
        torch.cuda.empty_cache()


def one_step(spec, device) -> dict:
    """The gate for a spec whose `quality` names its changes and reference plan (runs in a trial's process)."""
    import torch

    from trainscout.spaces import Plan

    from .engines.base import autocast_dtype
    t0 = time.perf_counter()
    q = spec.quality
    cuda = device.type == "cuda"
    if cuda:  # what the gate found held (the trial's leftovers) and what it took at most: said in its verdict
        held_gib = torch.cuda.memory_allocated(device) / 2 ** 30
        torch.cuda.reset_peak_memory_stats(device)
    batches = gate_batches(spec, device)
    changed = tuple(q["changes"])
    refs: list[dict | None] = []
    ref_losses, losses, per_batch, op = [], [], [], None
    with torch.compiler.set_stance("force_eager"):  # compile left out (see above): no graph for the gate's shape
        for loss, grads, _, layers in gate_steps(spec, Plan.from_dict(q["reference_plan"]), batches, device,
                                                  reference_dtype=False, changed=changed, host_grads=True):
            ref_losses.append(loss)
            refs.append(grads)
            if len(refs) < len(batches):
                park_gradients(refs, device, room=1.5)  # the next batch's gradients and activations beside them
        del grads
        spread = reference_spread(refs, device)
        if cuda:
            torch.cuda.empty_cache()
        park_gradients(refs, device, room=2.5)  # the candidate's weights and gradients need ~2x one set
        t_ref = time.perf_counter()
        ref_dtype = autocast_dtype(q["reference_plan"]["precision"])
        for b, (loss, grads, got, _) in enumerate(gate_steps(spec, spec.plan, batches, device,
                                                               reference_dtype=ref_dtype, changed=changed)):
            losses.append(loss)
            op = got if b == 0 else op
            per_batch.append(gradient_sums(refs[b], grads))
            refs[b] = None  # compared: freed before the next batch's step
            del grads
    t_cand = time.perf_counter()
    stats = statistics(per_batch, spread, layers, losses, ref_losses, op)
    word, why, worst = judge(stats)
    # the one-batch statistics a gate of one batch judged by (compared)
    first = first_batch_statistics(per_batch[0], layers)
    return {"gate": word, "why": why, "op_sqnr_db": stats["op_sqnr_db"], "worst_op": stats["worst_op"],
            **worst, "groups": {n: {"ratio": _r(s["ratio"]), "gains": [_r(g) for g in s["gains"]],
                                    "reference_cosine": _r(s["reference_cosine"])}
                                for n, s in stats["layers"].items()},
            **first, "loss": losses[0], "reference_loss": ref_losses[0], "losses": losses,
            "reference_losses": ref_losses, "loss_rel_diff": stats["loss_rel_diff"], "changes": q["changes"],
            "reference": q["reference"], "lines": {k: v.limit for k, v in LINES.items()},
            "threshold_db": THRESHOLD_DB, "loss_tolerance": LOSS_TOLERANCE,
            "gain_tolerance": [LINES["layer_rescale"].limit, LINES["param_rescale"].limit],
            "gate_version": GATE_VERSION,
            "batch": [GATE_BATCH, spec.recipe["seq_len"]], "batches": len(batches),
            "seconds": round(time.perf_counter() - t0, 2),
            "parts_s": {"reference": round(t_ref - t0, 3), "candidate": round(t_cand - t_ref, 3),
                        "compare": round(time.perf_counter() - t_cand, 3)},
            **({"memory_gib": {"held": round(held_gib, 2), "peak": round(torch.cuda.max_memory_allocated(device)
                                                                         / 2 ** 30, 2)}} if cuda else {})}


def gradient_sums(ref: dict, grads: dict) -> dict:
    """Per parameter the reference moved on a batch, the candidate's gradient on the same batch against it:
    {name: [|g_ref|², |g|², <g, g_ref>, |g_ref - g|², has a gradient (1.0) or none (0.0)]}, each sum in fp32 on the
    candidate's device, one parameter at a time (a reference kept on the host comes to the device a tensor at a
    time: summed on the host, a large model's comparison takes most of its gate). A parameter whose shape the
    candidate's transforms changed is left out (none of ours: FP8 keeps the weights)."""
    import torch
    names = [n for n, r in ref.items() if r is not None and (n not in grads or grads[n].shape == r.shape)]
    rows = []
    for n in names:
        g = grads.get(n)
        r = ref[n].to(g.device if g is not None else ref[n].device).float()
        g = g.float() if g is not None else torch.zeros_like(r)
        rows.append(torch.stack([r.pow(2).sum(), g.pow(2).sum(), (r * g).sum(), (r - g).pow(2).sum()]))
    sums = torch.stack(rows).cpu().double().tolist() if rows else []
    return {n: [*row, float(n in grads)] for n, row in zip(names, sums)}


def reference_spread(refs: list, device) -> dict:
    """The reference's batch-to-batch spread per parameter: {name: [sum over pairs of batches of |g_a - g_b|², of
    <g_a, g_b>]} (a parameter without a gradient on a batch: zeros there), summed on device a tensor at a time."""
    import torch
    names = list(dict.fromkeys(n for r in refs for n in r))
    rows = []
    for n in names:
        got = [r.get(n) for r in refs]
        like = next(g for g in got if g is not None)
        gs = [(g if g is not None else torch.zeros_like(like)).to(device).float() for g in got]
        pairs = [(a, b) for i, a in enumerate(gs) for b in gs[i + 1:]]
        rows.append(torch.stack([sum((a - b).pow(2).sum() for a, b in pairs), sum((a * b).sum() for a, b in pairs)]))
    sums = torch.stack(rows).cpu().double().tolist() if rows else []
    return dict(zip(names, sums))


def statistics(per_batch: list[dict], spread: dict, layers: dict, losses: list, ref_losses: list, op) -> dict:
    """What judge() reads, from the candidate's sums on each batch (gradient_sums), the reference's spread
    (reference_spread), the decoder layer of each parameter, the losses and the worst linear op ((dB, module) or
    None: every output exact).
    Per group (`layers`: a decoder layer's parameters together, any other parameter on its own; `params`: each
    parameter) the reference moved: ratio (the candidate's RMS deviation over the reference's per-batch spread,
    sqrt(sum over pairs |g_a - g_b|² / (K (K - 1))): one batch's gradient's distance from their mean), its gain,
    norm ratio and cosine on each batch, and the reference's own cosine between batches (how much of its gradient
    repeats from batch to batch)."""
    k = len(per_batch)
    nonfinite = next((f"{'the loss' if i < len(losses) else 'the reference loss'} is {v}" for i, v in
                      enumerate(losses + ref_losses) if not math.isfinite(v)), None)
    for b, rows in enumerate(per_batch):
        for n, row in rows.items():
            if nonfinite is None and not all(math.isfinite(v) for v in row):
                whose = "the reference's" if not math.isfinite(row[0]) else "the candidate's"
                nonfinite = f"{n}: {whose} gradient is not finite (batch {b + 1} of {k})"
    frozen = next((n for rows in per_batch for n, row in rows.items() if row[0] > 0 and not row[4]), None)

    def grouped(key) -> dict:
        acc: dict[str, list] = {}
        for b, rows in enumerate(per_batch):
            for n, row in rows.items():
                g = acc.setdefault(key(n), [[0.0] * 4 for _ in range(k)] + [[0.0, 0.0]])
                for i in range(4):
                    g[b][i] += row[i]
        for n, (p, d) in spread.items():
            if key(n) in acc:
                acc[key(n)][k][0] += p
                acc[key(n)][k][1] += d
        out = {}
        for name, sums in acc.items():
            batches, (pairs, dots) = sums[:k], sums[k]
            if not any(s > 0 for s, *_ in batches):
                continue  # the reference moves it on no batch
            noise2 = pairs / (k * (k - 1)) if k > 1 else 0.0
            dev2 = sum(e for *_, e in batches) / k
            ratio = math.sqrt(dev2 / noise2) if noise2 > 0 else (math.inf if dev2 > 0 else 0.0)
            norms = sum(math.sqrt(a[0] * b[0]) for i, a in enumerate(batches) for b in batches[i + 1:])
            out[name] = {"ratio": ratio, "gains": [d / s if s > 0 else math.nan for s, c, d, e in batches],
                         "norm_ratios": [math.sqrt(c / s) if s > 0 else math.nan for s, c, d, e in batches],
                         "cosines": [d / math.sqrt(s * c) if s > 0 and c > 0 else 0.0 for s, c, d, e in batches],
                         "reference_cosine": dots / norms if norms > 0 else 0.0}
        return out
    rel = [abs(c - r) / max(abs(r), 1e-12) for c, r in zip(losses, ref_losses)]
    op_db, op_name = op if op else (math.inf, None)
    return {"batches": k, "nonfinite": nonfinite, "frozen": frozen, "op_sqnr_db": _rounded(op_db),
            "worst_op": op_name, "loss_rel_diff": max(rel) if rel else 0.0, "losses": losses,
            "reference_losses": ref_losses, "layers": grouped(lambda n: layers.get(n, n)),
            "params": grouped(lambda n: n)}


def rescale(gains: list) -> float:
    """The part of a group's gain off 1 that every batch shares: the least deviation where all lie on one side of 1
    (signed), else 0 (batches where the reference moved nothing, NaN, are left out)."""
    devs = [g - 1 for g in gains if not math.isnan(g)]
    if not devs or not (all(d > 0 for d in devs) or all(d < 0 for d in devs)):
        return 0.0
    return min(devs, key=abs)


def judge(stats: dict, lines: dict | None = None) -> tuple[str, str | None, dict]:
    """(PASSED, MARGINAL or FAILED, why, the worst of each statistic) of statistics() under lines (LINES). In order,
    the first that holds fails it: a value not finite, an op's SQNR, a batch's loss, a frozen parameter; then
    the statistic (a rescale, a noise ratio; per layer group or per parameter) furthest past its line, as a share of
    it, names the reason. Else the one nearest its line within its band makes it MARGINAL, naming it; else PASSED."""
    lines = lines or LINES
    k = stats["batches"]
    worst = {}
    for scope, key in (("layer", "layers"), ("param", "params")):
        groups = stats[key]
        noisy = max(groups.items(), key=lambda kv: _order(kv[1]["ratio"]), default=(None, None))
        scaled = max(groups.items(), key=lambda kv: abs(rescale(kv[1]["gains"])), default=(None, None))
        prefix = "" if scope == "layer" else "param_"
        worst |= {f"{prefix}noise_ratio": _r(noisy[1]["ratio"]) if noisy[0] else None,
                  f"{prefix}noise_ratio_at": noisy[0],
                  f"{prefix}rescale": _r(1 + rescale(scaled[1]["gains"])) if scaled[0] else None,
                  f"{prefix}rescale_at": scaled[0]}
    if stats["nonfinite"]:
        return FAILED, f"not finite: {stats['nonfinite']}", worst
    op_db = math.inf if stats["op_sqnr_db"] is None else stats["op_sqnr_db"]
    line = lines["op_sqnr_db"]
    if line.past(op_db):
        return FAILED, f"{stats['worst_op']}'s output SQNR {op_db:.1f} dB < {line.limit:g} dB", worst
    line = lines["loss"]
    if line.past(stats["loss_rel_diff"]):
        i = max(range(k), key=lambda b: abs(stats["losses"][b] - stats["reference_losses"][b]))
        return FAILED, (f"loss {stats['losses'][i]:.4f} vs the reference's {stats['reference_losses'][i]:.4f} "
                        f"({stats['loss_rel_diff']:.1%} > {line.limit:.0%})"), worst
    if stats["frozen"]:
        return FAILED, f"{stats['frozen']} gets no gradient (frozen), the reference's does", worst
    past, near = [], []  # (share of its line, why)
    for scope, key in (("layer", "layers"), ("parameter", "params")):
        short = "layer" if scope == "layer" else "param"
        for n, s in stats[key].items():
            dev, ratio = abs(rescale(s["gains"])), s["ratio"]
            for line, value, why in ((lines[f"{short}_rescale"], dev, _rescale_why),
                                     (lines[f"{short}_noise"], ratio, _noise_why)):
                share = _order(value) / line.limit
                if line.past(value):
                    past.append((share, lambda n=n, s=s, c=scope, line=line, why=why: why(n, s, c, line, k, False)))
                elif line.near(value):
                    near.append((share, lambda n=n, s=s, c=scope, line=line, why=why: why(n, s, c, line, k, True)))
    for found, word in ((past, FAILED), (near, MARGINAL)):
        if found:  # the furthest past (or nearest to) its line; on a tie the first: a layer before a parameter
            return word, max(found, key=lambda f: f[0])[1](), worst
    return PASSED, None, worst


def _order(x: float) -> float:
    return math.inf if math.isnan(x) else x


def _rescale_why(name: str, s: dict, scope: str, line: Line, k: int, near: bool) -> str:
    """A group's gain off 1 on every batch, said at its least (the batch closest to 1)."""
    dev = rescale(s["gains"])
    j = min((i for i, g in enumerate(s["gains"]) if not math.isnan(g)), key=lambda i: abs(s["gains"][i] - 1 - dev))
    said = (f"{name}'s gradient is {1 + dev:.3g}x the reference's (norm ratio {s['norm_ratios'][j]:.3g}, cosine "
            f"{s['cosines'][j]:.3f}")
    if not near:
        return f"{said}; per {scope} it must be within 1 +- {line.limit:g} on some batch of the gate's {k})"
    return (f"near its line: {said}, the least off 1 of the gate's {k} batches; per {scope} within 1 +- "
            f"{line.limit:g}, marginal beyond {line.band * line.limit:.3g})")


def _noise_why(name: str, s: dict, scope: str, line: Line, k: int, near: bool) -> str:
    """A group's deviation from the reference against the reference's batch-to-batch spread."""
    said = (f"{name}'s gradient deviates from the reference's by {s['ratio']:.3g}x the reference's own spread between "
            f"batches (RMS over the gate's {k}; its cosine with the reference {min(s['cosines']):.3f} at least")
    if not near:
        return f"{said}; per {scope} it must be at most {line.limit:g})"
    return f"near its line: {said}; per {scope} at most {line.limit:g}, marginal above {line.band * line.limit:.3g})"


def first_batch_statistics(rows: dict, layers: dict) -> dict:
    """The first batch's statistics alone, as a gate of one batch recorded them: the gradients' SQNR (all, and the
    worst tensor's), and the gain off 1 the farthest, norm ratio and cosine, per layer group and per parameter."""
    stats = statistics([rows], {}, layers, [], [], None)
    worst_db, worst_tensor = math.inf, None
    for n, (s, c, d, e, _) in rows.items():
        if s > 0 and _db(s, e) < worst_db:
            worst_db, worst_tensor = _db(s, e), n

    def far(groups: dict, what: str):
        return max(groups.items(), key=lambda kv: _order(abs(kv[1][what][0] - 1)), default=(None, None))
    param, layer = far(stats["params"], "gains"), far(stats["layers"], "gains")
    ratio = far(stats["params"], "norm_ratios")
    cos = min(stats["params"].items(), key=lambda kv: kv[1]["cosines"][0], default=(None, None))
    return {"grad_sqnr_db": _rounded(_db(sum(r[0] for r in rows.values()), sum(r[3] for r in rows.values()))),
            "worst_grad_sqnr_db": _rounded(worst_db), "worst_tensor": worst_tensor,
            "grad_gain": _r(param[1]["gains"][0]) if param[0] else None, "grad_gain_tensor": param[0],
            "layer_grad_gain": _r(layer[1]["gains"][0]) if layer[0] else None, "layer_grad_gain_at": layer[0],
            "grad_norm_ratio": _r(ratio[1]["norm_ratios"][0]) if ratio[0] else None,
            "grad_cosine": _r(cos[1]["cosines"][0]) if cos[0] else None, "grad_cosine_tensor": cos[0]}


def step_changes(ref: dict, grads: dict, layers: dict) -> dict:
    """One batch's candidate gradients against the reference's (a gate of one batch's statistics,
    first_batch_statistics), with why: a parameter that is frozen or a sum that is not finite (None: neither); no
    noise to judge the rest by."""
    rows = gradient_sums(ref, grads)
    stats = statistics([rows], {}, layers, [], [], None)
    why = (f"not finite: {stats['nonfinite']}" if stats["nonfinite"] else
           f"{stats['frozen']} gets no gradient (frozen), the reference's does" if stats["frozen"] else None)
    return {"why": why, **first_batch_statistics(rows, layers)}


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
    """(status, why) of a measurement: SAME (no knob changes the numerics), PASSED/MARGINAL/FAILED (the one-step gate),
    VERIFIED/FAILED (`verify --quality`: outranks the gate), UNVERIFIED (changed, and no verdict: why). With its
    config (and device), a record stored before the gate existed is told from one whose knobs change nothing."""
    q = (metrics or {}).get("quality")
    if verified is not None:
        said = verified["verdict"] if verified["verdict"] in (VERIFIED, INCONCLUSIVE) else FAILED
        return said, verified.get("why") or f"trained {verified['steps']} steps against its reference"
    if not q and config is not None:
        from trainscout.spaces import Context
        changed = changes(config, Context(device=device or "cuda"))
        if changed:
            verb = "changes" if len(changed) == 1 else "change"
            return UNVERIFIED, (f"{', '.join(changed)} {verb} the numerics and the record has no verdict (measured "
                                "before the quality gate)")
    if not q:
        return SAME, "no knob changes the numerics"
    if q.get("gate") in (PASSED, MARGINAL, FAILED):
        what = ", ".join(f"{k}" for k in q["changes"])
        op = "exact" if q.get("op_sqnr_db") is None else f"{q['op_sqnr_db']:.1f} dB"
        ratio, gain = q.get("noise_ratio"), q.get("layer_grad_gain")  # a verdict of an older rule has fewer
        grads = (f", gradients' deviation {ratio:.3g}x the batch-to-batch noise (worst layer)" if ratio is not None
                 else "" if gain is None else f", gradients' gain {gain:.3f} (worst layer)")
        return q["gate"], q.get("why") or (f"one step against its reference ({what}): linear outputs' SQNR {op}, "
                                           f"loss within {q['loss_rel_diff']:.2%}{grads}")
    return UNVERIFIED, q.get("why") or "no verdict"
