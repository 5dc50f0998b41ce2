"""Predicted peak GPU memory per rank of a configuration, before anything is launched.

The analytic part counts bytes the way the engines hold them, from the model's own modules built on the meta device
(predictor/model_tree.py): the engine's model states (weights, gradients, optimizer states, buffers), one micro-batch's
activations (what autograd saves for backward) and the loss's logits, scaled to what is in flight, and adjusted by
the knobs' memory hooks. A calibration fitted on measured peaks of the same GPU (peak = a·states + b·activations +
c) absorbs what the counts miss. The equations and what they were checked against: docs/predictor.md.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

from trainscout.spaces.roles import MemoryTerms
from trainscout.trial.status import Status

if TYPE_CHECKING:
    from trainscout.trial.records import Record, TrialSpec

GiB = 2**30
# A configuration predicted over the GPU's memory by more than this share is not launched by a search, and
# micro_batch_size=max does not probe such a micro-batch (trial/probe.py).
MARGIN = 0.10
# A search's start point (search.start.fits) and the atlas' predictions must be predicted to fit in this share of
# the GPU's memory; where the defaults do not, they add the knobs' memory saver (spaces.memory_savers) predicted
# fastest (predictor/steptime.py) of those that fit the GPU and the host (host_refusal).
FIT_SHARE = 0.85


def counts(config: dict) -> dict:
    """The parameter counts the engines read, from the model's module tree (predictor/model_tree.py): h, L, V; N every
    parameter once; per_layer the largest decoder layer's; embed the input embedding's; cast what autocast copies
    to 16 bits (the linears, the LM head included when it is tied to the embedding); tied."""
    from .model_tree import parameters
    from trainscout.trial.models import sizes
    z, p = sizes(config), parameters(config)
    return {"h": z.hidden, "L": p.layers, "V": z.vocab, "per_layer": p.per_layer, "embed": p.embed, "N": p.N,
            "cast": p.cast, "tied": p.tied, "head_cast": p.embed if p.tied else p.head}


def with_config(spec: TrialSpec | Record) -> TrialSpec | Record:
    """spec with its model config (a stored record of a named model carries none: the named one's)."""
    if spec.model_config is not None:
        return spec
    from trainscout.trial.models import resolve_model
    return spec.replace(model_config=resolve_model(spec.model).config)


def saved_bytes(spec: TrialSpec | Record):
    """What one forward of the spec's model saves for backward, per token (predictor/model_tree.Saved): measured on the
    meta device under the spec's attention and the way its engine computes; measured=False (and why) where the
    formula stands in for a model whose meta forward fails."""
    from trainscout.trial import engines
    from .model_tree import saved
    spec = with_config(spec)
    plan = spec.plan
    compute = "fp32" if plan.precision == "fp32" else engines.get(plan.engine).compute
    compiled = plan.compile_scope if plan.compile else None
    return saved(spec.model_config, plan.attn_implementation, compute, compiled)


def components(spec: TrialSpec | Record) -> dict[str, float]:
    """Bytes per rank by component for a prepared trial spec or a stored record (the rank that holds the most):
    the engine's model states, then one micro-batch's activations and logits (which knobs adjust) scaled to what
    is in flight."""
    return _per_rank(spec)[0]


def host_held(spec: TrialSpec | Record) -> float:
    """Bytes per rank that the knobs' memory hooks moved to host memory (terms["host"]: activation offload's saved
    tensors), besides what the engine keeps there (Engine.offloaded)."""
    return _per_rank(spec)[1]


def _per_rank(spec: TrialSpec | Record) -> tuple[dict[str, float], float]:
    """components() and host_held(): the rank's terms (spaces.roles.MemoryTerms) after every knob's Costs.memory,
    then the engine's model states over what the terms hold of the parameters and its activations in flight."""
    from trainscout.spaces import all_knobs, plugins

    from trainscout.trial import engines
    spec = with_config(spec)
    c, plan = counts(spec.model_config), spec.plan
    engine = engines.get(plan.engine)
    N, layers = engine.held(c, plan)  # the pipeline's stage; the data x context ranks divide below (D)
    terms, layer, view = memory_terms(spec, c, N, layers)
    for knob in all_knobs():
        plugins.memory(knob, terms, plan, view)  # a plugin's hook that raises is left out, with a warning
    out = engine.model_states(dict(c, per_layer=terms.layer_params, cast=terms.cast), plan, terms.params,
                              engine.data_ranks(plan, spec.world_size), plan.precision != "fp32")
    out["activations"], out["logits"] = engine.in_flight(plan, terms.activations, terms.logits)
    every = plan.checkpoint_every
    ckpt = math.ceil(layers / every) if every else 0
    if ckpt:  # a checkpointed layer is recomputed in its backward, after the logits are freed: the larger one counts
        share = terms.layer_activations / ((layers - ckpt) * layer) if layers > ckpt and layer else 1.0  # TP's
        out["activations"] += max(0.0, layer * share - out["logits"])
    return out, terms.host


def memory_terms(spec: TrialSpec | Record, c: dict, N: float, layers: int) -> tuple[MemoryTerms, float, object]:
    """(the rank's terms of one micro-batch before the knobs' hooks, one decoder layer's saved bytes, the spec as the
    hooks see it: its recipe's seq_len the rank's tokens under context parallel), the rank holding N parameters and
    `layers` decoder layers of a model of counts c. Besides activations and logits: layer_policy_saved, one decoder
    layer's matrix-product and attention outputs (what selective checkpointing keeps, model_tree.Saved.policy); cast,
    the parameters whose 16-bit copies autocast keeps on the GPU for backward, and layer_cast, those of them inside the
    decoder layers (the head's outside: activation offload moves the layers' copies to the host); host, where a hook
    adds what it keeps in host memory."""
    from trainscout.spaces import ParallelDims
    plan, recipe = spec.plan, spec.recipe
    # context parallel: each rank holds 1/cp of every sequence's tokens (attention still reads all the keys)
    cp = ParallelDims.of(plan, spec.world_size).degree("cp")
    b, s, V = plan.micro_batch_size, recipe["seq_len"] // cp, c["V"]
    every = plan.checkpoint_every
    ckpt = math.ceil(layers / every) if every else 0
    act = saved_bytes(spec)
    layer = b * s * (act.per_layer + act.per_layer_s * recipe["seq_len"])  # act.layer_bytes(b, s) without cp
    # the loss's backward: fp32 log-softmax output, its incoming and its outgoing gradient at once (mixed or fp32)
    terms = MemoryTerms(activations=(layers - ckpt) * layer + ckpt * act.layer_input * b * s + act.outside * b * s,
                        logits=12 * b * s * V,
                        # what a parallel knob's hook divides (tensor parallel: the layers' weights and activations)
                        params=N, layer_params=c["per_layer"], layers=layers,
                        layer_activations=(layers - ckpt) * layer,
                        layer_policy_saved=b * s * (act.policy + act.policy_s * recipe["seq_len"]), host=0.0,
                        cast=c["cast"], layer_cast=max(0.0, c["cast"] - c["head_cast"]))
    view = spec.replace(recipe=dict(recipe, seq_len=recipe["seq_len"] // cp)) if cp > 1 else spec  # the rank's tokens
    return terms, layer, view


def analytic(spec: TrialSpec | Record) -> float:
    """The analytic sum of components(): bytes per rank, uncalibrated and without predict's workspace allowance."""
    return sum(components(spec).values())


def _features(spec: TrialSpec | Record) -> tuple[float, float]:
    comp = components(spec)
    return (comp["weights"] + comp["gradients"] + comp["optimizer"] + comp["buffers"],
            comp["activations"] + comp["logits"])


def fit(pairs: list[tuple[TrialSpec | Record, float]]) -> dict | None:
    """Calibrate on (spec, measured peak bytes) pairs of one GPU: peak = a·states + b·activations + c."""
    return fit_terms([(*_features(sp), peak) for sp, peak in pairs])


def terms(spec: TrialSpec | Record) -> tuple[float, float]:
    """The two terms the calibration weighs, in bytes: model states (weights, gradients, optimizer, buffers) and
    activations + logits (what fit_terms and predict_terms take, for callers that keep them)."""
    return _features(spec)


def fit_terms(rows: list[tuple[float, float, float]]) -> dict | None:
    """fit() on precomputed (states, activations, measured peak) bytes."""
    if len(rows) < 3:
        return None
    import numpy as np
    X = np.array([[states / GiB, acts / GiB, 1.0] for states, acts, _ in rows])
    y = np.array([peak / GiB for _, _, peak in rows])
    coef, *_ = np.linalg.lstsq(X, y, rcond=None)
    a, b, c = (float(v) for v in coef)
    if a <= 0 or b <= 0:  # too few distinct configurations to separate the terms: scale the analytic sum instead
        k = float(np.median(y / X[:, :2].sum(axis=1)))
        a, b, c = k, k, 0.0
    return {"a": a, "b": b, "c": c * GiB, "n": len(rows)}


def predict(spec: TrialSpec | Record, calibration: dict | None = None) -> float:
    """Predicted peak allocated bytes per rank (what torch.cuda.max_memory_allocated reports)."""
    return predict_terms(*_features(spec), calibration)


def predict_terms(states: float, acts: float, calibration: dict | None = None) -> float:
    """predict() on precomputed terms (bytes)."""
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


def shards_nothing(spec: TrialSpec | Record) -> bool:
    """Whether the spec's engine divides the model states over its data ranks, keeps none of them on the host (FSDP,
    ZeRO without offload) and has one data rank: as a memory saver it shards nothing there, and the start points and
    the atlas leave it out (what it saves on one GPU, autocast's 16-bit copies, is too little: docs/predictor.md)."""
    from trainscout.trial import engines
    spec = with_config(spec)
    c, plan = counts(spec.model_config), spec.plan
    engine = engines.get(plan.engine)
    if engine.data_ranks(plan, spec.world_size) > 1 or any(engine.offloaded(plan)):
        return False
    mixed = plan.precision != "fp32"
    one, two = (sum(engine.model_states(c, plan, c["N"], d, mixed).values()) for d in (1, 2))
    return two < 0.75 * one


HOST_PROCESS = 1.5 * GiB  # a rank's process before its model: Python, torch, transformers, Ray's worker
OFFLOAD_BYTES = 18  # host bytes per offloaded parameter under DeepSpeed's CPU optimizer (see host_peak)


def host_peak(spec: TrialSpec | Record) -> dict[str, float]:
    """Predicted peak host (CPU) memory of a whole trial, all ranks together (they share the host), by component.

    On the CPU every rank's training state lives there: the analytic sum per rank. On a GPU: each rank's process,
    then the larger of the model build (each rank builds its fp32 model on the host before moving it, unless its
    engine builds it on the GPU: Engine.builds_on_device) and what offload keeps there (OFFLOAD_BYTES per offloaded
    parameter for the optimizer, 2 per offloaded 16-bit parameter shard, or the engine's own Engine.host_states),
    plus what the knobs' hooks move to the host (host_held). Cached pinned host memory is released between trials
    (worker.reset_process). The rule and its one measurement: docs/predictor.md."""
    from trainscout.trial import engines
    world = spec.world_size
    spec = with_config(spec)
    c, plan = counts(spec.model_config), spec.plan
    engine = engines.get(plan.engine)
    N, D = c["N"], engine.data_ranks(plan, world)
    optimizer, params = engine.offloaded(plan)
    own = engine.host_states(plan, D, spec.device == "cuda", lambda: param_rows(spec.model_config)) \
        if optimizer or params else None
    if own is None:
        own = (OFFLOAD_BYTES * N / D if optimizer else 0) + (2 * N / D if params else 0)
    # what the knobs' hooks keep on the host (activation offload) is there at the same time as the offloaded states
    offload = world * (own + host_held(spec))
    if spec.device == "cpu":  # the host is the device: the ranks' terms and what an engine "offloads" add up
        return {"processes": world * HOST_PROCESS, "ranks": world * analytic(spec) + offload}
    out = {"processes": world * HOST_PROCESS}
    if not engine.builds_on_device:
        out["build"] = world * 4 * N
    if offload:
        out["offload"] = offload
    return out


def param_rows(config: dict) -> tuple[tuple[int, int], ...]:
    """(rows, elements) of each parameter of the model a config builds (rows: its first dimension, which FSDP2
    shards), from the meta device once per process (model_tree's facts, handed on with them)."""
    from . import model_tree
    at = ("param_rows", model_tree.config_key(config))
    if at not in model_tree.FACTS:
        model = model_tree.meta_model(at[1], "eager", seq_len=1)
        model_tree.FACTS[at] = tuple((int(p.shape[0]) if p.dim() else 1, int(p.numel())) for p in model.parameters())
    return model_tree.FACTS[at]


def host_need(comp: dict[str, float]) -> float:
    """The host bytes host_peak's components add up to: the processes plus the larger of the rest (the model build,
    the offloaded states), as host_peak describes."""
    return comp["processes"] + max((v for k, v in comp.items() if k != "processes"), default=0.0)


def host_refusal(spec: TrialSpec | Record, capacity: float, margin: float = 0.10,
                 per_host: int | None = None) -> str | None:
    """Why a trial would not fit the host's memory (None: it fits): the predicted peak against the capacity less a
    margin for the OS and the driver. per_host: the most ranks one host holds where the trial spans hosts (its
    busiest host's share of the need); None: all of its ranks on one host, as a search's trials are judged."""
    return _host(spec, capacity, margin, per_host)[1]


def _host(spec: TrialSpec | Record, capacity: float, margin: float, per_host: int | None) -> tuple[float, str | None]:
    """(the host bytes judged, host_refusal's why)."""
    comp, world = host_peak(spec), spec.world_size
    on = min(world, per_host) if per_host else world
    need = host_need(comp) if on == world else host_need(comp) * (on / world)
    if need <= capacity * (1 - margin):
        return need, None
    ranks = f"the trial's {world} rank(s)" if on == world else f"{on} of the trial's {world} ranks on each host"
    return need, (f"predicted {need / GiB:.1f} GiB of host memory for {ranks} > {capacity / GiB:.0f} GiB less "
                  f"{margin:.0%} (" + ", ".join(f"{k} {v / GiB:.1f}" for k, v in comp.items()) + " GiB"
                  + ("" if on == world else " for the whole trial") + ")")


def gpu_capacity(hw: dict) -> float | None:
    """The trials' GPU memory in bytes (hw["gpu_memory_gib"]), None on the CPU or where the hardware does not say."""
    return hw["gpu_memory_gib"] * GiB if hw["device"] == "cuda" and hw.get("gpu_memory_gib") else None


def host_capacity(hw: dict) -> float:
    """The trials' host memory in bytes, as a search's driver hands it to them: hw["host_memory_gib"] (a cluster's
    nodes' smallest) where the hardware names it, else this machine's."""
    if hw.get("host_memory_gib"):
        return hw["host_memory_gib"] * GiB
    import psutil
    return float(psutil.virtual_memory().total)


def refusal(spec: TrialSpec, gpu: float | None, host: float | None = None, calibration: dict | None = None,
            share: float = 1 + MARGIN, per_host: int | None = None) -> tuple[str, dict] | None:
    """Why a configuration is not to be launched (None: it fits), the one rule of a search's trials
    (search/trainable), its ranker (search/searcher.make_ranker), its start points (search/start), the probe's
    candidates (trial/probe.candidates), what nothing-fits proposes (search/nearest) and estimate's host verdict
    (cli/measure): (why, what the record keeps: predicted_gib, the GPU's prediction, where gpu is given).

    gpu: the GPU's memory in bytes (None: the CPU, the host's rule alone), over which the prediction (calibrated
    with `calibration`) may go by `share`; host: the host's bytes (None: not judged), host_refusal's rule (the
    capacity less MARGIN, for the OS and the driver; per_host: its busiest host's share where the trial spans
    hosts). Both rules apply wherever one does, and why names every one that refuses. A micro_batch_size=max probe
    is judged at micro-batch 1, the least it would try (its candidates are then judged each at its own size, by
    this rule: trial/probe.candidates), so where even that does not fit every candidate would fail.

    share differs by what a wrong answer costs. A trial (and the ranker, which proposes only what a trial would
    run) is refused only where the model rules it out: predicted more than MARGIN over the GPU; one refused is never
    measured, one let run at the edge costs one out-of-memory error. A start point (FIT_SHARE) is what the search
    measures first and builds on: it must fit, so it is held to a stricter line (docs/predictor.md)."""
    got = judge(spec, gpu, host, calibration, share, per_host)
    reasons = [why for why in (got["gpu"], got["host"]) if why]
    extra = {} if got["gpu_b"] is None else {"predicted_gib": round(got["gpu_b"] / GiB, 2)}
    return ("; ".join(reasons), extra) if reasons else None


def judge(spec: TrialSpec, gpu: float | None, host: float | None = None, calibration: dict | None = None,
          share: float = 1 + MARGIN, per_host: int | None = None) -> dict:
    """refusal()'s rule in its parts, for a caller that also shows the numbers it decides on (search/nearest.py):
    gpu_b, the predicted peak bytes per rank (None without gpu); host_b, the host bytes judged (None without host);
    gpu and host, why each refuses (None: within its line)."""
    from trainscout.spaces import micro_batch
    least = ""
    if spec.plan.micro_batch_probe:
        spec = spec.replace(plan=spec.plan.replace(micro_batch_size=1))
        least = f" at micro-batch 1 ({micro_batch().name}=max tries nothing smaller)"
    out = {"gpu_b": None, "host_b": None, "gpu": None, "host": None}
    if gpu:
        out["gpu_b"] = predicted = predict(spec, calibration)
        if predicted > share * gpu:
            line = f"{gpu / GiB:.0f} GiB + {share - 1:.0%}" if share > 1 else f"{share:.0%} of {gpu / GiB:.0f} GiB"
            out["gpu"] = f"predicted {predicted / GiB:.1f} GiB per rank{least} > {line}"
    if host:
        out["host_b"], why = _host(spec, host, MARGIN, per_host)
        out["host"] = why + least if why else None
    return out


def parse_size(text: str) -> float:
    """A size as typed -> bytes: a number with a unit (GiB, GB, MiB, MB, G for GiB; spaces allowed) or plain bytes."""
    t = str(text).strip().lower().replace(" ", "")
    for unit, mult in (("gib", GiB), ("gb", 1e9), ("mib", 2**20), ("mb", 1e6), ("g", GiB)):
        if t.endswith(unit):
            return float(t[: -len(unit)]) * mult
    return float(t)
