"""Predictions where the atlas has no measurement: a model, a GPU kind or a GPU count never measured.

Peak memory: the calibrated memory model (trial/memory.py: peak = a·states + b·activations + c, least squares on
the measured peaks of the GPU kind). Speed: the step-time model (trial/steptime.py) is a roofline that ranks
configurations and is never a speed by itself (it predicts ~1.5-2x the measured tokens/s on the H200). Here it is
calibrated on measured rows: a prediction's step is the roofline's step times the median measured/roofline ratio
of the rows nearest to it — the same configuration family (the knobs' own declarations, backing off level by level
in LEVELS where no row of it is measured; the architecture's family, dense or a mixture of experts, is part of
every level but the last) and, among those, the two measured model shapes nearest in parameter count (another
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
# What a family is made of comes from the knobs' own declarations (spaces.Knob), never from a list of names here: a
# knob added in its own file (a plugin's included) is a dimension of every family at once. Besides the knobs: the
# GPU count, the engine that ran it (Plan.engine) and the architecture's family (dense or a mixture of experts, from
# the model's config). The levels drop dimensions by the role a knob declares, most specific first:
#   0  every knob but the micro-batch's (`micro_batch`: never part of a family)
#   1  the knobs with a declared effect on speed, memory, parallelism or numbers: `start`, `savers`, `mesh_dim`,
#      a `numerics` of their own (attention, the SDPA backend, an expert kernel, a compile scope, a pipeline's
#      schedule: left out)
#   2  less the memory savers that are not also a parallel degree or a numerics change (`savers`)
#   3  the start-point knobs and the numerics ones (no engine, no parallel degree)
#   4  the start-point knobs alone (what is compiled, the loss kernel, fp8) and the architecture's family
#   5  the architecture's family alone (a mixture of experts is calibrated on dense rows only where no mixture
#      of experts was measured on that GPU kind)
#   6  any row
DENSE, MOE = "dense", "MoE"
FIXED = ("gpus", "engine", "arch")  # the dimensions that are not knobs


def _roles() -> dict[str, set[str]]:
    """Knob names by declared role (spaces.Knob): start, savers, mesh, numerics, and every family knob."""
    from trainscout.spaces import Knob, all_knobs
    knobs = [k for k in all_knobs() if not k.micro_batch]
    return {"all": {k.name for k in knobs},
            "start": {k.name for k in knobs if k.start},
            "savers": {k.name for k in knobs if k.savers},
            "mesh": {k.name for k in knobs if k.mesh_dim},
            "numerics": {k.name for k in knobs if type(k).numerics is not Knob.numerics}}


def _level_names() -> tuple[tuple[str, ...], ...]:
    r = _roles()
    order = [k for k in sorted(r["all"])]
    pick = lambda names: tuple(n for n in order if n in names)  # noqa: E731
    effect = r["start"] | r["savers"] | r["mesh"] | r["numerics"]
    return (
        (*FIXED, *pick(r["all"])),
        (*FIXED, *pick(effect)),
        (*FIXED, *pick(effect - (r["savers"] - r["mesh"] - r["numerics"]))),
        ("gpus", "arch", *pick(r["start"] | r["numerics"])),
        ("arch", *pick(r["start"])),
        ("arch",),
        (),
    )


def _memory_level_names() -> tuple[tuple[str, ...], ...]:
    """What a measured peak carries to another model: the engine, its savers and parallel degrees, what is compiled
    (the start-point knobs), then less and less."""
    r = _roles()
    order = sorted(r["all"])
    pick = lambda names: tuple(n for n in order if n in names)  # noqa: E731
    effect = r["start"] | r["savers"] | r["mesh"] | r["numerics"]
    return (
        (*FIXED, *pick(effect)),
        (*FIXED, *pick(r["start"] | r["savers"] | r["mesh"])),
        ("engine", "arch", *pick(r["savers"] | r["mesh"] | r["start"])),
        ("engine", "arch", *pick(r["savers"] | r["mesh"])),
        ("arch",),
        (),
    )


LEVELS = _level_names()
LEVEL_WORDS = ("the same GPU count, engine, architecture family and every knob",
               "the same GPU count, engine, architecture family and the knobs with a declared effect (start points, "
               "memory savers, parallel degrees, numerics)",
               "as level 1, the memory savers aside",
               "the same GPU count, architecture family, start-point and numerics knobs",
               "the same architecture family and start-point knobs",
               "the same architecture family",
               "any row")
MEMORY_LEVELS = _memory_level_names()


def plan_of(rec: dict) -> Plan:
    """A stored record's plan (a row's "record"), read as today's Plan whatever form it was stored in."""
    return Plan.from_dict(rec.get("plan") or {})


