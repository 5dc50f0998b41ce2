"""Predictions where the atlas has no measurement: a model, a GPU kind or a GPU count never measured.

Peak memory: the calibrated memory model (trial/memory.py: peak = a·states + b·activations + c, least squares on
the measured peaks of the GPU kind). Speed: the step-time model (trial/steptime.py) is a roofline that ranks
configurations and is never a speed by itself (it predicts ~1.5-2x the measured tokens/s on the H200). Here it is
calibrated on measured rows: a prediction's step is the roofline's step times the median measured/roofline ratio
of the rows nearest to it — the same configuration family (FAMILY, backing off level by level in LEVELS where no
row of it is measured) and, among those, the two measured model shapes nearest in parameter count (another
architecture counts as farther). Leave-one-out over the shipped rows shows what that is worth: each row predicted
from the rows of the other models only (its own model held out, as for a model never measured), and from the other
rows (its repeats held out too); `loo_table` prints both.

Everything a row needs is computed once by bench/build_atlas.py (the roofline and the memory terms build the model
on the meta device, ~1 s a row) and shipped in atlas/model.json, so lookup answers from it without torch; a model
or GPU kind not there builds its own candidates here (seconds).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from trainscout.spaces.plan import Plan
from trainscout.trial.metrics import gpu_facts, gpu_kind  # a GPU kind's memory and capability

GiB = 2**30
NEAREST_MODELS = 2  # model shapes whose rows calibrate a prediction
# the farthest a leave-one-model-out prediction reaches over the shipped shapes: log(6.9B / 2.8B) = 0.9 (the next
# shape's), and another architecture at log(1.24B / 1.01B) + 1 = 1.2 (the Llama-1B shape from Pythia-1B)
REACH = 1.25
CANDIDATES = 4      # distinct configurations tried for a model never measured


# --- configuration families -------------------------------------------------------------------------------
def plan_of(rec: dict) -> Plan:
    """A stored record's plan (a row's "record"), read as today's Plan whatever form it was stored in."""
    return Plan.from_dict(rec.get("plan") or {})


def _scope(plan: Plan) -> str | None:
    if not plan.compile:
        return None
    if plan.compile_scope == "auto":
        return "model" if plan.engine == "deepspeed" else "layers"
    return plan.compile_scope


def _ckpt(plan: Plan) -> str:
    every = plan.checkpoint_every
    return "none" if not every else "full" if every == 1 else "partial"


FAMILY = {  # what a configuration family is made of, read from a record's config and plan
    "gpus": lambda c, p, w: w,
    "engine": lambda c, p, w: p.engine,
    "zero": lambda c, p, w: p.engine_config.get("stage", 0) if p.engine == "deepspeed" else 0,
    "offload": lambda c, p, w: (bool(c.get("offload_optimizer")), bool(c.get("offload_params"))),
    "fsdp": lambda c, p, w: c.get("fsdp", "off"),
    "pipeline": lambda c, p, w: (c.get("pipeline_stages", 1), c.get("pipeline_schedule") if
                                 (c.get("pipeline_stages") or 1) > 1 else None),
    "compile": lambda c, p, w: _scope(p),
    "loss": lambda c, p, w: c.get("loss_kernel", "eager"),
    "fp8": lambda c, p, w: c.get("fp8", "off"),
    "precision": lambda c, p, w: c.get("precision"),
    "ckpt": lambda c, p, w: _ckpt(p),
    "attention": lambda c, p, w: (c.get("attention"), c.get("sdpa_backend", "auto")),
    "tf32": lambda c, p, w: c.get("tf32"),
}
LEVELS = (  # most specific first: a prediction is calibrated at the first level with measured rows
    tuple(FAMILY),
    ("gpus", "engine", "zero", "offload", "fsdp", "pipeline", "compile", "loss", "fp8", "precision", "ckpt"),
    ("gpus", "engine", "compile", "loss", "fp8", "precision", "ckpt"),
    ("gpus", "compile", "loss", "fp8", "precision"),
    ("compile", "fp8"),
    (),
)


def family(config: dict, plan: Plan, world_size: int, level: int = 0) -> tuple:
    """A configuration's family at a level of LEVELS (micro-batch and accumulation are never part of it)."""
    return tuple((name, FAMILY[name](config, plan, world_size)) for name in LEVELS[level])


