"""The checks of one contributed record (store/contrib.py's rules): its content hash, its provenance against its own
hardware and versions, numbers beyond its GPUs' peak or implausible, versions that cannot run its knobs; and how two
records of one key differ."""
from __future__ import annotations

from trainscout.spaces import ConfigError
from trainscout.trial.records import TOKENS_PER_S
from trainscout.trial.status import Status

from . import row_format
from .row_format import UNKNOWN

# Two measurements of one key farther apart than this are different numbers, not noise: above the spread of repeated
# measurements (docs/store.md)
NOISE = 0.10
SHARED = (Status.OK, Status.OOM)  # what a contribution carries: crashes, timeouts and refusals are not measurements
# tokens/s must be global_batch x seq_len / step_s to this share (trainscout derives it so: float rounding only)
RATE_TOLERANCE = 0.01
MEMORY_TOLERANCE = 1.02  # peak memory above the GPU's capacity by more than this factor cannot have happened
# A CPU record's ceiling in FLOP/s for the whole host, whatever its core count says (a forger writes that too):
# above any CPU server's dense peak (docs/store.md)
HOST_PEAK_FLOPS = 1e15


def refusal(row: dict) -> str | None:
    """Why an atlas row cannot be trusted (None: it can): the checks of this module's docstring, except
    duplicates (import_file's)."""
    if row.get("content_hash") and row["content_hash"] != row_format.content_hash(row):
        return "its content hash does not match its content (the row was changed after it was exported)"
    rec = row["record"]
    return provenance_missing(row) or provenance_mismatch(row) or implausible(rec) or cannot_run(rec)


def provenance_mismatch(row: dict) -> str | None:
    """Provenance that is not the record's: a hardware or version field the record carries, named otherwise in the
    provenance (a CPU record under an H200's copied provenance)."""
    prov, rec = row.get("provenance") or {}, row["record"]
    hw, versions = rec.get("hardware") or {}, rec.get("versions") or {}
    if rec.get("device") != "cuda" and prov.get("gpu") not in (None, "", UNKNOWN, "CPU"):
        return (f"provenance contradicts the record: it names GPU {prov.get('gpu')!r}, the record ran on "
                f"{rec.get('device') or 'the CPU'}")
    for name, own in [*((f, hw.get(f)) for f in row_format.HARDWARE_FIELDS),
                      *((f, versions.get(f)) for f in row_format.VERSION_FIELDS)]:
        said = prov.get(name)
        if own in (None, "") or said in (None, "", UNKNOWN) or str(said) == str(own):
            continue
        return f"provenance contradicts the record: {name} {said!r} in the provenance, {own!r} in the record"
    return None


def beyond_peak(rec: dict) -> str | None:
    """tokens/s that no device computes: tokens/s x FLOPs per token (predictor.flops.count of the record's model config
    at its sequence length) above its GPUs' peak (trial.gpus.gpu_peak_tflops x ranks; a GPU that is no kind there:
    the fastest kind) or, on a CPU, above HOST_PEAK_FLOPS."""
    if rec.get("status") != Status.OK or not rec.get("model_config"):
        return None
    from trainscout.predictor import flops
    from trainscout.trial import gpus
    m, recipe = rec.get("metrics") or {}, rec.get("recipe") or {}
    try:
        per_token = flops.count(rec["model_config"]).per_token(recipe["seq_len"])
    except Exception:  # noqa: BLE001 - a model config this trainscout cannot build: implausible() names it
        return None
    ranks = rec.get("world_size") or 1
    if rec.get("device") == "cuda":
        gpu = (rec.get("hardware") or {}).get("gpu")
        peak = gpus.gpu_peak_tflops(gpu)
        what = f"{ranks} x {gpu}" if peak else f"{ranks} x the fastest GPU trainscout knows ({gpu!r} is not listed)"
        limit = (peak or max(k.bf16_tflops for k in gpus.KINDS)) * 1e12 * ranks
    else:
        limit, what = HOST_PEAK_FLOPS, "a CPU host (trainscout's generous ceiling, store/contrib.HOST_PEAK_FLOPS)"
    rate = m[TOKENS_PER_S] * per_token
    if rate > limit:
        return (f"physically impossible: {m[TOKENS_PER_S]:,.4g} tokens/s x {per_token:,.4g} FLOPs per token (its "
                f"model at seq {recipe['seq_len']}, predictor/flops.py) = {rate:.3g} FLOP/s, above the peak of {what}, "
                f"{limit:.3g} FLOP/s")
    return None


def record_key(rec: dict) -> str | None:
    """The measurement key of a record, recomputed from its own fields (store.schema.measurement_key) in the form a
    share row carries (row_format.shareable_record); None for a record that cannot be read as one."""
    from trainscout.trial.records import Record

    from .schema import measurement_key
    try:  # as a share row carries it (paths and host names out), so a store's record and its share row agree
        r = Record.from_dict(row_format.shareable_record({k: v for k, v in rec.items() if k not in ("key", "source")}))
        return measurement_key(r, r.hardware or {}, r.versions or {}, r.placement)
    except Exception:  # noqa: BLE001 - judged by the other checks
        return None


