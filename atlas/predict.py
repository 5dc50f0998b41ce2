"""Predictions where the atlas has no measurement: a model, a GPU kind or a GPU count never measured.

Peak memory: the calibrated memory model (predictor/memory.py: peak = a·states + b·activations + c, least squares on
the measured peaks of the GPU kind). Speed: the step-time model (predictor/steptime.py) is a roofline that ranks
configurations and is never a speed by itself (docs/atlas.md). Here it is
calibrated on measured rows: a prediction's step is the roofline's step times the median measured/roofline ratio
of the rows nearest to it — the same configuration family (the knobs' own declarations, backing off level by level
in LEVELS where no row of it is measured; the architecture's family, dense or a mixture of experts, is part of
every level but the last) and, among those, the two measured model shapes nearest in parameter count (another
architecture counts as farther), each row's ratio carried to the configuration by the measured effect of every
knob it differs in (calibrate.knob_effects: pairs of rows, on any GPU kind, that differ in that knob alone, on the
same GPU count, from the model shape nearest). Leave-one-out over the shipped rows shows what that is worth: each row
predicted from the rows of the other models only (its own model held out, as for a model never measured), and from the
other rows (its repeats held out too); `loo.loo_table` prints both.

Everything a row needs is computed once by bench/build_atlas.py (the roofline and the memory terms build the model
on the meta device) and shipped in atlas/model.json, so lookup answers from it without torch; a model
or GPU kind not there builds its own candidates here (seconds).
"""
from __future__ import annotations

from trainscout.spaces.plan import Plan
from trainscout.trial.gpus import gpu_facts, gpu_kind  # a GPU kind's memory and capability
from trainscout.trial.records import TOKENS_PER_S

from .calibrate import NEAREST_MODELS, calibrate, distance, knob_effects, memory_calibration
from .families import DENSE, LEVELS, MOE, arch_family, describe, families, settings
from .loo import leave_one_out, loo_summary
from .samples import Sample, features, row_id, samples

GiB = 2**30
# the farthest a leave-one-model-out prediction reaches over the shipped shapes (the next shape's log distance, and
# another architecture's: docs/atlas.md)
REACH = 1.25
CANDIDATES = 4      # distinct configurations tried for a model never measured


# Host memory a GPU box is assumed to have where the question does not say (lookup --host-memory): GiB per GPU, the
# smaller end of what boxes come with (docs/atlas.md)
HOST_GIB_PER_GPU = 128