def describe(config: dict, plan: Plan) -> str:
    """A configuration in a few words: what differs from the defaults, and the micro-batch it ran."""
    parts = []
    scope = _scope(plan)
    if scope:
        parts.append(f"compile {scope}")
    if config.get("loss_kernel", "eager") != "eager":
        parts.append(f"loss {config['loss_kernel']}")
    if config.get("fp8", "off") != "off":
        parts.append(f"fp8 {config['fp8']}")
    if config.get("zero_stage"):
        parts.append(f"ZeRO-{config['zero_stage']}")
    if config.get("fsdp", "off") != "off":
        parts.append(f"FSDP2 {config['fsdp']}")
    if config.get("offload_optimizer"):
        parts.append("offload optimizer")
    if config.get("offload_params"):
        parts.append("offload params")
    if (config.get("pipeline_stages") or 1) > 1:
        parts.append(f"pipeline {config['pipeline_stages']} {config.get('pipeline_schedule')}")
    ck = _ckpt(plan)
    if ck != "none":
        parts.append(f"checkpointing {config.get('activation_checkpointing')}")
    if config.get("precision") not in (None, "bf16-mixed"):
        parts.append(str(config["precision"]))
    if config.get("attention") not in (None, "sdpa"):
        parts.append(f"attention {config['attention']}")
    if config.get("sdpa_backend") not in (None, "auto"):
        parts.append(f"sdpa {config['sdpa_backend']}")
    if config.get("tf32") is False:
        parts.append("tf32 off")
    parts.append(f"mbs {plan.micro_batch_size}" + (" (probed)" if plan.micro_batch_probe else ""))
    return ", ".join(parts)


# --- samples: a measured row as the predictions read it -----------------------------------------------------
@dataclass
class Sample:
    """One ok measurement with the model terms it is predicted from."""

    id: str
    key: str
    model: str
    shape: str          # the model's identity: the same shape, the same model (a name or a config file)
    arch: str
    n_params: float
    gpu: str | None     # its GPU kind
    world: int
    fam: tuple          # family() at every level
    config: dict        # its knob settings
    plan: Plan
    roofline_s: float   # steptime.step_s
    step_s: float       # measured (projected full step)
    tokens_per_step: int
    states: float
    acts: float
    peak: float | None  # measured peak bytes (the fullest rank), None where not recorded
    mfu: float | None   # recomputed (trainscout.trial.mfu), from the row's derived values

    @property
    def ratio(self) -> float:
        return self.step_s / self.roofline_s

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_per_step / self.step_s


def row_id(row: dict) -> str:
    """A row's identity in model.json: its key and its trial."""
    return f"{row['key']}:{row['record'].get('trial_id')}"


SHAPE_KEYS = ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
              "intermediate_size", "vocab_size", "tie_word_embeddings", "rotary_pct", "use_parallel_residual",
              "head_dim", "num_local_experts", "num_experts", "num_experts_per_tok")


def shape_of(model_config: dict | None) -> str:
    """The model's identity across names: the sizes that make it (a config.json of the same shape is the model)."""
    import json
    c = model_config or {}
    return json.dumps({k: c.get(k) for k in SHAPE_KEYS if c.get(k) is not None}, sort_keys=True)


def features(record) -> dict:
    """What the predictions read of a measured row, computed once (the model on the meta device): the roofline
    step, the memory model's two terms, the parameter count."""
    from trainscout.trial import memory, steptime
    from trainscout.trial.models import sizes
    spec = memory._with_config(record)
    states, acts = memory.terms(spec)
    return {"roofline_s": steptime.step_s(spec), "states": states, "acts": acts,
            "n_params": memory._counts(spec.model_config)["N"], "layers": sizes(spec.model_config).layers,
            "arch": spec.model_config.get("model_type")}