def arch_family(model_config: dict | None) -> str:
    """dense, or MoE for a mixture of experts: routed experts under any spelling transformers' families use
    (spaces.model_config.EXPERTS; read from the dict, so lookup imports no torch for it)."""
    from trainscout.spaces.model_config import EXPERTS
    cfg = model_config or {}
    return MOE if any(cfg.get(k) for k in EXPERTS) else DENSE


def _dims(config: dict, plan: Plan, world_size: int, arch: str) -> dict:
    from trainscout.spaces import all_knobs
    out = {"gpus": world_size, "engine": plan.engine, "arch": arch}
    for k in all_knobs():
        if not k.micro_batch:
            v = config.get(k.name, k.default)
            out[k.name] = v if isinstance(v, (int, float, str, bool, type(None))) else str(v)
    return out


def family(config: dict, plan: Plan, world_size: int, level: int = 0, arch: str = DENSE) -> tuple:
    """A configuration's family at a level of LEVELS (micro-batch and accumulation are never part of it)."""
    dims = _dims(config, plan, world_size, arch)
    return tuple((name, dims.get(name)) for name in _level_names()[level])  # the knobs registered now


def families(config: dict, plan: Plan, world_size: int, arch: str) -> tuple:
    """family() at every level."""
    dims = _dims(config, plan, world_size, arch)
    return tuple(tuple((name, dims.get(name)) for name in names) for names in _level_names())


def describe(config: dict, plan: Plan) -> str:
    """A configuration in a few words: the engine, the knobs set away from their defaults (as `--set` writes
    them), and the micro-batch it ran."""
    from trainscout.spaces import all_knobs, fmt
    parts, mbs = [], None
    for k in all_knobs():
        v = config.get(k.name, k.default)
        if k.micro_batch:
            mbs = k.measured(v, plan)
            mbs = f"mbs {fmt(mbs)}" + (" (probed)" if mbs != v else "")
        elif k.is_set(v) and v != k.default and k.applies(config):
            parts.append(f"{k.name}={fmt(v)}")
    return ", ".join(p for p in (*parts, mbs) if p)


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
    family: str         # dense | MoE (arch_family)
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


def row_mfu(row: dict) -> float | None:
    """A row's MFU: the recomputed one it carries (derived), else recomputed here (trainscout.trial.mfu: a store
    layer's record carries none)."""
    got = (row.get("derived") or {}).get("mfu")
    if got is not None:
        return got
    from trainscout.trial.mfu import mfu
    from trainscout.trial.records import Record
    try:
        return mfu(Record.from_dict({k: v for k, v in row["record"].items() if k not in ("key", "source")}))
    except Exception:  # noqa: BLE001 - a model this trainscout cannot count: MFU unknown
        return None


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
            "arch": spec.model_config.get("model_type"), "family": arch_family(spec.model_config)}


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
            family=f.get("family") or arch_family(rec.get("model_config")),
            fam=families(rec["config"], plan, world, f.get("family") or arch_family(rec.get("model_config"))),
            config=rec["config"], plan=plan,
            roofline_s=f["roofline_s"], step_s=m["step_s"],
            tokens_per_step=rec["recipe"]["global_batch"] * rec["recipe"]["seq_len"],
            states=f["states"], acts=f["acts"], peak=max(peaks) * 2**20 if peaks else None,
            mfu=row_mfu(row)))
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
    for level, names in enumerate(_memory_level_names()):
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
        out.append({"id": s.id, "model": s.model, "gpu": s.gpu, "family": s.family, "level": level,
                    "calibrated_families": sorted({x.family for x in used}), "tps_err": tps / s.tokens_per_s - 1,
                    "mem_err": None if mem is None else mem / s.peak - 1,
                    "mem_fit_err": None if fitted is None else fitted / s.peak - 1})
    return out