def predict_model(model: str, gpu: str, gpus: int, pool: list[Sample], global_batch: int | None = None,
                  capacity_gib: float | None = None, host_memory_gib: float | None = None,
                  avoid: list[dict] | None = None) -> dict:
    """Predicted best configurations of a model on `gpus` GPUs of a kind. Candidates: the configurations of the
    CANDIDATES fastest rows (against their roofline) of the nearest measured models on that kind and count (any
    count where that one was not measured), each at the largest micro-batch that fits in the share of the GPU a
    search's start point uses (predictor.memory.FIT_SHARE) by the calibrated memory model and by the uncalibrated one
    (what `trainscout estimate` and a search without measurements predict); where none fits, with the memory saver
    (spaces.memory_savers) predicted fastest by the step-time model (predictor.steptime, offload's PCIe and host traffic
    included) of those that fit: sharding over the ranks before offload where the GPUs hold it. Every candidate must
    fit the host by the rule a search prunes its trials by (predictor.memory.host_refusal: host_memory_gib, default
    HOST_GIB_PER_GPU per GPU, less predictor.memory.MARGIN). Where nothing fits, on 2, 4, 8 GPUs. Each one's roofline
    step is calibrated (calibrate). Returns {"model", "gpu", "gpus", "rows": [{config, describe, tokens_per_s,
    step_s, peak_memory_gib, host_memory_gib, level, calibrated_on, projected_days, ...}], "notes", "n_params",
    "capacity_gib", "host_memory_gib"}; ConfigError for a GPU kind whose memory is not known without
    capacity_gib. avoid: settings ({knob: value} each) a candidate may not hold all of (those whose quality gate
    failed on this model): the next saver, or the next candidate, instead."""
    from trainscout.predictor import memory
    from trainscout.trial.models import resolve_model
    spec_model = resolve_model(model)
    notes: list[str] = []
    kind = gpu_kind(gpu) or gpu
    on_kind = [s for s in pool if s.gpu == kind]
    if not on_kind:
        notes.append(f"{kind} was never measured: calibrated on the {', '.join(sorted({str(s.gpu) for s in pool}))} "
                     "rows, with the roofline at its datasheet peak and bandwidth; its error is not known")
        on_kind = list(pool)
    capacity_gib, hw_name, capability = _gpu_facts(gpu, kind, capacity_gib)
    n = memory.counts(spec_model.config)["N"]
    arch = spec_model.config.get("model_type")
    kind_of_arch = arch_family(spec_model.config)
    if kind_of_arch == MOE and not any(s.family == MOE for s in on_kind):
        notes.append(f"a mixture of experts ({arch}), calibrated on dense models only: the roofline counts its active "
                     "parameters but not its routing nor its grouped expert GEMMs (a 2.6B qwen3_moe measured 0.47x "
                     "its prediction on the H200, docs/BENCHMARKS.md): measure it")
    shape = (spec_model, n, arch, kind_of_arch)
    rows, host_gib = _fitting(shape, gpus, kind, hw_name, capability, capacity_gib, host_memory_gib, on_kind,
                              global_batch, notes, avoid or [])
    if host_memory_gib is None:
        notes.append(f"host memory assumed {HOST_GIB_PER_GPU} GiB per GPU ({host_gib:.0f} GiB): --host-memory "
                     "gives the box's")
    _calibrate_rows(rows, shape, kind, hw_name, pool, on_kind)
    # a configuration one GPU cannot profit from (a sharding engine over one data rank: memory.shards_nothing) is
    # never ranked first on a prediction: only a measurement that it is faster could put it there
    rows.sort(key=lambda r: (r["shards_nothing"], -r[TOKENS_PER_S]))
    near = min((distance(n, arch, s) for s in on_kind), default=None)
    if near is not None and near > REACH:
        nearest = min(on_kind, key=lambda s: distance(n, arch, s))
        notes.append(f"extrapolated: the nearest measured model ({nearest.model}, {nearest.n_params / 1e6:,.0f} M "
                     f"parameters, against {n / 1e6:,.0f} M) is farther than any the leave-one-out held out: its "
                     "error may be larger than the error shown")
    return {"model": spec_model.name, "gpu": kind, "gpus": rows[0]["gpus"] if rows else gpus, "rows": rows,
            "notes": notes, "n_params": n, "capacity_gib": capacity_gib, "host_memory_gib": host_gib}


def _gpu_facts(gpu: str, kind: str, capacity_gib: float | None) -> tuple[float, str, str]:
    """(its memory in GiB: capacity_gib where given, the name its hardware fingerprint would give, its compute
    capability); ConfigError for a GPU whose memory is not known without capacity_gib."""
    from trainscout.spaces import ConfigError
    facts = gpu_facts(gpu)
    if capacity_gib is None:
        if facts is None:
            raise ConfigError("--gpu", f"--gpu {gpu}: its memory is not known here: give --gpu-memory (e.g. 80GiB)")
        capacity_gib = facts[0]
    hw_name = gpu if gpu_kind(gpu) and gpu_kind(gpu) != gpu else f"NVIDIA {kind}"
    return capacity_gib, hw_name, facts[1] if facts else "9.0"