def provenance_missing(row: dict) -> str | None:
    """Missing provenance: the fields a measurement cannot be judged without."""
    prov, rec = row.get("provenance") or {}, row["record"]
    need = ["date", "torch", "transformers", "trainscout"]
    if rec.get("device") == "cuda":
        need.append("gpu")
    if (rec.get("plan") or {}).get("engine") == "deepspeed":
        need.append("deepspeed")
    missing = [f for f in need if prov.get(f) in (None, "", UNKNOWN)]
    if missing:
        return f"missing provenance: {', '.join(missing)} not recorded"
    return None


def implausible(rec: dict) -> str | None:
    """Numbers that cannot be: tokens/s against the step and batch, beyond the device's peak (beyond_peak), MFU
    above 1, a peak above the GPU's memory."""
    if rec.get("status") != Status.OK:
        return None
    from trainscout.trial.mfu import mfu
    from trainscout.trial.records import Record
    m, recipe = rec.get("metrics") or {}, rec.get("recipe") or {}
    expected = recipe["global_batch"] * recipe["seq_len"] / m["step_s"]
    if abs(m[TOKENS_PER_S] / expected - 1) > RATE_TOLERANCE:
        return (f"implausible: tokens/s {m[TOKENS_PER_S]:,.0f} is not global_batch x seq_len / step_s = "
                f"{recipe['global_batch']} x {recipe['seq_len']} / {m['step_s']:.4g} s = {expected:,.0f}")
    impossible = beyond_peak(rec)
    if impossible:
        return impossible
    record = Record.from_dict(rec)
    try:
        value = mfu(record)
    except Exception as e:  # noqa: BLE001 - a model config this trainscout cannot build: judged by the other checks
        value = None
        why = f"{type(e).__name__}: {e}"
        if isinstance(e, ConfigError):
            return f"its model cannot be read here ({why[:160]})"
    if value is not None and value > 1:
        return (f"implausible: MFU {value:.2f} under the honest count (trainscout.trial.mfu) is above the GPU's "
                "peak: tokens/s beyond what the GPU can compute")
    hw = rec.get("hardware") or {}
    peak = m.get("peak_memory_gib")
    if rec.get("device") == "cuda" and isinstance(peak, (int, float)):
        from trainscout.trial.gpus import gpu_facts
        caps = [c for c in (hw.get("gpu_memory_gib"), (gpu_facts(hw.get("gpu") or "") or (None,))[0])
                if isinstance(c, (int, float)) and c > 0]
        if caps and peak > min(caps) * MEMORY_TOLERANCE:
            return f"implausible: peak memory {peak:.1f} GiB per rank is above the GPU's {min(caps):.1f} GiB"
    return None


def minimums() -> dict[str, object]:
    """The lowest version of each library trainscout supports (its own metadata: pyproject's requirements,
    extras included), by import name."""
    from importlib.metadata import PackageNotFoundError, requires

    from packaging.requirements import Requirement
    out = {}
    try:
        reqs = requires("trainscout") or []
    except PackageNotFoundError:
        return out
    for text in reqs:
        r = Requirement(text)
        for spec in r.specifier:
            if spec.operator in (">=", "=="):
                out[r.name.lower().replace("-", "_")] = spec.version
    return out


def cannot_run(rec: dict) -> str | None:
    """A version set that cannot run the knobs the record claims: the knobs' own rules (trainscout.spaces.resolve)
    with the packages its versions name and its GPU's capability; a library older than trainscout supports."""
    if rec.get("status") not in SHARED or not rec.get("recipe") or not rec.get("model_config"):
        return None
    from packaging.version import InvalidVersion, Version

    from trainscout.spaces import all_knobs, current, resolve
    from trainscout.trial.runner import context
    versions = rec.get("versions") or {}
    for name, low in minimums().items():
        have = versions.get(name)
        if not isinstance(have, str):
            continue
        try:
            too_old = Version(have.split("+")[0]) < Version(low)
        except InvalidVersion:
            return f"its versions cannot run it: {name} {have!r} is not a version"
        if too_old:
            return f"its versions cannot run it: {name} {have} is older than trainscout supports ({name}>={low})"
    packages = {p for k in all_knobs() for p in k.runtime.packages}
    # a package its versions do not name at all (a record older than that field) is taken as present: it ran with it
    installed = frozenset(p for p in packages if versions.get(p) or p not in versions)
    hw = {"device": rec.get("device") or "cpu", "capability": (rec.get("hardware") or {}).get("capability") or ""}
    try:
        ctx = context(rec["model_config"], rec["recipe"]["global_batch"], rec.get("world_size") or 1, hw, installed)
        resolve(current(rec["config"])[0], ctx)  # a first record's retired settings (compile_mode) left out
    except ConfigError as e:
        return f"its versions and GPU cannot run the knobs it claims: {e}"
    return None


def _numbers(rec: dict) -> tuple:
    m = rec.get("metrics") or {}
    return str(rec.get("status")), m.get(TOKENS_PER_S), m.get("peak_memory_gib")


def conflict(a: dict, b: dict) -> str | None:
    """How two records of one key differ beyond NOISE (None: they agree): status, tokens/s, peak memory."""
    (sa, ta, pa), (sb, tb, pb) = _numbers(a), _numbers(b)
    if sa != sb:
        return f"status {sa} against {sb}"
    for what, x, y in (("tokens/s", ta, tb), ("peak memory GiB", pa, pb)):
        if (isinstance(x, (int, float)) and isinstance(y, (int, float)) and min(x, y) > 0
                and max(x, y) / min(x, y) - 1 > NOISE):
            return f"{what} {x:,.4g} against {y:,.4g} (more than {NOISE:.0%} apart)"
    return None