def summary(errors: list[float]) -> dict:
    """n, the median |error| and the worst error (signed) of a list of relative errors."""
    from trainscout.trial.metrics import median
    if not errors:
        return {"n": 0, "median_abs": None, "worst": None}
    return {"n": len(errors), "median_abs": median([abs(e) for e in errors]), "worst": max(errors, key=abs)}


def loo_summary(results: list[dict], level: int | None = None, gpu: str | None = None, family: str | None = None,
                ids=None) -> dict:
    """The tokens/s and memory error summaries of leave_one_out's results (at one calibration level, or all; of
    one GPU kind, one architecture family, the rows of ids)."""
    ids = set(ids) if ids is not None else None
    sel = [r for r in results if (level is None or r["level"] == level) and (gpu is None or r.get("gpu") == gpu)
           and (family is None or r.get("family") == family) and (ids is None or r["id"] in ids)]
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
    from trainscout.trial.models import resolve_model
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
    kind_of_arch = arch_family(spec_model.config)
    if kind_of_arch == MOE and not any(s.family == MOE for s in on_kind):
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
        rows = _candidates(spec_model, want, n, arch, kind_of_arch, on_kind, global_batch, hw, installed, cap,
                           notes)
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
                 calibrated_ids=sorted(s.id for s in used), calibrated_gpus=sorted({str(s.gpu) for s in used}),
                 calibrated_families=sorted({s.family for s in used}),
                 projected_days=r["total_steps"] * step / 86400, mfu=metrics.mfu(tps, fpt, peak_tflops, r["gpus"]),
                 mfu_convention=f"{flops.CONVENTION} (predicted)")
    # a configuration one GPU cannot profit from (a sharding engine over one data rank: memory.shards_nothing) is
    # never ranked first on a prediction: only a measurement that it is faster could put it there
    rows.sort(key=lambda r: (r["shards_nothing"], -r["tokens_per_s"]))
    near = min((_distance(n, arch, s) for s in on_kind), default=None)
    if near is not None and near > REACH:
        nearest = min(on_kind, key=lambda s: _distance(n, arch, s))
        notes.append(f"extrapolated: the nearest measured model ({nearest.model}, {nearest.n_params / 1e6:,.0f} M "
                     f"parameters, against {n / 1e6:,.0f} M) is farther than any the leave-one-out held out: its "
                     "error may be larger than the error shown")
    return {"model": spec_model.name, "gpu": kind, "gpus": rows[0]["gpus"] if rows else gpus, "rows": rows,
            "notes": notes, "n_params": n, "capacity_gib": capacity_gib, "host_memory_gib": host_gib}


def _candidates(model, gpus: int, n: float, arch: str, kind_of_arch: str, pool: list[Sample], global_batch: int | None,
                hw: dict, installed: frozenset, cap: float, notes: list[str]) -> list[dict]:
    """predict_model's candidates on `gpus` GPUs, each at its largest fitting micro-batch (unsorted, uncalibrated):
    the configurations with the highest MFU (which carries across sizes, as search.service.store_points says) of
    the nearest models' rows; one that does not fit as it is gets the memory saver predicted fastest of those that
    fit (search.start.fits' rule)."""
    from trainscout.spaces import fmt, memory_savers
    from trainscout.trial import engines, memory, steptime
    from trainscout.spaces import all_knobs
    micro = {k.name for k in all_knobs() if k.micro_batch}
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
        base = {k: v for k, v in s.config.items() if k not in micro}
        fitting, why = [], None
        for rank, extra in enumerate(({}, *memory_savers())):
            settings = {**base, **extra}
            spec, mem, why_not, refused = _largest_fit(model, settings, gpus, global_batch, hw, installed,
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
                    "shards_nothing": bool(memory.shards_nothing(spec)),
                    "_fam": families(spec.config, spec.plan, gpus, kind_of_arch),
                    "_roofline_s": step})
    return out