def _fitting(shape: tuple, gpus: int, kind: str, hw_name: str, capability: str, capacity_gib: float,
             host_memory_gib: float | None, on_kind: list[Sample], global_batch: int | None, notes: list[str],
             avoid: list[dict]) -> tuple[list[dict], float | None]:
    """(the candidates predicted to fit `gpus` GPUs, else 2, 4, 8: the first count where any does, the host memory
    assumed there); each count where none fits noted."""
    from trainscout.spaces import all_knobs
    from trainscout.predictor import memory
    from trainscout.predictor.memory import FIT_SHARE
    spec_model, n, arch, kind_of_arch = shape
    installed = frozenset(p for k in all_knobs() for p in k.runtime.packages)  # the GPU box is assumed to have them
    cap = FIT_SHARE * capacity_gib * GiB
    rows: list[dict] = []
    host_gib = host_memory_gib
    for want in sorted({gpus, *[g for g in (2, 4, 8) if g > gpus]}):
        host_gib = host_memory_gib or HOST_GIB_PER_GPU * want
        hw = {"device": "cuda", "gpu": hw_name, "gpu_memory_gib": capacity_gib, "gpu_count": want,
              "capability": capability, "host_memory_gib": host_gib}
        rows = _candidates(spec_model, want, n, arch, kind_of_arch, on_kind, global_batch, hw, installed, cap, notes,
                           avoid)
        if rows:
            break
        notes.append(f"nothing is predicted to fit {want} x {kind} ({FIT_SHARE:.0%} of {capacity_gib:.1f} GiB, the "
                     f"share a search's start point uses; {host_gib:.0f} GiB of host memory less "
                     f"{memory.MARGIN:.0%})")
    return rows, host_gib


