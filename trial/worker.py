"""One rank of a trial: build -> apply knobs -> warm up -> synchronize -> time -> report.

Runs inside a rank's process of a warm worker group (trial.pool: one per rank; torch.distributed is already
initialised: gloo on the CPU, NCCL on GPUs), which may have run other trials before: reset_process() undoes what a
trial leaves behind. Every timed optimizer step records the boundaries of its micro-batches and of the
optimizer with CUDA events on a GPU (perf_counter on the CPU, where work is synchronous), and the step ends
with a device synchronisation, so the times are what the GPU really spent.
"""
from __future__ import annotations

import contextlib
import copy
import gc
import os
import resource
import sys
import time
import traceback

from trainscout.predictor import dtypes
from trainscout.spaces import ParallelDims

from . import contention, engines, faults, metrics
from . import probe as mbs_probe
from .models import build_model, sizes
from .records import RankResult, TrialSpec, TOKENS_PER_S


_gc = [0.0, 0.0]  # seconds Python's garbage collector has run in this process; when the running collection began


def _gc_timer(phase: str, info: dict) -> None:
    if phase == "start":
        _gc[1] = time.perf_counter()
    else:
        _gc[0] += time.perf_counter() - _gc[1]


def gc_seconds() -> float:
    """Seconds the garbage collector has spent in this process since the first call (automatic collections, as
    torch.compile's many objects set them off, and explicit ones)."""
    if _gc_timer not in gc.callbacks:
        gc.callbacks.append(_gc_timer)
    return _gc[0]


