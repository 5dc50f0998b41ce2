"""micro_batch_size=max (one rank, no DeepSpeed), all of it but the knob: the candidates (runner.prepare), the
probe in the trial's own process and the measurement one candidate below (worker), and which of the two is the
record (runner.execute).

Candidates are the divisors of the per-rank batch, largest first, from the largest the memory model cannot rule
out (memory.refusal, the rule by which a search does not launch a fixed micro-batch: the GPU's memory + MARGIN and
the host's less MARGIN); each runs what warm-up runs and is kept below PROBE_HEADROOM of the GPU's memory; an
out-of-memory error frees the candidate (release: its engine closed, the failed frames cleared, torch.compile's
graphs forgotten, a collection, the device's cache emptied) and steps down. The candidate that fits has run its warm-up
in the probe. The largest that fits is timed; where its timed steps made the CUDA allocator retry (memory pressure)
the one below is timed too, with graphs compiled for its own shape (what a run at that micro-batch compiles), and
the faster is the record (`probe`, `probe_compared`, `alloc_retries`). TRAINSCOUT_FAKE_CAPACITY_MBS=N (tests only)
simulates a smaller GPU: a micro-batch above N makes a real allocation larger than any GPU (after a compiled
forward and backward, as a real one fails), which the allocator refuses (trial/faults.py).
The measurements behind the probe's rules: docs/trial.md.
"""
from __future__ import annotations

import gc
import os
import sys
import time
import traceback

from .models import sizes
from .records import RankResult, TrialSpec, TOKENS_PER_S
from .status import Status, classify

# micro_batch_size=max keeps a candidate only if its probe steps peaked below this share of the GPU's memory: a
# fragmented allocator can fail a later step that the probe's peak fit (docs/trial.md)
PROBE_HEADROOM = 0.90


