"""Measure one configuration: validate it, run its ranks in a warm worker group (trial.pool), enforce the hard time
limit from outside the workers, classify failures, and derive the metrics (tokens/s, step time, MFU, projected
days)."""
from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
import uuid
from datetime import datetime, timezone

from trainscout.predictor import flops
from trainscout.spaces import ConfigError, Context, resolve

from . import contention, faults, gpus, hardware, metrics, pool, probe, quality
from .models import ModelSpec, resolve_model, sizes, with_overrides
from .rank import Progress
from .ray_cluster import check_resources, cluster_address, ensure_ray
from .records import RankResult, Record, TrialSpec, TOKENS_PER_S
from .status import MEASURED, Status, classify, host_oom_line, node_lost_line

STATUSES = tuple(s.value for s in MEASURED)
DEFAULT_TIMEOUT = {"cpu": 300.0, "cuda": 900.0}


class Cancelled(RuntimeError):
    """The trial's worker group was ended from outside while it ran: there is no measurement to record."""


def detect_device(device: str) -> str:
    """The device to run on, "cuda" or "cpu" (auto: cuda if a CUDA GPU is visible); ConfigError for any other
    value, or cuda without a GPU."""
    if device not in ("auto", "cpu", "cuda"):
        raise ConfigError("--device", f"--device {device} is not allowed: use auto, cpu or cuda")
    import torch
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device", "--device cuda but no CUDA GPU is visible: use --device cpu")
    return device