def _largest_fit(model, settings: dict, gpus: int, global_batch: int | None, hw: dict, installed: frozenset,
                 calibration, cap: float, host: float, kind_of_arch: str = DENSE, keep: set | None = None):
    """(spec, predicted peak bytes, None, False) at the largest micro-batch predicted within cap bytes by the
    calibrated memory model and by the uncalibrated one (trainscout estimate's, a fresh search's), on a host of
    `host` bytes by trial.memory.host_refusal, the search's rule; or (None, None, why not, refused): refused=True
    where a knob rule refuses the configuration on this model and GPU, False where it does not fit.
    calibration(fam): the memory calibration of a family. A knob the saver (keep) does not set that the saver's
    settings refuse (the whole model compiled under DeepSpeed, not its layers) goes back to its default, once."""
    from trainscout.spaces import ConfigError, Context
    from trainscout.trial import memory, prepare
    batch = global_batch or model.recipe.global_batch
    dp = Context(world_size=gpus).data_parallel_ranks(settings)  # the world over pipeline, tensor, context degrees
    per_rank = batch // dp if batch % dp == 0 else batch
    from trainscout.spaces import all_knobs
    knobs = {k.name: k for k in all_knobs()}
    mb = next(k.name for k in knobs.values() if k.micro_batch)
    smallest, reset = None, set()
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
        over_host = memory.host_refusal(spec, host, memory.MARGIN)  # the same at every micro-batch
        if over_host:
            return None, None, over_host, False
        got = calibration(families(spec.config, spec.plan, gpus, kind_of_arch))
        mem = memory.predict_terms(*memory.terms(spec), got[0] if got else None)
        if mem <= cap and memory.predict(spec) <= cap:
            return spec, mem, None, False
        smallest = (mbs, max(mem, memory.predict(spec)))
    if smallest is None:
        return None, None, "no micro-batch divides the batch", True
    return None, None, f"predicted {smallest[1] / GiB:.1f} GiB at micro-batch {smallest[0]} > {cap / GiB:.1f} GiB", False


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


def _pct(v) -> str:
    return "-" if v is None else f"{100 * v:+.1f} %" if v < 0 or v > 0 else "0.0 %"


def loo_table_by(model: dict) -> str:
    """The leave-one-out error per GPU kind and architecture family (docs/BENCHMARKS.md, markdown)."""
    lines = ["| held out | GPU | family | rows | tokens/s: median \\|error\\| | worst | peak memory: median \\|error\\| "
             "| worst |", "|---|---|---|---|---|---|---|---|"]
    names = {"model": "the row's model", "row": "the row and its repeats"}
    for hold, by in model.get("loo_by", {}).items():
        for what, s in by.items():
            gpu, fam = what.split("|")
            t, m = s["tokens_per_s"], s["peak_memory"]
            lines.append(f"| {names[hold]} | {gpu} | {fam} | {t['n']} | {100 * t['median_abs']:.1f} % | "
                         f"{_pct(t['worst'])} | " + (f"{100 * m['median_abs']:.1f} % | {_pct(m['worst'])} |"
                                                      if m["n"] else "- | - |"))
    return "\n".join(lines)


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
            what = "any level" if lv == "all" else f"level {lv}: {LEVEL_WORDS[int(lv)]}"
            lines.append(f"| {names[hold]} | {what} | {t['n']} | {100 * t['median_abs']:.1f} % | {_pct(t['worst'])} | "
                         + (f"{100 * m['median_abs']:.1f} % | {_pct(m['worst'])} |" if m["n"] else "- | - |")
                         + (f" {100 * f['median_abs']:.1f} %, {_pct(f['worst'])} |" if (f := s["peak_memory_one_fit"])["n"]
                            else " - |"))
    return "\n".join(lines)