def samples(rows: list[dict], feats: dict[str, dict]) -> list[Sample]:
    """The ok rows that have features, as Samples."""
    out = []
    for row in rows:
        rec, f = row["record"], feats.get(row_id(row))
        m = rec.get("metrics") or {}
        if rec.get("status") != "ok" or not f or not m.get("step_s"):
            continue
        peaks = m.get("peak_allocated_mib")
        plan, world = plan_of(rec), rec.get("world_size") or 1
        out.append(Sample(
            id=row_id(row), key=row["key"], model=rec["model"], shape=shape_of(rec.get("model_config")) or rec["model"],
            arch=f["arch"], n_params=f["n_params"], gpu=gpu_kind(row["provenance"].get("gpu")), world=world,
            fam=tuple(family(rec["config"], plan, world, lv) for lv in range(len(LEVELS))), config=rec["config"], plan=plan,
            roofline_s=f["roofline_s"], step_s=m["step_s"],
            tokens_per_step=rec["recipe"]["global_batch"] * rec["recipe"]["seq_len"],
            states=f["states"], acts=f["acts"], peak=max(peaks) * 2**20 if peaks else None,
            mfu=(row.get("derived") or {}).get("mfu")))
    return out


def _distance(n: float, arch: str, s: Sample) -> float:
    return abs(math.log(n / s.n_params)) + (0.0 if arch == s.arch else 1.0)


def calibrate(fam: tuple, n_params: float, arch: str, pool: list[Sample]) -> tuple[float, list[Sample], int] | None:
    """The roofline's measured/predicted ratio for a configuration (fam: family() at every level) of a model
    (n_params, arch), from the pool: the first level with rows, the rows of its NEAREST_MODELS nearest shapes,
    their median ratio. (ratio, the rows used, the level); None for an empty pool."""
    from trainscout.trial.metrics import median
    for level in range(len(LEVELS)):
        same = [s for s in pool if s.fam[level] == fam[level]]
        if not same:
            continue
        shapes = sorted({s.shape: _distance(n_params, arch, s) for s in same}.items(), key=lambda kv: (kv[1], kv[0]))
        near = {shape for shape, _ in shapes[:NEAREST_MODELS]}
        used = [s for s in same if s.shape in near]
        return median([s.ratio for s in used]), used, level
    return None


MEMORY_LEVELS = (  # what a measured peak carries to another model: the engine, what is compiled, checkpointing
    ("gpus", "engine", "zero", "offload", "fsdp", "pipeline", "compile", "loss", "fp8", "precision", "ckpt",
     "attention"),
    ("gpus", "engine", "zero", "offload", "fsdp", "pipeline", "compile", "loss", "ckpt"),
    ("engine", "zero", "offload", "fsdp", "pipeline", "compile", "ckpt"),
    ("engine", "compile", "ckpt"),
    ("compile",),
    (),
)


def _memory_family(fam: tuple, names: tuple) -> tuple:
    full = dict(fam[0])
    return tuple(full[n] for n in names)


def memory_calibration(fam: tuple, n_params: float, arch: str, pool: list[Sample]) -> tuple[dict, int] | None:
    """The memory model's calibration for a configuration, from the measured peaks nearest to it: the first
    MEMORY_LEVELS family with measured peaks, the NEAREST_MODELS nearest shapes, their median measured/analytic
    ratio as trial/memory.py's calibration (a = b = the ratio, c = 0). Leave-one-out over the shipped H200 rows:
    median |error| 2.0 % against 10.2 % for one least-squares fit over all of them (fit_terms), whose worst rows
    are the ones the analytic terms model least (the whole model compiled, checkpointing with a compiled loss).
    (calibration, level); None where the pool has no peak."""
    from trainscout.trial.metrics import median
    for level, names in enumerate(MEMORY_LEVELS):
        same = [s for s in pool if s.peak and _memory_family(s.fam, names) == _memory_family(fam, names)]
        if not same:
            continue
        shapes = sorted({s.shape: _distance(n_params, arch, s) for s in same}.items(), key=lambda kv: (kv[1], kv[0]))
        near = {shape for shape, _ in shapes[:NEAREST_MODELS]}
        used = [s for s in same if s.shape in near]
        k = median([s.peak / (s.states + s.acts) for s in used])
        return {"a": k, "b": k, "c": 0.0, "n": len(used), "level": level}, level
    return None


def memory_fit(pool: list[Sample]) -> dict | None:
    """One least-squares calibration of the memory model over the pool's measured peaks (trial/memory.py
    fit_terms): what the search fits on a store; the leave-one-out table compares it with memory_calibration."""
    from trainscout.trial import memory
    return memory.fit_terms([(s.states, s.acts, s.peak) for s in pool if s.peak])


