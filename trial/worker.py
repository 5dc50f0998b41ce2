"""One rank of a trial: build -> apply knobs -> warm up -> synchronize -> time -> report.

Runs inside a Ray Train worker process (one per rank; torch.distributed is already initialised: gloo on the
CPU, NCCL on GPUs). Every timed optimizer step records the boundaries of its micro-batches and of the
optimizer with CUDA events on a GPU (perf_counter on the CPU, where work is synchronous), and the step ends
with a device synchronisation, so the times are what the GPU really spent.
"""
from __future__ import annotations

import gc
import json
import os
import resource
import sys
import tempfile
import time
import traceback


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


def _memmap_batches(spec: dict, plan, data_rank: int, data_ranks: int, device):
    """batch(step, i): micro-batch i of optimizer step `step` for this data rank, read from a flat token file."""
    import numpy as np
    import torch
    seq, rows, accum = spec["recipe"]["seq_len"], plan.sequences_per_call, spec["measured_accum"]
    tokens = np.memmap(spec["data"], dtype=np.dtype(spec.get("data_dtype", "uint16")), mode="r")
    n_seq = len(tokens) // seq

    def batch(step: int, i: int):
        first = ((step * accum + i) * data_ranks + data_rank) * rows
        idx = [(first + j) % n_seq for j in range(rows)]
        return torch.from_numpy(np.stack([tokens[k * seq:(k + 1) * seq] for k in idx]).astype(np.int64)).to(device)
    return batch


# micro_batch_size=max keeps a candidate only if its probe steps peaked below this share of the GPU's memory: on
# the H200, Pythia-160M mbs 64 passed a one-step probe (2 micro-batches) and then ran out of memory in warm-up
# (4 micro-batches; 24.5 GiB reserved but fragmented). The probe now runs what warm-up runs, with this margin.
PROBE_HEADROOM = 0.90


def _peaks(device) -> dict:
    import torch
    if device.type != "cuda":
        return {}
    return {"peak_allocated_mib": torch.cuda.max_memory_allocated(device) / 2**20,
            "peak_reserved_mib": torch.cuda.max_memory_reserved(device) / 2**20}


def _is_oom(e: BaseException) -> bool:
    from .status import Status, classify
    return classify(f"{type(e).__name__}: {e}") == Status.OOM


def _probe_step(engine, plan, spec: dict, accum: int, device) -> None:
    """Two optimizer steps at this micro-batch, as the warm-up runs them. TRAINSCOUT_FAKE_CAPACITY_MBS=N (tests
    only) simulates a smaller GPU: a micro-batch above N makes a real 64 TiB allocation, which the allocator refuses."""
    import torch
    fake = os.environ.get("TRAINSCOUT_FAKE_CAPACITY_MBS")
    if fake and plan.micro_batch_size > int(fake):
        torch.empty(1 << 46, dtype=torch.uint8, device=device)
    x = torch.randint(0, int(spec["model_config"]["vocab_size"]), (plan.sequences_per_call, spec["recipe"]["seq_len"]),
                      device=device)
    for _ in range(2):  # what warm-up will run: the measured micro-batches, twice (allocator reuse included)
        for i in range(accum):
            engine.micro_step(x, is_last=(i == accum - 1), scale=1.0 / accum)
        engine.optimizer_step()


def train_loop(spec: dict) -> None:
    """One rank of a trial (Ray Train's training function). Ray pickles a rank's error to the driver, and library
    errors may hold what pickle refuses (torch.compile's hold stack frames: they arrived as "cannot pickle 'frame'
    object"). So an error of a type outside the builtins goes back as a RuntimeError with its type and message."""
    try:
        _train_loop(spec)
    except Exception as e:
        if type(e).__module__ == "builtins":
            raise
        traceback.print_exc()  # the whole trace stays in the rank's log
        raise RuntimeError(f"{type(e).__module__}.{type(e).__qualname__}: {str(e)[:2000]}") from None