def _redirect_stderr(log_dir: str | None, rank: int) -> None:
    """Send this rank's stderr to a file the runner reads to explain a crash."""
    if not log_dir:
        return
    try:
        os.makedirs(log_dir, exist_ok=True)
        fd = os.open(os.path.join(log_dir, f"rank{rank}.log"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    except OSError:
        return  # another node's path on a cluster: Ray's own logs keep the output
    os.dup2(fd, 2)
    os.close(fd)  # fd 2 holds the file now; a reused process opens one per trial
    sys.stderr = os.fdopen(2, "w", buffering=1, closefd=False)


class Clock:
    """Marks on the device's timeline: CUDA events on a GPU, perf_counter on the CPU."""

    def __init__(self, device):
        import torch
        self.cuda = device.type == "cuda"
        self.torch = torch

    def mark(self):
        if self.cuda:
            ev = self.torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def seconds(self, a, b) -> float:
        return a.elapsed_time(b) / 1000.0 if self.cuda else b - a

    def sync(self):
        if self.cuda:
            self.torch.cuda.synchronize()


def _memmap_batches(spec: TrialSpec, plan, data_rank: int, data_ranks: int, device):
    """batch(step, i): micro-batch i of optimizer step `step` for this data rank, read from a flat token file."""
    import numpy as np
    import torch
    seq, rows, accum = spec.recipe["seq_len"], plan.sequences_per_call, spec.measured_accum
    tokens = np.memmap(spec.data, dtype=np.dtype(spec.data_dtype or "uint16"), mode="r")
    n_seq = len(tokens) // seq

    def batch(step: int, i: int):
        first = ((step * accum + i) * data_ranks + data_rank) * rows
        idx = [(first + j) % n_seq for j in range(rows)]
        return torch.from_numpy(np.stack([tokens[k * seq:(k + 1) * seq] for k in idx]).astype(np.int64)).to(device)
    return batch


def _peaks(device) -> dict:
    import torch
    if device.type != "cuda":
        return {}
    return {"peak_allocated_mib": torch.cuda.max_memory_allocated(device) / 2**20,
            "peak_reserved_mib": torch.cuda.max_memory_reserved(device) / 2**20}


def train_loop(spec: TrialSpec, rank: int, world: int, local: int = 0) -> dict:
    """One rank of a trial: {"n_params", "rank": RankResult dict}. Ray pickles a rank's error to the driver, and
    library errors may hold what pickle refuses (torch.compile's hold stack frames: they arrived as "cannot pickle
    'frame' object"). So an error of a type outside the builtins goes back as a RuntimeError with its type and
    message."""
    try:
        return _train_loop(spec, rank, world, local)
    except Exception as e:
        if type(e).__module__ == "builtins":
            raise
        traceback.print_exc()  # the whole trace stays in the rank's log
        raise RuntimeError(f"{type(e).__module__}.{type(e).__qualname__}: {str(e)[:2000]}") from None


def reset_process() -> None:
    """After a trial, in a process the next trial may reuse: free its objects and the device's cache, forget
    torch.compile's in-memory caches (the on-disk ones stay), and start the device's peak counters again (the next
    trial resets the peak RSS as it starts)."""
    import torch
    contention.leave()  # this trial no longer shares the node (trial.contention)
    torch.compiler.reset()
    collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        # and the pinned host memory torch caches (save_on_cpu's, FSDP2 offload's shards and gradients): kept, it
        # stays in the process's RSS, and the next trial's host peak counted it (an H100: FSDP2 offload 32.6 GiB
        # after activation offload's 20.7 GiB of cached pinned blocks, 17.9 after they were freed)
        empty_host = getattr(torch.accelerator, "empty_host_cache", None) or getattr(torch._C, "_host_emptyCache", None)
        if empty_host is not None:
            empty_host()
    try:  # give freed heap back to the OS, so the next trial's peak RSS starts from what the process holds
        import ctypes
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def collect() -> None:
    """A full garbage collection, whose survivors are then frozen (gc.freeze): what a warm process keeps between
    trials (its imports, torch.compile's code caches) is not traversed again by the collections of later trials.
    TRAINSCOUT_GC_FREEZE=0 leaves it out (bench/overhead_trials_gpu.py's "before", docs/BENCHMARKS.md)."""
    gc.collect()
    if os.environ.get("TRAINSCOUT_GC_FREEZE", "1") != "0":
        gc.freeze()


def _reset_peak_rss() -> None:
    try:  # Linux: "5" resets the process's peak resident set size (VmHWM) to its current size
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def _peak_rss_mib() -> float:
    """This process's peak resident set size since the last reset (VmHWM); ru_maxrss where there is no /proc."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _below_bar(spec: TrialSpec, steps: list[dict]) -> dict | None:
    """The gate's outcome where it is not run: this rank's tokens/s (an upper bound of the trial's) below the bar
    the search set (search.trainable.rank_bar), so the trial cannot rank; None: run it."""
    bar = spec.quality.get("rank_bar")
    if not bar or not steps:
        return None
    step_s = metrics.median([metrics.project_step(st["micro"][:-1], st["micro"][-1:], [st["optim"]], spec.grad_accum)
                             for st in steps])
    tok_s = spec.tokens_per_step / step_s
    if tok_s >= bar[TOKENS_PER_S]:
        return None
    return {"changes": spec.quality["changes"], "reference": spec.quality["reference"], "skipped": True,
            "why": f"not gated: {tok_s:,.0f} tokens/s is more than {1 - bar[TOKENS_PER_S] / bar['best']:.0%} below "
                   f"the search's fastest that trains the same model ({bar['best']:,.0f}, trial {bar['trial']}), so "
                   "it cannot rank"}


def _quality_gate(spec: TrialSpec, device) -> dict:
    """trial.quality.one_step in this process, on what the trial freed; a failure to run it is its outcome (the
    measurement stands, without a verdict: why)."""
    import torch

    from . import quality
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    try:  # what it built is freed by reset_process(), which follows every trial (trial.pool.Rank.run)
        return quality.one_step(spec, device)
    except Exception as e:  # noqa: BLE001 - out of memory for two more models, a transform that needs the engine
        traceback.print_exc()
        return {"changes": spec.quality["changes"], "reference": spec.quality["reference"],
                "why": f"the gate's step failed: {type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"}


def _stop_requested(progress, rank: int, world: int, device) -> bool:
    """Whether the search stopped this trial (trial.pool.Pool.stop): rank 0 asks the pool after a timed step, and
    every rank learns its answer, so all leave at the same step boundary."""
    import torch
    import torch.distributed as dist
    flag = torch.tensor([int(rank == 0 and progress.stopped())], device=device)
    if world > 1:
        dist.broadcast(flag, 0)
    return bool(flag.item())


class RankRun:
    """One rank's trial between its steps: its plan, model and engine, its batches and the counters its result reads."""

    def __init__(self, spec: TrialSpec, world: int, device):
        self.spec, self.world, self.device = spec, world, device
        self.plan = copy.deepcopy(spec.plan)  # the probe steps its micro-batch down in place
        self.clock = Clock(device)
        self.model = self.names = self.engine = None
        self.batches, self.batch = None, None  # the synthetic micro-batches, and batch(step, i) -> one of them
        self.n_params = 0         # the model's parameters, counted before ZeRO-3 partitions them to empty
        self.model_s = 0.0        # seconds spent building models and their engines
        self.ran = {}             # what the optimizer really steps (predictor.dtypes.watch: the record's dtypes)
        self.checked = False      # whether those dtypes were checked, at the first step that stepped
        self.steps_run = 0        # optimizer steps run: the next step's batches
        self.host_first_micro = 0.0  # the seed paper's timer of the last step run

    def make(self, accum: int):
        """(model, parameter names, engine) built for `accum` micro-batches a step; its seconds counted."""
        t = time.perf_counter()
        try:
            return self._build(accum)
        finally:
            self.model_s += time.perf_counter() - t

    def _build(self, accum: int):
        import torch
        spec, plan, device = self.spec, self.plan, self.device
        on_device = device.type == "cuda" and engines.get(plan.engine).builds_on_device
        with torch.device(device) if on_device else contextlib.nullcontext():
            model = build_model(spec.model_config, plan.attn_implementation, spec.recipe["seq_len"], plan.master_dtype)
        model.config.use_cache = False
        model.train()
        names = {id(p): n for n, p in model.named_parameters()}  # the model's own names, before any wrapping
        self.n_params = sum(p.numel() for p in model.parameters())  # before ZeRO-3 partitions them to empty
        engine = engines.build(plan, model, spec.recipe, device, self.world, accum)
        self.ran = dtypes.watch(engine.optimizers())  # what its optimizer really steps (the record's dtypes)
        return model, names, engine

    def optimizer_step_marks(self, accum: int):
        """One optimizer step of `accum` micro-batches, unsynchronised: (its clock marks, its mean loss per token)."""
        import torch
        clock, engine = self.clock, self.engine
        marks, losses = [clock.mark()], []
        for i in range(accum):
            t = time.perf_counter()
            loss = engine.micro_step(self.batch(self.steps_run, i), is_last=(i == accum - 1), scale=1.0 / accum)
            if i == 0:  # the seed paper's timer: host time around one micro-batch, no device synchronisation
                self.host_first_micro = time.perf_counter() - t
            marks.append(clock.mark())
            if loss is not None:  # a pipeline's ranks without the last stage have none
                losses.append(loss.detach())
        self.steps_run += 1
        engine.optimizer_step()
        marks.append(clock.mark())
        if self.ran and not self.checked:  # the first step that stepped: its dtypes are the label's, or no measurement
            dtypes.check(self.ran, self.plan)
            self.checked = True
        # each micro-batch's loss comes scaled by 1/accum: their sum is the step's mean loss per token
        return marks, (torch.stack(losses).float().sum() if losses else None)

    def timed_step(self, accum: int):
        """One optimizer step, synchronised: its phase times (and the seed paper's host timer beside them)."""
        clock = self.clock
        marks, loss = self.optimizer_step_marks(accum)
        clock.sync()
        d = [clock.seconds(a, b) for a, b in zip(marks, marks[1:])]
        return {"micro": d[:-1], "optim": d[-1], "total": clock.seconds(marks[0], marks[-1]),
                "host_first_micro": self.host_first_micro}, loss


def _device_for(spec: TrialSpec, local: int):
    """This rank's device, made current (the CPU's threads set), with the trial's seed set."""
    import torch
    if spec.device == "cuda":
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
        torch.set_num_threads(max(1, spec.threads_per_worker or 1))
    torch.manual_seed(spec.seed or 0)
    return device


def _enter_node(spec: TrialSpec, device, local: int) -> None:
    """On the node's registry from now to reset_process: what shares the node during the timed steps
    (trial.contention)."""
    visible = [v for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v]
    contention.enter(spec.log_dir or f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}",
                     ["cpu"] if device.type != "cuda" else [visible[local] if local < len(visible) else str(local)])


def _model_and_engine(run: RankRun) -> tuple[int, list]:
    """The model and its engine into run: (the accumulation measured, the probe's candidates tried)."""
    probe = []
    if run.spec.probe:  # micro_batch_size=max: the largest candidate that survives a full step, in this process
        (run.model, run.names, run.engine), accum, probe = mbs_probe.largest_fit(run.spec, run.plan, run.make,
                                                                                 run.device)
    else:
        accum = run.spec.measured_accum
        run.model, run.names, run.engine = run.make(accum)
    return accum, probe


def _feed(run: RankRun, rank: int, accum: int) -> None:
    """run.batch(step, i): the data rank's tokens, from the trial's token file, else synthetic ones."""
    import torch
    spec, plan = run.spec, run.plan
    dims = ParallelDims.of(plan, run.world)
    data_rank = dims.data_rank(rank)  # the ranks of one data-parallel replica (pipeline, tensor, context) read the same
    if spec.data:  # `trainscout train --data`: a tokenized memmap, each rank its own sequences
        run.batch = _memmap_batches(spec, plan, data_rank, dims.dp, run.device)
        return
    # synthetic tokens: the throughput of a step does not depend on their values
    vocab = sizes(spec.model_config).vocab
    gen = torch.Generator(device="cpu").manual_seed(1000 + data_rank)
    batches = [torch.randint(0, vocab, (plan.sequences_per_call, spec.recipe["seq_len"]), generator=gen).to(run.device)
               for _ in range(min(accum, 4))]
    run.batches = batches
    run.batch = lambda step, i: batches[i % len(batches)]  # measure_below trims the list in place


def _timed_steps(run: RankRun, rank: int, accum: int) -> tuple[list[dict], object]:
    """The timed steps (their phase times and losses), rank 0 reporting each to the search, and the last step's
    loss; early stopping may end them sooner."""
    spec, progress, steps, loss = run.spec, run.spec.progress, [], None
    for s in range(spec.timed_steps):
        if s == 0:
            faults.fire(spec.fault, rank, run.device)
        step, loss = run.timed_step(accum)
        step["loss"] = None if loss is None else float(loss.item())  # after the step's synchronisation: no stall
        steps.append(step)
        if progress is not None and rank == 0:  # per-step throughput for early stopping (rank 0's view)
            progress.put({"step": s + 1, "micro": step["micro"], "optim": step["optim"],
                          "grad_accum": run.plan.grad_accum, "loss": step["loss"]})
        if progress is not None and _stop_requested(progress, rank, run.world, run.device):
            break  # early stopping ended the trial: leave as after the last step, so the process can be reused
    return steps, loss


def _train_loop(spec: TrialSpec, rank: int, world: int, local: int) -> dict:
    import torch.distributed as dist

    _redirect_stderr(spec.log_dir, rank)
    _reset_peak_rss()
    t0, compiled0, gc0 = time.perf_counter(), mbs_probe.compile_seconds(), gc_seconds()
    tuned0 = mbs_probe.compile_seconds("autotune")
    run = RankRun(spec, world, _device_for(spec, local))
    _enter_node(spec, run.device, local)
    accum, probe = _model_and_engine(run)
    t_built = time.perf_counter()
    _feed(run, rank, accum)
    # compile, allocator growth, first-step lazy init: not timed (a probed micro-batch ran its warm-up in the probe);
    # two micro-batches a step where the engine lets us count them (probe.warmup_accum)
    for _ in range(max(0, spec.warmup_steps - (mbs_probe.PROBE_STEPS if probe else 0))):
        run.optimizer_step_marks(mbs_probe.warmup_accum(run.engine, accum))
    run.clock.sync()
    dist.barrier()
    t_warm, compile_s = time.perf_counter(), mbs_probe.compile_seconds() - compiled0
    times = {"build_s": t_built - t0, "model_s": run.model_s, "compile_s": compile_s,
             "autotune_s": mbs_probe.compile_seconds("autotune") - tuned0, "warmup_s": t_warm - t_built}
    retries = mbs_probe.alloc_retries(run.device)
    contention.timed_start()
    steps, loss = _timed_steps(run, rank, accum)
    times["timed_s"] = time.perf_counter() - t_warm
    mine = _after_timed(run, rank, accum, probe, steps, loss, retries, contention.timed_end(), gc0, times)
    dist.barrier()  # every rank ends its trial together: the next trial in these processes starts level
    return {"n_params": run.n_params, "rank": mine.to_dict()}


def _after_timed(run: RankRun, rank: int, accum: int, probe: list, steps: list[dict], loss, retries, shared,
                 gc0: float, times: dict) -> RankResult:
    """What follows the timed steps: the peaks, the micro-batch below the probed one, the saved weights, the quality
    gate; the rank's result."""
    import torch
    spec, plan, device = run.spec, run.plan, run.device
    peaks = _peaks(device)
    if retries is not None:  # the allocator's retries during the timed steps: memory pressure
        retries = mbs_probe.alloc_retries(device) - retries
    below = None
    # micro_batch_size=max: the candidate below too, where memory pressed (not after early stopping ended the trial)
    if probe and not spec.data and len(steps) == spec.timed_steps:
        below = mbs_probe.measure_below(spec, plan, device, run.batches, run.timed_step, _peaks, retries)
    if spec.save_dir:
        engines.save(run.engine, run.model, run.names, spec.save_dir, rank, spec.save_dtype)
    run.engine.close()
    last_loss = None if loss is None else float(loss.item())
    gate = None
    # knobs that change the numerics: the quality gate's step against the reference, with the trial's model freed
    if (rank == 0 and spec.quality and "reference_plan" in spec.quality and "known" not in spec.quality
            and len(steps) == spec.timed_steps):
        gate = _below_bar(spec, steps)
        if gate is None:
            run.engine = run.model = None
            gate = _quality_gate(spec, device)
    return RankResult(rank=rank, steps=steps, loss=last_loss, quality=gate,
                      micro_batch_size=plan.micro_batch_size, grad_accum=plan.grad_accum, measured_accum=accum,
                      probe=probe, below=below, peak_rss_mib=_peak_rss_mib(), alloc_retries=retries,
                      gc_s=gc_seconds() - gc0, dtypes=run.ran or None, shared=shared,
                      device_name=torch.cuda.get_device_name(device) if device.type == "cuda" else None, **times,
                      **peaks)