def _calibrate_rows(rows: list[dict], shape: tuple, kind: str, hw_name: str, pool: list[Sample],
                    on_kind: list[Sample]) -> None:
    """Each candidate's roofline step calibrated on the measured rows nearest to it (calibrate), never under the
    host's floor, capped at the MFU of those rows on a GPU kind never measured; its speed, days and MFU set."""
    from trainscout.predictor import flops
    from trainscout.trial import gpus, metrics
    spec_model, n, arch, _ = shape
    count = flops.count(spec_model.config)
    peak_tflops = gpus.gpu_peak_tflops(hw_name)
    effects = knob_effects(pool)  # what each knob alone did, on any GPU kind
    measured_kind = any(s.gpu == kind for s in pool)
    for r in rows:
        same_count = [s for s in on_kind if s.world == r["gpus"]]
        ratio, used, level = calibrate(r.pop("_fam"), n, arch, same_count or on_kind,
                                       settings(r["config"], Plan.from_dict(r["plan"])), effects)
        gpu_s, host_s = r.pop("_roofline_s") * ratio, r.pop("_host_s")
        step = max(gpu_s, host_s)  # never under the host's floor (Sample.predicted_s)
        if host_s > gpu_s:  # said: the step is the engine's host work, not the GPU's (steptime.host_s)
            r["describe"] += f" [host-bound: the engine's hooks take {host_s:.2f} s a step, the GPU {gpu_s:.2f}]"
        fpt = count.per_token(r["tokens_per_step"] // r["global_batch"])  # MFU as the atlas counts it (trial/mfu.py)
        ceiling = max((s.mfu for s in used if s.mfu), default=None)
        mfu = metrics.mfu(r["tokens_per_step"] / step, fpt, peak_tflops, r["gpus"])
        if not measured_kind and ceiling and mfu and mfu > ceiling:
            # a kind never measured runs no nearer its peak than the rows it is calibrated on: their ratio to the
            # roofline, carried to a GPU of another balance of compute and bandwidth (the H20: little compute for
            # its bandwidth), had its FP8 products run above its bf16 peak (MFU > 1), which no record may claim
            step *= mfu / ceiling
            r["describe"] += (f" [capped at MFU {ceiling:.2f}, the highest of the rows it is calibrated on: the "
                              f"roofline carried to {kind} gave {mfu:.2f}]")
        tps = r["tokens_per_step"] / step
        r.update(step_s=step, tokens_per_s=tps, level=level, ratio=ratio, calibrated_on=sorted({s.model for s in used}),
                 calibrated_ids=sorted(s.id for s in used), calibrated_gpus=sorted({str(s.gpu) for s in used}),
                 calibrated_families=sorted({s.family for s in used}),
                 projected_days=r["total_steps"] * step / 86400, mfu=metrics.mfu(tps, fpt, peak_tflops, r["gpus"]),
                 mfu_convention=f"{flops.CONVENTION} (predicted)")


def _candidates(model, gpus: int, n: float, arch: str, kind_of_arch: str, pool: list[Sample], global_batch: int | None,
                hw: dict, installed: frozenset, cap: float, notes: list[str], avoid: list[dict] = ()) -> list[dict]:
    """predict_model's candidates on `gpus` GPUs, each at its largest fitting micro-batch (unsorted, uncalibrated):
    the configurations with the highest MFU (which carries across sizes, as search.service.store_points says) of
    the nearest models' rows; one that does not fit as it is gets the memory saver predicted fastest of those that
    fit (search.start.fits' rule)."""
    from trainscout.spaces import all_knobs
    micro = {k.name for k in all_knobs() if k.search.micro_batch}
    at = [s for s in pool if s.world == gpus] or pool
    out = []
    for s in _picked(at, n, arch):
        base = {k: v for k, v in s.config.items() if k not in micro}
        fitting, why = _fits(model, base, gpus, n, arch, kind_of_arch, pool, global_batch, hw, installed, cap, avoid)
        if not fitting:
            if why:
                notes.append(f"not predicted on {gpus} GPU(s): {s.model}'s {describe(s.config, s.plan)} ({why})")
            continue
        out.append(_candidate_row(s, gpus, kind_of_arch, fitting))
    return out


def _picked(at: list[Sample], n: float, arch: str) -> list[Sample]:
    """The rows whose configurations are tried: the configurations measured on the nearest shapes, then the GPU
    kind's best by MFU on any model (a neighbour measured only in a bench's plain configurations must not hide what
    runs fastest here), CANDIDATES of each (a row whose quality gate failed calibrates speeds, but its configuration
    trains another model: not offered)."""
    by_shape = sorted({s.shape: distance(n, arch, s) for s in at}.items(), key=lambda kv: (kv[1], kv[0]))
    near = {shape for shape, _ in by_shape[:NEAREST_MODELS]}
    picked, seen = [], set()
    ok = [s for s in at if not s.gate_failed]
    for group in ([s for s in ok if s.shape in near], [s for s in ok if s.shape not in near]):
        took = 0
        for s in sorted(group, key=lambda s: (-(s.mfu or 0), s.id)):
            if took == CANDIDATES:
                break
            if s.fam[0] not in seen:
                seen.add(s.fam[0])
                picked.append(s)
                took += 1
    return picked


def _fits(model, base: dict, gpus: int, n: float, arch: str, kind_of_arch: str, pool: list[Sample],
          global_batch: int | None, hw: dict, installed: frozenset, cap: float, avoid: list[dict]) -> tuple[list, str]:
    """(the ways base fits, each (lowers the kept state, predicted step, saver's rank, saver's settings, spec, peak
    bytes, GPU step, host step); why it does not, where no way does): as measured, else with each memory saver."""
    from trainscout.spaces import memory_savers
    from trainscout.predictor import dtypes, memory, steptime
    host = hw["host_memory_gib"] * GiB
    fitting, why = [], None
    for rank, extra in enumerate(({}, *memory_savers())):
        settings = _clear(avoid, {**base, **extra}, extra)
        spec, mem, why_not, refused = largest_fit(model, settings, gpus, global_batch, hw, installed,
                                                  lambda fam: memory_calibration(fam, n, arch, pool), cap, host,
                                                  kind_of_arch, keep=set(extra))
        if spec is None:
            if refused and not extra:
                why = why_not
                break  # the model or the GPU refuses the configuration itself: no saver changes that
            why = why or why_not
            continue
        if extra and memory.shards_nothing(spec):
            continue  # sharding over one rank: offload is one GPU's saver
        if any(all(spec.config.get(k) == v for k, v in f.items()) for f in avoid):
            continue  # its numerics change failed the quality gate on this model (_clear could not undo it)
        gpu_s, host_s = steptime.step_s(spec), steptime.host_s(spec)
        fitting.append((dtypes.lowers_state(spec.plan), max(gpu_s, host_s), rank, extra, spec, mem, gpu_s, host_s))
        if not extra:
            break  # the configuration as measured fits: no saver
    return fitting, why


def _candidate_row(s: Sample, gpus: int, kind_of_arch: str, fitting: list) -> dict:
    """The candidate the ways it fits offer (dtypes.prefer: fp32 states kept, fastest predicted, the savers' order),
    uncalibrated."""
    from trainscout.spaces import fmt
    from trainscout.predictor import dtypes, memory
    from trainscout.trial import engines
    _, _, _, extra, spec, mem, gpu_s, host_s = dtypes.prefer(fitting)
    fitted = " [to fit: " + " ".join(f"{k}={fmt(v)}" for k, v in extra.items()) + "]" if extra else ""
    host_need = memory.host_need(memory.host_peak(spec))
    offload = f" [needs {host_need / GiB:.0f} GiB of host memory]" if any(
        engines.get(spec.plan.engine).offloaded(spec.plan)) else ""
    return {"config": spec.config, "plan": spec.plan.to_dict(), "gpus": gpus,
            "describe": describe(spec.config, spec.plan) + fitted + offload, "peak_memory_gib": mem / GiB,
            "estimate_gib": memory.predict(spec) / GiB, "host_memory_gib": host_need / GiB,
            "tokens_per_step": spec.tokens_per_step, "global_batch": spec.recipe["global_batch"],
            "total_steps": spec.recipe["total_steps"], "from": s.model,
            "savers_fitting": len(fitting) - (0 if extra else 1),
            "shards_nothing": bool(memory.shards_nothing(spec)),
            "_fam": families(spec.config, spec.plan, gpus, kind_of_arch),
            "_roofline_s": gpu_s, "_host_s": host_s}


def _clear(avoid, settings: dict, extra: dict) -> dict:
    """settings with the knobs of an avoided set they hold all of (a change whose quality gate failed on this
    model) back at their defaults, the saver's own (extra) kept: FP8 off beside the precision=bf16 a 7B needs."""
    from trainscout.spaces import get
    for f in avoid:
        if all(settings.get(k) == v for k, v in f.items()):
            settings = {**settings, **{k: get(k).default for k in f if k not in extra}}
    return settings


def largest_fit(model, settings: dict, gpus: int, global_batch: int | None, hw: dict, installed: frozenset,
                calibration, cap: float, host: float, kind_of_arch: str = DENSE, keep: set | None = None):
    """(spec, predicted peak bytes, None, False) at the largest micro-batch predicted within cap bytes by the
    calibrated memory model and by the uncalibrated one (trainscout estimate's, a fresh search's), on a host of
    `host` bytes by predictor.memory.host_refusal, the search's rule; or (None, None, why not, refused): refused=True
    where a knob rule refuses the configuration on this model and GPU, False where it does not fit.
    calibration(fam): the memory calibration of a family. A knob the saver (keep) does not set that the saver's
    settings refuse (the whole model compiled under DeepSpeed, not its layers) goes back to its default, once."""
    from trainscout.spaces import ConfigError, Context
    from trainscout.predictor import memory
    from trainscout.trial import prepare
    batch = global_batch or model.recipe.global_batch
    dp = Context(world_size=gpus).data_parallel_ranks(settings)  # the world over pipeline, tensor, context degrees
    per_rank = batch // dp if batch % dp == 0 else batch
    from trainscout.spaces import all_knobs
    knobs = {k.name: k for k in all_knobs()}
    mb = next(k.name for k in knobs.values() if k.search.micro_batch)
    smallest, reset, host_why = None, set(), None
    for mbs in [d for d in range(min(per_rank, 256), 0, -1) if per_rank % d == 0]:
        while True:
            try:
                spec = prepare(model, {**settings, mb: mbs}, workers=gpus, hw=hw, global_batch=batch,
                               installed=installed)
                break
            except ConfigError as e:
                if e.field == mb:
                    spec = None
                    break
                if e.field in knobs and e.field in settings and e.field not in (keep or set()) | reset and \
                        settings[e.field] != knobs[e.field].default:
                    reset.add(e.field)
                    settings = {**settings, e.field: knobs[e.field].default}
                    continue
                return None, None, str(e), True
        if spec is None:
            continue
        over_host = memory.host_refusal(spec, host, memory.MARGIN)  # grows with the micro-batch where a knob
        if over_host:  # keeps activations on the host (activation offload): a smaller one may fit
            host_why = over_host
            continue
        got = calibration(families(spec.config, spec.plan, gpus, kind_of_arch))
        mem = memory.predict_terms(*memory.terms(spec), got[0] if got else None)
        if mem <= cap and memory.predict(spec) <= cap:
            return spec, mem, None, False
        smallest = (mbs, max(mem, memory.predict(spec)))
    if smallest is None and host_why:
        return None, None, host_why, False
    if smallest is None:
        return None, None, "no micro-batch divides the batch", True
    return (None, None, f"predicted {smallest[1] / GiB:.1f} GiB at micro-batch {smallest[0]} > {cap / GiB:.1f} GiB",
            False)


# --- what bench/build_atlas.py ships ----------------------------------------------------------------------------
def build_model(rows: list[dict], log=print, feats: dict | None = None, predict: bool = True) -> dict:
    """atlas/model.json from the shipped rows: each ok row's features, the memory calibration per GPU kind, the
    leave-one-out results and summaries, and the predictions for every named model no row measured (one GPU of
    each measured kind, the model's recipe). feats: the features already computed (bench/build_atlas.py --check
    --fast: the shipped ones), predict=False: no predictions (an empty dict)."""
    import time
    from trainscout.trial.models import PYTHIA
    from trainscout.trial.records import Record
    t0 = time.time()
    if feats is None:
        feats = {}
        for row in rows:
            if row["record"].get("status") == "ok":
                feats[row_id(row)] = features(Record.from_dict(row["record"]))
        log(f"  features of {len(feats)} ok rows: {time.time() - t0:.0f} s")
    pool = samples(rows, feats)
    loo = {hold: leave_one_out(pool, hold) for hold in ("model", "row")}
    kinds = sorted({s.gpu for s in pool if s.gpu})
    measured = {s.model for s in pool} | {s.shape for s in pool}
    predictions = {}
    for kind in kinds if predict else ():
        for name in PYTHIA:
            if name in measured:
                continue
            t0 = time.time()
            predictions[f"{name}|{kind}|1"] = predict_model(name, f"NVIDIA {kind}", 1, pool)
            log(f"  predicted {name} on 1 x {kind}: {time.time() - t0:.1f} s")
    return {"schema": 1, "features": feats,
            "loo": loo, "loo_summary": {hold: {"all": loo_summary(res),
                                               **{str(lv): loo_summary(res, lv) for lv in range(len(LEVELS))}}
                                        for hold, res in loo.items()},
            "loo_by": {hold: {f"{g}|{fm}": loo_summary(res, gpu=g, family=fm)
                              for g in sorted({str(r["gpu"]) for r in res}) for fm in (DENSE, MOE)
                              if any(str(r["gpu"]) == g and r["family"] == fm for r in res)}
                       for hold, res in loo.items()},
            "predictions": predictions}