# --- leave-one-out --------------------------------------------------------------------------------------------
def leave_one_out(pool: list[Sample], hold: str) -> list[dict]:
    """Each sample predicted without itself: hold="model" leaves out every row of its model (a model never
    measured), hold="row" its own key (the row and its repeats). Per row: the level calibrated at, the signed
    relative errors of tokens/s and peak memory (None where no peak was recorded)."""
    from trainscout.trial import memory
    out = []
    for s in pool:
        rest = [x for x in pool if (x.shape != s.shape if hold == "model" else x.key != s.key) and x.gpu == s.gpu]
        got = calibrate(s.fam, s.n_params, s.arch, rest)
        if got is None:
            continue
        ratio, used, level = got
        tps = s.tokens_per_step / (s.roofline_s * ratio)
        mem = fitted = None
        if s.peak:
            cal = memory_calibration(s.fam, s.n_params, s.arch, rest)
            mem = memory.predict_terms(s.states, s.acts, cal[0]) if cal else None
            fitted = memory.predict_terms(s.states, s.acts, memory_fit(rest))
        out.append({"id": s.id, "model": s.model, "level": level, "tps_err": tps / s.tokens_per_s - 1,
                    "mem_err": None if mem is None else mem / s.peak - 1,
                    "mem_fit_err": None if fitted is None else fitted / s.peak - 1})
    return out


def summary(errors: list[float]) -> dict:
    """n, the median |error| and the worst error (signed) of a list of relative errors."""
    from trainscout.trial.metrics import median
    if not errors:
        return {"n": 0, "median_abs": None, "worst": None}
    return {"n": len(errors), "median_abs": median([abs(e) for e in errors]), "worst": max(errors, key=abs)}


def loo_summary(results: list[dict], level: int | None = None) -> dict:
    """The tokens/s and memory error summaries of leave_one_out's results (at one calibration level, or all)."""
    sel = [r for r in results if level is None or r["level"] == level]
    return {"tokens_per_s": summary([r["tps_err"] for r in sel]),
            "peak_memory": summary([r["mem_err"] for r in sel if r["mem_err"] is not None]),
            "peak_memory_one_fit": summary([r["mem_fit_err"] for r in sel if r.get("mem_fit_err") is not None])}


# --- a model never measured -------------------------------------------------------------------------------------
# Host memory a GPU box is assumed to have where the question does not say (lookup --host-memory): per GPU, the
# smaller end of what boxes come with (one H100 in 128 GiB; a DGX H100 has 2 TiB for 8)
HOST_GIB_PER_GPU = 128