def prepare(model: str | ModelSpec, settings: dict, *, device: str = "auto", workers: int = 1, steps: int = 5,
            warmup: int = 2, measure_accum: int | None = None, global_batch: int | None = None,
            seq_len: int | None = None, total_steps: int | None = None, total_tokens: int | None = None,
            grad_clip: float | None = None,
            fault: str | None = None, seed: int = 0, hw: dict | None = None, gate: bool = True,
            installed: frozenset | None = None) -> TrialSpec:
    """Everything a trial needs, validated: raises ConfigError (one line naming the field and the fix).

    hw is the hardware fingerprint of the box; a search passes the one its driver took (a trial process of a
    search holds no GPU itself), a single trial takes it here. gate: where knobs change the numerics, the trial
    also takes the quality gate's step against its reference (trial/quality.py); verify and train leave it out.
    installed: the optional packages the box has (default: those importable here; a prediction for another box
    names its own)."""
    _check_counts(workers, steps, warmup, measure_accum)
    fault = _checked_fault(fault)
    if hw is None:
        device = detect_device(device)
        hw = hardware.fingerprint(device, workers)
    device = hw["device"]
    if device == "cuda" and workers > hw.get("gpu_count", 0):
        raise ConfigError("--workers", f"--workers {workers} needs {workers} GPUs but {hw.get('gpu_count', 0)} "
                                       f"are visible: use --workers {hw.get('gpu_count', 0)} or fewer")
    spec = model if isinstance(model, ModelSpec) else resolve_model(model)
    recipe = with_overrides(spec.recipe, global_batch=global_batch, seq_len=seq_len, total_steps=total_steps,
                            total_tokens=total_tokens, grad_clip=grad_clip)
    ctx = context(spec.config, recipe.global_batch, workers, hw, installed, recipe.seq_len)
    cfg, plan = resolve(settings, ctx)

    def measured(full: int) -> int:
        return full if measure_accum == 0 else min(full, measure_accum or max(2, min(full, 4)))
    full = plan.grad_accum
    accum = measured(full)
    if full > 1 and accum < 2:
        raise ConfigError("--measure-accum", f"--measure-accum {measure_accum}: a step with accumulation needs >= 2 "
                                             "measured micro-batches to separate the synchronising one: use 2 or more")
    out = TrialSpec(
        model=spec.name, model_config=spec.config, device=device, world_size=workers,
        config=cfg, plan=plan, recipe=recipe.to_dict(),
        grad_accum=full, measured_accum=accum, timed_steps=steps, warmup_steps=warmup,
        seed=seed, fault=fault,
        threads_per_worker=max(1, (os.cpu_count() or 1) // workers),
        hardware=dict(hw, world_size=workers))
    if plan.micro_batch_probe:
        out.probe = probe.candidates(out, plan, measured)
    changed = quality.changes(cfg, ctx)
    if changed and gate:
        out.quality = _quality_section(cfg, ctx, changed)
    return out


def _check_counts(workers, steps, warmup, measure_accum) -> None:
    """ConfigError for a rank, step or warm-up count, or a measured accumulation, that is not allowed."""
    for flag, v, lo in (("--workers", workers, 1), ("--steps", steps, 1), ("--warmup", warmup, 0)):
        if not isinstance(v, int) or isinstance(v, bool) or v < lo:
            raise ConfigError(flag, f"{flag} {v} is not allowed: give an integer >= {lo}")
    if measure_accum is not None and (not isinstance(measure_accum, int) or measure_accum < 0):
        raise ConfigError("--measure-accum", f"--measure-accum {measure_accum} is not allowed: give an integer >= 0 "
                                             "(0 = full step)")


def _checked_fault(fault: str | None) -> str | None:
    """The fault to inject (--inject-fault, else TRAINSCOUT_FAULT), parsed here: a bad one is a ConfigError, not the
    worker's crash."""
    fault = fault or os.environ.get("TRAINSCOUT_FAULT") or None
    try:
        faults.parse(fault)
    except ValueError as e:
        raise ConfigError("TRAINSCOUT_FAULT" if fault == os.environ.get("TRAINSCOUT_FAULT") else "--inject-fault",
                          str(e))
    return fault


def _quality_section(cfg: dict, ctx: Context, changed: dict) -> dict:
    """What the quality gate needs where knobs change the numerics: the changes, the reference's settings and its
    plan (or why it has none)."""
    ref = quality.reference(cfg, changed)
    q = {"changes": changed, "reference": quality.differences(cfg, ref)}
    try:
        return dict(q, reference_plan=resolve(ref, ctx)[1].to_dict())
    except ConfigError as e:  # measured all the same; its record says why it has no verdict
        return dict(q, why=f"its reference does not resolve ({e})")


def context(model_config: dict, global_batch: int, workers: int, hw: dict,
            installed: frozenset | None = None, seq_len: int = 0) -> Context:
    """What knobs are checked against: the box (hardware fingerprint and its optional packages: `installed`, else
    the fingerprint's "installed" where a box not this one is described (search --dry-run), else this one's), the
    model and the recipe's batch."""
    if installed is None and hw.get("installed") is not None:
        installed = frozenset(hw["installed"])
    return Context(world_size=workers, device=hw["device"], num_layers=sizes(model_config).layers,
                   global_batch=global_batch,
                   installed=hardware.installed_optional() if installed is None else installed,
                   capability=str(hw.get("capability") or ""), model_config=model_config, seq_len=seq_len)


# The compiled-extension caches the user set, read once at import: inductor sets TORCHINDUCTOR_CACHE_DIR in a
# process the first time it compiles (the memory model's trace of a compiled layer does), which would change the
# ranks' environment, and so their group's key, between one trial and the next (the warm group not taken)
USER_CACHES = {k: os.environ[k] for k in ("TORCH_EXTENSIONS_DIR", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")
           if k in os.environ}


def worker_env(spec: TrialSpec) -> dict:
    """The ranks' environment: the caches, the device's, and what knobs set (a group is kept per environment)."""
    env = dict(USER_CACHES)
    if spec.device == "cpu":
        env["DS_ACCELERATOR"] = "cpu"
        env["CUDA_VISIBLE_DEVICES"] = ""
    elif str(spec.hardware.get("capability", "")).startswith("9."):
        env["TORCH_CUDA_ARCH_LIST"] = "9.0"  # DeepSpeed's op builder cannot parse the machine's "9.0a"
    env.update(spec.plan.env)  # what knobs set (e.g. the allocator's configuration)
    return env


STALE_LOCK_S = 300.0  # a JIT build's lock older than this that no process holds open was left by a killed builder


def stale_build_locks(root: str | None = None, older_s: float = STALE_LOCK_S) -> list[tuple[str, float]]:
    """(path, age s) of torch's JIT-build locks (TORCH_EXTENSIONS_DIR/<op>/lock, DeepSpeed's ops) on this host that
    are older than older_s and that no live process holds open: torch's FileBaton creates the lock, keeps it open
    while it builds and removes it after; a rank killed meanwhile (a timeout, an OOM) leaves it, and every later
    build of that op waits on it forever (the ZeRO trials after one waited to their time limit). root: the ranks'
    TORCH_EXTENSIONS_DIR, else torch's default folder (~/.cache/torch_extensions/py*_*)."""
    import glob
    if root:
        locks = glob.glob(os.path.join(root, "*", "lock"))
    else:
        base = os.path.join(os.path.expanduser("~"), ".cache", "torch_extensions")
        locks = glob.glob(os.path.join(base, "*", "lock")) + glob.glob(os.path.join(base, "*", "*", "lock"))
    now = time.time()
    old = []
    for path in locks:
        try:
            age = now - os.stat(path).st_mtime
        except OSError:
            continue
        if age >= older_s:
            old.append((os.path.realpath(path), age))
    if not old:
        return []
    held = set()
    for fd_dir in glob.glob("/proc/[0-9]*/fd"):  # who holds them open (this host's processes that we may see)
        try:
            for fd in os.listdir(fd_dir):
                try:
                    held.add(os.readlink(os.path.join(fd_dir, fd)))
                except OSError:
                    continue
        except OSError:
            continue
    return [(p, age) for p, age in old if p not in held]


def _log_tail(log_dir: str, n: int = 20) -> str:
    tails = []
    for f in sorted(os.listdir(log_dir)) if os.path.isdir(log_dir) else []:
        with open(os.path.join(log_dir, f), errors="replace") as fh:
            lines = [line.rstrip() for line in fh.readlines() if line.strip()][-n:]
        if lines:
            tails.append(f"[{f}] " + "\n".join(lines))
    return "\n".join(tails)[-4000:]


def _error_summary(error: str) -> str:
    """The line of a Ray error that says what went wrong (exception line or the actor's death)."""
    lines = [line.strip() for line in error.splitlines() if line.strip()]
    for pat in (r"^\w*(Error|Exception)\b.*:", r"Worker exit detail", r"died"):
        hits = [line for line in lines if re.search(pat, line)]
        if hits:
            return hits[-1][:500]
    return (lines[0] if lines else error)[:500]


def _wait(workers, ref, trial_id: str, spec: TrialSpec, on_step) -> dict:
    """The trial's result (the pool enforces the hard limit), relaying rank 0's per-step reports to on_step."""
    import ray
    while True:
        ready, _ = ray.wait([ref], timeout=1.0)
        if on_step is not None:
            for p in ray.get(workers.take.remote(trial_id)):
                # the accumulation of the micro-batch running now: micro_batch_size=max settles on one in the trial,
                # and the spec's is the largest candidate's (ASHA would be fed values inflated by that ratio)
                accum = p.get("grad_accum") or spec.grad_accum
                step_s = metrics.project_step(p["micro"][:-1], p["micro"][-1:], [p["optim"]], accum)
                on_step({"step": p["step"], "step_s": step_s, "loss": p.get("loss"),
                         TOKENS_PER_S: spec.tokens_per_step / step_s})
        if ready:
            return ray.get(ref)


def warm(spec: TrialSpec, one_node: bool = True, timeout: float | None = None) -> None:
    """Start the worker group that spec's trial will run in, without waiting for it (pool.Pool.warm): a search's
    driver does it for its first trial while Tune starts that trial's actor (seconds of the first trial's wall:
    docs/trial.md). Nothing when fresh workers are asked for (TRAINSCOUT_FRESH_WORKERS)."""
    if not pool.fresh_requested():
        pool.pool().warm.remote(spec.world_size, spec.device, worker_env(spec), one_node, spec.model_config,
                                timeout or DEFAULT_TIMEOUT[spec.device])


def execute(spec: TrialSpec, *, timeout: float | None = None, storage: str | None = None,
            address: str | None = None, on_step=None, reuse: bool | None = None, owner: str | None = None,
            one_node: bool = True) -> Record:
    """Run a prepared trial in a worker group (trial.pool); always returns a record (failures are outcomes).

    on_step(dict), if given, receives rank 0's projected step time and tokens/s after every timed step. reuse=False
    (or TRAINSCOUT_FRESH_WORKERS=1) runs it in fresh processes, killed after it. owner names the caller for
    pool.cancel (a search's Tune trial). one_node: its ranks on one node (False: wherever the cluster has room;
    the record's placement says where they ran). A trial the cluster gave no room within the time limit is
    `unscheduled` (nothing ran); one whose node left the cluster while it ran is `node_lost`. The time limit counts
    from the ranks' placement; the wait for it has a limit of its own (the same number of seconds)."""
    ensure_ray(address)
    check_resources(spec.world_size, spec.device, "--workers")  # a group Ray cannot place waited for the timeout
    timeout = timeout or DEFAULT_TIMEOUT[spec.device]
    reuse = not pool.fresh_requested() if reuse is None else reuse
    trial_id = uuid.uuid4().hex[:12]
    own_storage = storage is None
    storage = os.path.abspath(storage or tempfile.mkdtemp(prefix="trainscout-"))
    log_dir = os.path.join(storage, trial_id, "logs")
    workers = pool.pool(shared=cluster_address(address) is not None)  # a cluster others use: idle groups go back
    spec = spec.replace(log_dir=log_dir, progress=Progress(workers, trial_id) if on_step else None)
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    t0 = time.perf_counter()
    raw = _run_in_pool(workers, trial_id, spec, timeout, reuse, owner, one_node, address, on_step)
    if raw.get("cancelled"):  # pool.cancel from elsewhere (a search's driver, for a trial ASHA stopped)
        raise Cancelled(f"trial {trial_id} was cancelled while it ran")
    wall = time.perf_counter() - t0
    record = Record(trial_id=trial_id, model=spec.model, model_config=spec.model_config, device=spec.device,
                    world_size=spec.world_size, config=spec.config, plan=spec.plan, recipe=spec.recipe,
                    grad_accum=spec.grad_accum, measured_accum=spec.measured_accum, timed_steps=spec.timed_steps,
                    started_at=started, wall_s=round(wall, 2), reused=raw.get("reused"), versions=hardware.versions(),
                    hardware=spec.hardware, status=Status.CRASH, placement=raw.get("placement"))
    record = _outcome(record, raw, spec, wall, timeout, log_dir)
    if own_storage:
        shutil.rmtree(storage, ignore_errors=True)
    return record


def _run_in_pool(workers, trial_id: str, spec: TrialSpec, timeout: float, reuse: bool, owner: str | None,
                 one_node: bool, address: str | None, on_step) -> dict:
    """The pool's raw result of the trial (pool.Pool.run; a Ray error as its error). The caller stopped (Tune's early
    stop, Ctrl-C): its ranks are stopped or cancelled before the stop goes on."""
    import ray
    ref = workers.run.remote(trial_id, spec, worker_env(spec), timeout, reuse, owner, one_node)
    try:
        return _wait(workers, ref, trial_id, spec, on_step)
    except ray.exceptions.RayError as e:
        return {"error": f"{type(e).__name__}: {e}"}
    except SystemExit:  # Tune's early stop (its session exits our thread at a report). On the search's own Ray the
        # ranks leave at their next step boundary and their group serves the next trial (killed, the next trial would
        # pay a fresh group: docs/trial.md); on a cluster others may use (address),
        # its resources go back to the cluster at once, as another search's trials may wait for them
        if owner is None or cluster_address(address):
            ray.get(workers.cancel.remote(trial_id))
        else:
            ray.get(workers.stop.remote(trial_id=trial_id))
        raise
    except BaseException:  # the caller stops us otherwise (Ctrl-C): the ranks must not outlive it
        ray.get(workers.cancel.remote(trial_id))
        raise
    finally:
        workers.take.remote(trial_id)  # what arrived after the last look


def _outcome(record: Record, raw: dict, spec: TrialSpec, wall: float, timeout: float, log_dir: str) -> Record:
    """The record with the trial's outcome: its metrics, or the status and error of what ended it."""
    if "ok" in raw:
        ranks = [RankResult.from_dict(r) for r in raw["ok"]["ranks"]]
        spec, m, compared = probe.settle(spec, raw["ok"]["n_params"], ranks, derive)
        if compared:
            record = record.replace(plan=spec.plan, grad_accum=spec.grad_accum, measured_accum=spec.measured_accum,
                                    probe=ranks[0].probe, probe_compared=compared)
        if ranks[0].span_s is not None:  # the wall less rank 0's own call: hand-off both ways (Ray, the pool, a
            # group's start, a stopped trial's last step before its group serves this one)
            m["handoff_s"] = round(wall - ranks[0].span_s, 3)
        return record.replace(status=Status.OK, error=None, metrics=m)
    if "unscheduled" in raw:
        return record.replace(status=Status.UNSCHEDULED, metrics=None, error=raw["unscheduled"])
    if "node_lost" in raw:  # its node left the cluster: the cluster's state, not the configuration's outcome
        return record.replace(status=Status.NODE_LOST, metrics=None, error=raw["node_lost"])
    if "timeout" in raw:
        return record.replace(status=Status.TIMEOUT, metrics=None, error=_timeout_error(spec, timeout))
    tail = _log_tail(log_dir)
    status = classify(raw["error"] + "\n" + tail)
    # the host's memory monitor killed a rank: its own one line (Ray's message names the node's memory), never the
    # configuration's oom (ray.exceptions.OutOfMemoryError read as one, and was served from the store after)
    error = host_oom_line(raw["error"] + "\n" + tail) if status == Status.HOST_OOM else \
        node_lost_line(raw["error"]) if status == Status.NODE_LOST else _error_summary(raw["error"])
    return record.replace(status=status, error=error, stderr_tail=tail, metrics=None)


def _timeout_error(spec: TrialSpec, timeout: float) -> str:
    """A timed-out trial's error, naming the stale build locks a rank likely waited on."""
    stale = stale_build_locks(worker_env(spec).get("TORCH_EXTENSIONS_DIR"))
    why = ("; a rank likely waited on a stale build lock of a compiled extension (a rank killed while building "
           "it left it): " + ", ".join(f"{p} ({age / 60:.0f} min old, no process holds it)" for p, age in stale)
           + ": remove it and measure again") if stale else ""
    return f"no result within the {timeout:g} s limit (counted from its ranks' placement); workers killed{why}"


def derive(spec: TrialSpec, n_params: int, ranks: list[RankResult]) -> dict:
    """Metrics from the ranks' raw phase times: the slowest rank per step, medians over the timed steps."""
    out = _step_times(spec, ranks)
    device_name = ranks[0].device_name
    peak = gpus.gpu_peak_tflops(device_name) if spec.device == "cuda" else None
    tok_s, step_s, recipe = out[TOKENS_PER_S], out["step_s"], spec.recipe
    out.update({
        "n_params": n_params,
        "gpu": device_name,
        "peak_tflops": peak,
        # flops_per_token, mfu; hardware_flops_per_token, hfu with checkpointing's recomputation (predictor/flops.py)
        **flops.metrics(spec.model_config, recipe["seq_len"], tok_s, peak, spec.world_size,
                        spec.plan.checkpoint_every, selective=flops.selective(spec.plan)),
        "projected_days": recipe["total_steps"] * step_s / 86400,
        "gpu_hours": recipe["total_steps"] * step_s / 3600 * (spec.world_size if spec.device == "cuda" else 0),
        **_phase_seconds(spec, ranks),
    })
    if spec.quality:  # knobs that change the numerics: the gate's verdict (or, already known, the stored one)
        out["quality"] = ranks[0].quality or spec.quality.get("known") or {
            "changes": spec.quality["changes"], "reference": spec.quality["reference"],
            "why": spec.quality.get("why") or "the gate's step did not run (the trial ended early)"}
        if ranks[0].quality and not ranks[0].quality.get("skipped"):  # it ran here, outside the timed steps
            out["gate_s"] = ranks[0].quality.get("seconds")
    if spec.device == "cuda":
        out["peak_allocated_mib"] = [round(r.peak_allocated_mib, 1) for r in ranks]
        out["peak_reserved_mib"] = [round(r.peak_reserved_mib, 1) for r in ranks]
        out["peak_memory_gib"] = max(out["peak_allocated_mib"]) / 1024
    else:
        out["peak_memory_gib"] = max(out["peak_rss_mib"]) / 1024
    return out


def _step_times(spec: TrialSpec, ranks: list[RankResult]) -> dict:
    """tokens/s and the step's times: each timed step projected to the recipe's full step on its slowest rank, and
    the medians of its parts."""
    A = spec.grad_accum
    per_rank = [[metrics.project_step(st["micro"][:-1], st["micro"][-1:], [st["optim"]], A) for st in r.steps]
                for r in ranks]  # [rank][step] -> projected full step
    projected = [max(col) for col in zip(*per_rank)]  # the slowest rank of each step
    measured = [max(col) for col in zip(*[[st["total"] for st in r.steps] for r in ranks])]
    rank_steps = [metrics.median(row) for row in per_rank]
    step_s = metrics.median(projected)
    non_last = [m for r in ranks for st in r.steps for m in st["micro"][:-1]]
    last = [st["micro"][-1] for r in ranks for st in r.steps]
    return {
        TOKENS_PER_S: spec.tokens_per_step / step_s,
        "step_s": step_s,                       # projected full optimizer step of the recipe's global batch
        "measured_step_s": metrics.median(measured),  # the timed steps as run (measured_accum micro-batches)
        "micro_batch_s": metrics.median(non_last or last),
        # their mean: a full step sums its micro-batches, so stalls a median leaves out count there (bench/verify_batch)
        "micro_batch_mean_s": sum(non_last or last) / len(non_last or last),
        "last_micro_batch_s": metrics.median(last),
        "optimizer_s": metrics.median([st["optim"] for r in ranks for st in r.steps]),
        "step_spread": (max(projected) - min(projected)) / step_s,
        "rank_spread": (max(rank_steps) - min(rank_steps)) / step_s,
        "steps_s": projected,
        # per rank and timed step: [median accumulating micro-batch, last, optimizer]; verify --global-batch projects
        # from them (metrics.project_at) the way step_s is projected here
        "phases": metrics.phases([r.steps for r in ranks]),
        "slowest_rank": max(range(len(ranks)), key=lambda i: rank_steps[i]),
    }


def _phase_seconds(spec: TrialSpec, ranks: list[RankResult]) -> dict:
    """Where the trial's time went outside the timed steps, its host memory, losses, dtypes and who shared its node."""
    return {
        "peak_rss_mib": [round(r.peak_rss_mib, 1) for r in ranks],
        "build_s": max(r.build_s for r in ranks),
        "model_s": max((r.model_s or 0.0) for r in ranks),
        "compile_s": max((r.compile_s or 0.0) for r in ranks),
        "autotune_s": max((r.autotune_s or 0.0) for r in ranks),
        "warmup_s": max(r.warmup_s for r in ranks),
        "timed_s": max(r.timed_s for r in ranks),
        # rank 0's: Python's garbage collector in the trial; the reset after it (trial.pool.Rank.run)
        "gc_s": ranks[0].gc_s,
        "reset_s": ranks[0].reset_s,
        # micro_batch_size=max: the timed steps of the micro-batch compared with the first (probe.measure_below)
        "compared_timed_s": max((r.below or {}).get("timed_s", 0.0) for r in ranks),
        # CUDA: the caching allocator's retries in the timed steps (memory pressure); None on the CPU
        "alloc_retries": None if ranks[0].alloc_retries is None else max(r.alloc_retries or 0 for r in ranks),
        # the seed paper's method on the same steps: an unsynchronised host timer around one micro-batch x A
        "seed_method_step_s": spec.grad_accum * metrics.median([st["host_first_micro"] for st in ranks[0].steps]),
        "loss": next((r.loss for r in ranks if r.loss is not None), None),  # a pipeline's last stage
        # each timed step's loss (verify --quality compares them), from the rank that has them
        "losses": next(([st.get("loss") for st in r.steps] for r in ranks if r.loss is not None), None),
        "micro_batch_size": spec.plan.micro_batch_size,
        # the dtypes rank 0's optimizer really stepped (predictor.dtypes: a trial whose dtypes differ from its label
        # crashes)
        "dtypes": ranks[0].dtypes,
        # other trials on its node during the timed steps, and those sharing its CPU or GPU (trial.contention)
        "shared_with": contention.merge([r.shared for r in ranks]),
    }


def run_trial(model: str, settings: dict, *, timeout: float | None = None, storage: str | None = None,
              address: str | None = None, **kw) -> Record:
    """prepare + execute. An invalid configuration is an outcome here (status "invalid"), not an exception."""
    try:
        spec = prepare(model, settings, **kw)
    except ConfigError as e:
        return Record(trial_id=uuid.uuid4().hex[:12], model=model, config=settings, status=Status.INVALID,
                      error=str(e), metrics=None)
    return execute(spec, timeout=timeout, storage=storage, address=address)