# --- the runner: candidates, and the record ---------------------------------------------------------------------
def candidates(spec: TrialSpec, plan, measured) -> list[dict]:
    """The divisors of the per-rank batch, largest first, from the largest the memory model cannot rule out: the
    search's rule for the same configuration at that micro-batch as a fixed one (memory.refusal: predicted at most
    memory.MARGIN over the GPU's memory, and within the host's
    memory less memory.MARGIN, memory.host_capacity of the trial's hardware); where none passes, all of them (a trial
    the search would not launch, run as asked). Each candidate tried above the fit costs a build, a compile and an
    out-of-memory error; one over the host's memory (activation offload's saved tensors grow with the micro-batch)
    costs the trial's process. The rule is uncalibrated here: a search's calibration reaches the trial's own refusal
    (search/trainable), not its runner. What a candidate then measures against PROBE_HEADROOM (largest_fit) is
    another question: its real peak, not the model's prediction. measured(A): micro-batches timed per step."""
    from trainscout.predictor import memory
    per_rank = plan.micro_batch_size * plan.grad_accum
    cands = [{"mbs": d, "grad_accum": per_rank // d, "measured_accum": measured(per_rank // d)}
             for d in sorted((d for d in range(1, plan.micro_batch_size + 1) if per_rank % d == 0), reverse=True)]
    gpu, host = memory.gpu_capacity(spec.hardware), memory.host_capacity(spec.hardware)
    fixed = spec.plan.replace(micro_batch_probe=False)  # each candidate judged at its own size, not at 1
    fits = [i for i, c in enumerate(cands)
            if memory.refusal(spec.replace(plan=fixed.replace(micro_batch_size=c["mbs"])), gpu, host) is None]
    return cands[fits[0]:] if fits else cands


def settle(spec: TrialSpec, n_params: int, ranks: list[RankResult], derive) -> tuple[TrialSpec, dict, list]:
    """(spec, metrics, compared). The micro-batch the probe settled on and, where the worker also measured one
    candidate below, whichever of the two projects the shorter step; compared = [[mbs, tokens/s]].
    derive(spec, n_params, ranks) -> metrics (runner.derive)."""
    if not spec.probe:
        return spec, derive(spec, n_params, ranks), []

    def at(r0, ranks):
        return spec.replace(grad_accum=r0["grad_accum"], measured_accum=r0["measured_accum"],
                            plan=spec.plan.replace(micro_batch_size=r0["micro_batch_size"],
                                                   grad_accum=r0["grad_accum"])), ranks
    r0 = ranks[0]
    options = [at({"micro_batch_size": r0.micro_batch_size, "grad_accum": r0.grad_accum,
                   "measured_accum": r0.measured_accum}, ranks)]
    if r0.below:
        b = r0.below
        low = {"micro_batch_size": b["mbs"], "grad_accum": b["grad_accum"], "measured_accum": b["measured_accum"]}
        options.append(at(low, [r.replace(**{k: v for k, v in r.below.items() if k not in ("mbs", "timed_s")})
                                for r in ranks]))
    scored = [(s, derive(s, n_params, r)) for s, r in options]
    compared = [[s.plan.micro_batch_size, m[TOKENS_PER_S]] for s, m in scored]
    best_spec, best = min(scored, key=lambda x: x[1]["step_s"])
    return best_spec, best, compared


# --- the worker: the probe, and the candidate below ---------------------------------------------------------------
def _is_oom(e: BaseException) -> bool:
    return classify(f"{type(e).__name__}: {e}") == Status.OOM


PROBE_STEPS = 2  # optimizer steps a candidate runs: they are the warm-up of the one that fits
WARMUP_MICRO_BATCHES = 2  # of a warm-up or probe step: one that accumulates, and the last, which synchronises


def warmup_accum(engine, accum: int) -> int:
    """Micro-batches of a warm-up (or probe) step: two, one that accumulates and the last, which synchronises
    gradients (each path's compiled graphs, hooks and buffers); the second such step runs them with the optimizer's
    states allocated, the peak a timed step reaches. All `accum` where the engine counts a step's micro-batches
    itself (DeepSpeed). Two, not all: a large model's micro-batches take long (docs/trial.md)."""
    return accum if type(engine).counts_micro_batches else min(accum, WARMUP_MICRO_BATCHES)


# dynamo's own timers: compiling (its frames with their forward graphs; the backward graphs, compiled at their first
# backward) and inductor's autotuning of a new kernel's configurations at its first run (outside the compile)
_TIMERS = {"compile": ("_compile.compile_inner", "compile_fx.<locals>.bw_compiler"),
           "autotune": ("CachingAutotuner.benchmark_all_configs",)}
forgotten_seconds = dict.fromkeys(_TIMERS, 0.0)  # seconds of the timers forget_graphs cleared


def compile_seconds(kind: str = "compile") -> float:
    """Seconds torch.compile has spent compiling (kind="autotune": autotuning new kernels at their first run) in
    this process, as dynamo's own timers count them, those forget_graphs cleared included; a trial takes the
    difference. 0 where this torch has no such timers."""
    try:
        from torch._dynamo.utils import compilation_time_metrics as timers
    except ImportError:
        return forgotten_seconds[kind]
    return forgotten_seconds[kind] + sum(sum(timers.get(k, ())) for k in _TIMERS[kind])


def forget_graphs() -> None:
    """Forget torch.compile's graphs, so the next shape compiles static as a fresh process would. Without it dynamo
    recompiles a changed batch size with a symbolic batch dimension (automatic dynamic): the micro-batch the probe
    settled on after an out-of-memory candidate ran dynamic-shape kernels that a run at that micro-batch does not."""
    import torch
    for kind in _TIMERS:  # the reset clears dynamo's timers
        forgotten_seconds[kind] = compile_seconds(kind)
    torch.compiler.reset()


def probe_step(engine, plan, spec: TrialSpec, accum: int, device) -> None:
    """PROBE_STEPS optimizer steps at this micro-batch, as warm-up runs them (TRAINSCOUT_FAKE_CAPACITY_MBS: above)."""
    import torch
    fake = os.environ.get("TRAINSCOUT_FAKE_CAPACITY_MBS")
    x = torch.randint(0, sizes(spec.model_config).vocab, (plan.sequences_per_call, spec.recipe["seq_len"]),
                      device=device)
    n = warmup_accum(engine, accum)
    for _ in range(PROBE_STEPS):  # what warm-up runs, twice (allocator reuse included)
        for i in range(n):
            engine.micro_step(x, is_last=(i == n - 1), scale=1.0 / n)
            if fake and plan.micro_batch_size > int(fake):  # after a compiled forward and backward, as on a GPU
                torch.empty(1 << 46, dtype=torch.uint8, device=device)
        engine.optimizer_step()


def largest_fit(spec: TrialSpec, plan, make, device) -> tuple[tuple, int, list]:
    """The largest candidate that survives a full step, in this process: (make(accum)'s result, accum, probe).
    plan is left at that candidate; probe = [[mbs, "ok" | "oom"], ...]. make(accum) builds model and engine."""
    import torch

    from . import faults
    probe = []
    for cand in spec.probe:
        plan.micro_batch_size, plan.grad_accum, accum = cand["mbs"], cand["grad_accum"], cand["measured_accum"]
        built = None
        try:
            faults.probe_candidate(spec.fault, cand["mbs"])  # tests: the fault held
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            built = make(accum)
            faults.probe_built(spec.fault, built)
            probe_step(built[-1], plan, spec, accum, device)
            if device.type == "cuda":  # fits, but too close to the edge: the timed steps would hit it
                peak = torch.cuda.max_memory_allocated(device)
                total = torch.cuda.get_device_properties(device).total_memory
                if peak > PROBE_HEADROOM * total:
                    raise torch.OutOfMemoryError(f"probe peak {peak / 2**30:.1f} GiB is over {PROBE_HEADROOM:.0%} "
                                                 f"of {total / 2**30:.1f} GiB")
            probe.append([cand["mbs"], Status.OK])
            break
        except Exception as e:  # anything but an out-of-memory error is re-raised
            if not _is_oom(e):
                raise
            probe.append([cand["mbs"], Status.OOM])
            # the traceback holds the failed steps' frames: their locals (the engine, the batch, the loss and its
            # graph, a model being built) stay alive as long as the exception does
            traceback.clear_frames(e.__traceback__)
        # outside the except clause, where the exception and its traceback are gone
        if built is not None:
            _close(built[-1])
        built = None
        release(device)
    else:
        raise torch.OutOfMemoryError(f"micro_batch_size=max: no micro-batch fits (tried {[c for c, _ in probe]})")
    if device.type == "cuda":  # the peak reported is the measured micro-batch's, not a refused one's
        torch.cuda.reset_peak_memory_stats(device)
    return built, accum, probe


def _close(engine) -> None:
    """Close a refused candidate's engine (what outlives its objects: DeepSpeed's hooks and buffers)."""
    try:
        engine.close()
    except Exception:  # noqa: BLE001 - a refused candidate's engine that cannot close: said in the rank's log
        print("trainscout: closing a refused micro_batch_size=max candidate's engine failed:", file=sys.stderr)
        traceback.print_exc()


def release(device) -> None:
    """What frees a refused candidate once nothing references it (largest_fit: its engine closed, its frames
    cleared, its objects dropped, outside the except clause, where the exception's traceback held the failed step's
    frames): torch.compile's graphs forgotten (they hold the model's modules), then a full collection (the engine
    and the model are in reference cycles, which only a collection frees) and, on a GPU, the allocator's cache
    emptied. Inside the except clause they are still reachable, and a collection there cannot free them: a smaller
    candidate that fits alone would then fail too (docs/trial.md)."""
    import torch
    forget_graphs()
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def alloc_retries(device) -> int | None:
    """How often the CUDA caching allocator has had to free its cache and retry an allocation (memory pressure);
    None on the CPU."""
    import torch
    return torch.cuda.memory_stats(device).get("num_alloc_retries", 0) if device.type == "cuda" else None


def measure_below(spec: TrialSpec, plan, device, batches: list, timed_step, peaks, retries: int | None) -> dict | None:
    """The candidate one below the probed micro-batch, timed like it: its steps and peaks, or None where there is
    none, or where the probed micro-batch's timed steps made the allocator retry no allocation (retries == 0; None:
    the CPU, where nothing says). The same work in more, smaller micro-batches does not run faster unless the larger
    one pressed against the GPU's memory (measured: docs/trial.md), while costing a compile at its shape and four
    more steps. plan is put back;
    timed_step(accum) -> (phase times, loss)."""
    import torch
    nxt = [c for c in spec.probe if c["mbs"] < plan.micro_batch_size][:1]
    if not nxt or retries == 0:
        return None
    chosen = (plan.micro_batch_size, plan.grad_accum)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    plan.micro_batch_size, plan.grad_accum, low = nxt[0]["mbs"], nxt[0]["grad_accum"], nxt[0]["measured_accum"]
    batches[:] = [b[: plan.sequences_per_call] for b in batches]
    forget_graphs()  # its own static graphs, as a run at this micro-batch compiles them
    timed_step(low)  # one untimed step at this size
    t = time.perf_counter()
    alt = [timed_step(low)[0] for _ in range(spec.timed_steps)]
    timed_s = time.perf_counter() - t
    plan.micro_batch_size, plan.grad_accum = chosen
    return dict(nxt[0], steps=alt, timed_s=timed_s, **peaks(device))