def predict_model(model: str, gpu: str, gpus: int, pool: list[Sample], global_batch: int | None = None,
                  capacity_gib: float | None = None, host_memory_gib: float | None = None) -> dict:
    """Predicted best configurations of a model on `gpus` GPUs of a kind. Candidates: the configurations of the
    CANDIDATES fastest rows (against their roofline) of the nearest measured models on that kind and count (any
    count where that one was not measured), each at the largest micro-batch that fits in the share of the GPU a
    search's start point uses (trial.memory.FIT_SHARE) by the calibrated memory model and by the uncalibrated one
    (what `trainscout estimate` and a search without measurements predict); where none fits, with the memory saver
    (spaces.memory_savers) predicted fastest by the step-time model (trial.steptime, offload's PCIe and host traffic
    included) of those that fit: sharding over the ranks before offload where the GPUs hold it. Every candidate must
    fit the host by the rule a search prunes its trials by (trial.memory.host_refusal: host_memory_gib, default
    HOST_GIB_PER_GPU per GPU, less trial.memory.MARGIN). Where nothing fits, on 2, 4, 8 GPUs. Each one's roofline
    step is calibrated (calibrate). Returns {"model", "gpu", "gpus", "rows": [{config, describe, tokens_per_s,
    step_s, peak_memory_gib, host_memory_gib, level, calibrated_on, projected_days, ...}], "notes", "n_params",
    "capacity_gib", "host_memory_gib"}; ConfigError for a GPU kind whose memory is not known without
    capacity_gib."""
    from trainscout.spaces import ConfigError, all_knobs
    from trainscout.trial import memory
    from trainscout.trial.memory import FIT_SHARE
    from trainscout.trial.models import resolve_model, sizes
    spec_model = resolve_model(model)
    notes: list[str] = []
    kind = gpu_kind(gpu) or gpu
    on_kind = [s for s in pool if s.gpu == kind]
    if not on_kind:
        notes.append(f"{kind} was never measured: calibrated on the {', '.join(sorted({str(s.gpu) for s in pool}))} "
                     "rows, with the roofline at its datasheet peak and bandwidth; its error is not known")
        on_kind = list(pool)
    facts = gpu_facts(gpu)
    if capacity_gib is None:
        if facts is None:
            raise ConfigError("--gpu", f"--gpu {gpu}: its memory is not known here: give --gpu-memory (e.g. 80GiB)")
        capacity_gib = facts[0]
    hw_name = gpu if gpu_kind(gpu) and gpu_kind(gpu) != gpu else f"NVIDIA {kind}"
    capability = facts[1] if facts else "9.0"
    installed = frozenset(p for k in all_knobs() for p in k.packages)  # the GPU box is assumed to have them
    n = memory._counts(spec_model.config)["N"]
    arch = spec_model.config.get("model_type")
    if sizes(spec_model.config).experts and not any(s.arch == arch for s in on_kind):
        notes.append(f"a mixture of experts ({arch}), calibrated on dense models only: the roofline counts its active "
                     "parameters but not its routing nor its grouped expert GEMMs (a 2.6B qwen3_moe measured 0.47x "
                     "its prediction on the H200, docs/BENCHMARKS.md): measure it")
    cap = FIT_SHARE * capacity_gib * GiB
    rows: list[dict] = []
    host_gib = host_memory_gib
    for want in sorted({gpus, *[g for g in (2, 4, 8) if g > gpus]}):
        host_gib = host_memory_gib or HOST_GIB_PER_GPU * want
        hw = {"device": "cuda", "gpu": hw_name, "gpu_memory_gib": capacity_gib, "gpu_count": want,
              "capability": capability, "host_memory_gib": host_gib}
        rows = _candidates(spec_model, want, n, arch, on_kind, global_batch, hw, installed, cap, notes)
        if rows:
            break
        notes.append(f"nothing is predicted to fit {want} x {kind} ({FIT_SHARE:.0%} of {capacity_gib:.1f} GiB, the "
                     f"share a search's start point uses; {host_gib:.0f} GiB of host memory less "
                     f"{memory.MARGIN:.0%})")
    if host_memory_gib is None:
        notes.append(f"host memory assumed {HOST_GIB_PER_GPU} GiB per GPU ({host_gib:.0f} GiB): --host-memory "
                     "gives the box's")
    from trainscout.trial import flops, metrics
    count = flops.count(spec_model.config)
    peak_tflops = metrics.gpu_peak_tflops(hw_name)
    for r in rows:
        same_count = [s for s in on_kind if s.world == r["gpus"]]
        ratio, used, level = calibrate(r.pop("_fam"), n, arch, same_count or on_kind)
        step = r.pop("_roofline_s") * ratio
        tps = r["tokens_per_step"] / step
        fpt = count.per_token(r["tokens_per_step"] // r["global_batch"])  # MFU as the atlas counts it (trial/mfu.py)
        r.update(step_s=step, tokens_per_s=tps, level=level, ratio=ratio, calibrated_on=sorted({s.model for s in used}),
                 projected_days=r["total_steps"] * step / 86400, mfu=metrics.mfu(tps, fpt, peak_tflops, r["gpus"]),
                 mfu_convention=f"{flops.CONVENTION} (predicted)")
    rows.sort(key=lambda r: -r["tokens_per_s"])
    near = min((_distance(n, arch, s) for s in on_kind), default=None)
    if near is not None and near > REACH:
        nearest = min(on_kind, key=lambda s: _distance(n, arch, s))
        notes.append(f"extrapolated: the nearest measured model ({nearest.model}, {nearest.n_params / 1e6:,.0f} M "
                     f"parameters, against {n / 1e6:,.0f} M) is farther than any the leave-one-out held out: its "
                     "error may be larger than the error shown")
    return {"model": spec_model.name, "gpu": kind, "gpus": rows[0]["gpus"] if rows else gpus, "rows": rows,
            "notes": notes, "n_params": n, "capacity_gib": capacity_gib, "host_memory_gib": host_gib}


def _candidates(model, gpus: int, n: float, arch: str, pool: list[Sample], global_batch: int | None, hw: dict,
                installed: frozenset, cap: float, notes: list[str]) -> list[dict]:
    """predict_model's candidates on `gpus` GPUs, each at its largest fitting micro-batch (unsorted, uncalibrated):
    the configurations with the highest MFU (which carries across sizes, as search.service.store_points says) of
    the nearest models' rows; one that does not fit as it is gets the memory saver predicted fastest of those that
    fit (search.start.fits' rule)."""
    from trainscout.spaces import fmt, memory_savers
    from trainscout.trial import engines, memory, steptime
    at = [s for s in pool if s.world == gpus] or pool
    by_shape = sorted({s.shape: _distance(n, arch, s) for s in at}.items(), key=lambda kv: (kv[1], kv[0]))
    near = {shape for shape, _ in by_shape[:NEAREST_MODELS]}
    source = sorted((s for s in at if s.shape in near), key=lambda s: (-(s.mfu or 0), s.id))
    picked, seen = [], set()
    for s in source:
        if s.fam[0] not in seen:
            seen.add(s.fam[0])
            picked.append(s)
        if len(picked) == CANDIDATES:
            break
    host = hw["host_memory_gib"] * GiB
    out = []
    for s in picked:
        base = {k: v for k, v in s.config.items() if k != "micro_batch_size"}
        fitting, why = [], None
        for rank, extra in enumerate(({}, *memory_savers())):
            settings = {**base, **extra}
            if settings.get("zero_stage") and settings.get("compile_scope") == "layers":
                settings["compile_scope"] = "auto"  # DeepSpeed compiles the whole model (compile_scope's rule)
            spec, mem, why_not, refused = _largest_fit(model, settings, gpus, global_batch, hw, installed,
                                                       lambda fam: memory_calibration(fam, n, arch, pool), cap, host)
            if spec is None:
                if refused and not extra:
                    why = why_not
                    break  # the model or the GPU refuses the configuration itself: no saver changes that
                why = why or why_not
                continue
            if extra and memory.shards_nothing(spec):
                continue  # sharding over one rank: offload is one GPU's saver
            fitting.append((steptime.step_s(spec), rank, extra, spec, mem))
            if not extra:
                break  # the configuration as measured fits: no saver
        if not fitting:
            if why:
                notes.append(f"not predicted on {gpus} GPU(s): {s.model}'s {describe(s.config, s.plan)} ({why})")
            continue
        step, _, extra, spec, mem = min(fitting, key=lambda f: f[:2])  # fastest predicted; ties in the savers' order
        fitted = " [to fit: " + " ".join(f"{k}={fmt(v)}" for k, v in extra.items()) + "]" if extra else ""
        host_need = memory.host_need(memory.host_peak(spec))
        offload = f" [needs {host_need / GiB:.0f} GiB of host memory]" if any(
            engines.get(spec.plan.engine).offloaded(spec.plan)) else ""
        out.append({"config": spec.config, "plan": spec.plan.to_dict(), "gpus": gpus,
                    "describe": describe(spec.config, spec.plan) + fitted + offload, "peak_memory_gib": mem / GiB,
                    "estimate_gib": memory.predict(spec) / GiB, "host_memory_gib": host_need / GiB,
                    "tokens_per_step": spec.tokens_per_step, "global_batch": spec.recipe["global_batch"],
                    "total_steps": spec.recipe["total_steps"], "from": s.model,
                    "savers_fitting": len(fitting) - (0 if extra else 1),
                    "_fam": tuple(family(spec.config, spec.plan, gpus, lv) for lv in range(len(LEVELS))),
                    "_roofline_s": step})
    return out


def _largest_fit(model, settings: dict, gpus: int, global_batch: int | None, hw: dict, installed: frozenset,
                 calibration, cap: float, host: float):
    """(spec, predicted peak bytes, None, False) at the largest micro-batch predicted within cap bytes by the
    calibrated memory model and by the uncalibrated one (trainscout estimate's, a fresh search's), on a host of
    `host` bytes by trial.memory.host_refusal, the search's rule; or (None, None, why not, refused): refused=True
    where a knob rule refuses the configuration on this model and GPU, False where it does not fit.
    calibration(fam): the memory calibration of a family."""
    from trainscout.spaces import ConfigError, Context
    from trainscout.trial import memory, prepare
    batch = global_batch or model.recipe.global_batch
    dp = Context(world_size=gpus).data_parallel_ranks(settings)  # the world over pipeline, tensor, context degrees
    per_rank = batch // dp if batch % dp == 0 else batch
    smallest = None
    for mbs in [d for d in range(min(per_rank, 256), 0, -1) if per_rank % d == 0]:
        try:
            spec = prepare(model, {**settings, "micro_batch_size": mbs}, workers=gpus, hw=hw, global_batch=batch,
                           installed=installed)
        except ConfigError as e:
            if e.field == "micro_batch_size":
                continue
            return None, None, str(e), True
        over_host = memory.host_refusal(spec, host, memory.MARGIN)  # the same at every micro-batch
        if over_host:
            return None, None, over_host, False
        got = calibration(tuple(family(spec.config, spec.plan, gpus, lv) for lv in range(len(LEVELS))))
        mem = memory.predict_terms(*memory.terms(spec), got[0] if got else None)
        if mem <= cap and memory.predict(spec) <= cap:
            return spec, mem, None, False
        smallest = (mbs, max(mem, memory.predict(spec)))
    if smallest is None:
        return None, None, "no micro-batch divides the batch", True
    return None, None, f"predicted {smallest[1] / GiB:.1f} GiB at micro-batch {smallest[0]} > {cap / GiB:.1f} GiB", False


# --- what bench/build_atlas.py ships ----------------------------------------------------------------------------
def build_model(rows: list[dict], log=print) -> dict:
    """atlas/model.json from the shipped rows: each ok row's features, the memory calibration per GPU kind, the
    leave-one-out results and summaries, and the predictions for every named model no row measured (one GPU of
    each measured kind, the model's recipe)."""
    import time
    from trainscout.trial.models import PYTHIA
    from trainscout.trial.records import Record
    feats, t0 = {}, time.time()
    for row in rows:
        if row["record"].get("status") == "ok":
            feats[row_id(row)] = features(Record.from_dict(row["record"]))
    log(f"  features of {len(feats)} ok rows: {time.time() - t0:.0f} s")
    pool = samples(rows, feats)
    loo = {hold: leave_one_out(pool, hold) for hold in ("model", "row")}
    kinds = sorted({s.gpu for s in pool if s.gpu})
    measured = {s.model for s in pool} | {s.shape for s in pool}
    predictions = {}
    for kind in kinds:
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
            "predictions": predictions}