def _train_loop(spec: dict) -> None:
    import ray.train
    import torch
    import torch.distributed as dist

    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    _redirect_stderr(spec.get("log_dir"), rank)
    from . import engines, faults
    from .models import build_model
    from trainscout.spaces import Plan

    t0 = time.perf_counter()
    plan, recipe = Plan.from_dict(spec["plan"]), spec["recipe"]
    if spec["device"] == "cuda":
        import ray.train.torch
        device = ray.train.torch.get_device()
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
        torch.set_num_threads(max(1, spec.get("threads_per_worker", 1)))
    torch.manual_seed(spec.get("seed", 0))

    def make(accum):
        model = build_model(spec["model_config"], plan.attn_implementation, recipe["seq_len"])
        model.config.use_cache = False
        model.train()
        names = {id(p): n for n, p in model.named_parameters()}  # the model's own names, before any wrapping
        n_params[0] = sum(p.numel() for p in model.parameters())  # before ZeRO-3 partitions them to empty
        return model, names, engines.build(plan, model, recipe, device, world, accum)

    probe, n_params = [], [0]
    if spec.get("probe"):  # micro_batch_size=max: the largest candidate that survives a full step, in this process
        for cand in spec["probe"]:
            plan.micro_batch_size, plan.grad_accum, accum = cand["mbs"], cand["grad_accum"], cand["measured_accum"]
            try:
                if device.type == "cuda":
                    torch.cuda.reset_peak_memory_stats(device)
                model, names, engine = make(accum)
                _probe_step(engine, plan, spec, accum, device)
                if device.type == "cuda":  # fits, but too close to the edge: the timed steps would hit it
                    peak, total = torch.cuda.max_memory_allocated(device), torch.cuda.get_device_properties(device).total_memory
                    if peak > PROBE_HEADROOM * total:
                        raise torch.OutOfMemoryError(f"probe peak {peak / 2**30:.1f} GiB is over {PROBE_HEADROOM:.0%} "
                                                     f"of {total / 2**30:.1f} GiB")
                probe.append([cand["mbs"], "ok"])
                break
            except Exception as e:  # noqa: BLE001 - anything but an out-of-memory error is re-raised
                if not _is_oom(e):
                    raise
                probe.append([cand["mbs"], "oom"])
                model = names = engine = None
                gc.collect()
                if device.type == "cuda":
                    torch.cuda.empty_cache()
        else:
            raise torch.OutOfMemoryError(f"micro_batch_size=max: no micro-batch fits (tried {[c for c, _ in probe]})")
    else:
        accum = spec["measured_accum"]
        model, names, engine = make(accum)
    n_params = n_params[0]
    if probe and device.type == "cuda":  # the peak reported is the measured micro-batch's, not a refused one's
        torch.cuda.reset_peak_memory_stats(device)
    t_built = time.perf_counter()

    data_rank = getattr(engine, "data_rank", rank)
    if spec.get("data"):  # `trainscout train --data`: a tokenized memmap, each rank its own sequences
        batch = _memmap_batches(spec, plan, data_rank, world // max(1, plan.pipeline.get("stages", 1)), device)
    else:  # synthetic tokens: the throughput of a step does not depend on their values
        vocab = int(spec["model_config"]["vocab_size"])
        gen = torch.Generator(device="cpu").manual_seed(1000 + data_rank)
        batches = [torch.randint(0, vocab, (plan.sequences_per_call, recipe["seq_len"]), generator=gen).to(device)
                   for _ in range(min(accum, 4))]
        batch = lambda step, i: batches[i % len(batches)]  # noqa: E731
    clock = Clock(device)
    n_steps, host = [0], [0.0]

    def optimizer_step_marks():
        marks = [clock.mark()]
        for i in range(accum):
            t = time.perf_counter()
            loss = engine.micro_step(batch(n_steps[0], i), is_last=(i == accum - 1), scale=1.0 / accum)
            if i == 0:  # the seed paper's timer: host time around one micro-batch, no device synchronisation
                host[0] = time.perf_counter() - t
            marks.append(clock.mark())
        n_steps[0] += 1
        engine.optimizer_step()
        marks.append(clock.mark())
        return marks, loss

    def timed_step():
        """One optimizer step, synchronised: its phase times (and the seed paper's host timer beside them)."""
        marks, loss = optimizer_step_marks()
        clock.sync()
        d = [clock.seconds(a, b) for a, b in zip(marks, marks[1:])]
        return {"micro": d[:-1], "optim": d[-1], "total": clock.seconds(marks[0], marks[-1]),
                "host_first_micro": host[0]}, loss

    for _ in range(spec["warmup_steps"]):  # compile, allocator growth, first-step lazy init: not timed
        optimizer_step_marks()
    clock.sync()
    dist.barrier()
    t_warm = time.perf_counter()

    steps = []
    progress = spec.get("progress")
    for s in range(spec["timed_steps"]):
        if s == 0:
            faults.fire(spec.get("fault"), rank, device)
        step, loss = timed_step()
        steps.append(step)
        if progress is not None and rank == 0:  # per-step throughput for early stopping (rank 0's view)
            progress.put({"step": s + 1, "micro": step["micro"], "optim": step["optim"],
                          "loss": None if loss is None else float(loss.detach().float().item()) * accum})
    t_timed = time.perf_counter()
    peaks = _peaks(device)
    below = None
    if probe and not spec.get("data"):  # micro_batch_size=max: also one candidate below (throughput may peak there)
        nxt = [c for c in spec["probe"] if c["mbs"] < plan.micro_batch_size][:1]
        chosen = (plan.micro_batch_size, plan.grad_accum, accum)
        if nxt:
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            plan.micro_batch_size, plan.grad_accum, accum = nxt[0]["mbs"], nxt[0]["grad_accum"], nxt[0]["measured_accum"]
            batches[:] = [b[: plan.sequences_per_call] for b in batches]
            timed_step()  # one untimed step at this size
            alt = [timed_step()[0] for _ in range(spec["timed_steps"])]
            below = dict(nxt[0], steps=alt, **_peaks(device))
            plan.micro_batch_size, plan.grad_accum, accum = chosen
    if spec.get("save_dir"):
        engines.save(engine, model, names, spec["save_dir"], rank)

    mine = {"rank": rank, "steps": steps, "loss": None if loss is None else float(loss.detach().float().item()),
            "micro_batch_size": plan.micro_batch_size, "grad_accum": plan.grad_accum, "measured_accum": accum,
            "probe": probe, "below": below, "build_s": t_built - t0, "warmup_s": t_warm - t_built,
            "timed_s": t_timed - t_warm, "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            **peaks}
    if device.type == "cuda":
        mine["device_name"] = torch.cuda.get_device_name(device)
    ranks = [None] * world
    dist.all_gather_object(ranks, mine)

    metrics = {"done": 1}
    if rank == 0:
        out = {"n_params": n_params, "ranks": ranks}
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "result.json"), "w") as f:
                json.dump(out, f)
            ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(d))
    else:
        ray.train.report(metrics)