def _pct(v) -> str:
    return "-" if v is None else f"{100 * v:+.1f} %" if v < 0 or v > 0 else "0.0 %"


def loo_table(model: dict) -> str:
    """The leave-one-out table of docs/BENCHMARKS.md (markdown)."""
    lines = ["| held out | calibrated at | rows | tokens/s: median \\|error\\| | worst | peak memory: median "
             "\\|error\\| | worst | one memory fit over all: median, worst |", "|---|---|---|---|---|---|---|---|"]
    names = {"model": "the row's model (as for a model never measured)", "row": "the row and its repeats"}
    for hold, by in model["loo_summary"].items():
        for lv in ["all", *[str(i) for i in range(len(LEVELS))]]:
            s = by[lv]
            if not s["tokens_per_s"]["n"]:
                continue
            t, m = s["tokens_per_s"], s["peak_memory"]
            what = "any level" if lv == "all" else f"level {lv}: " + (", ".join(LEVELS[int(lv)]) or "any row")
            lines.append(f"| {names[hold]} | {what} | {t['n']} | {100 * t['median_abs']:.1f} % | {_pct(t['worst'])} | "
                         + (f"{100 * m['median_abs']:.1f} % | {_pct(m['worst'])} |" if m["n"] else "- | - |")
                         + (f" {100 * f['median_abs']:.1f} %, {_pct(f['worst'])} |" if (f := s["peak_memory_one_fit"])["n"]
                            else " - |"))
    return "\n".join(lines)
