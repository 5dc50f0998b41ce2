"""Fault injection for tests: make one rank of a trial fail like real trials do. Off unless asked for.

Set TRAINSCOUT_FAULT (or the hidden CLI flag --inject-fault) to KIND[@RANK] with KIND one of
  oom     allocate far more than the device holds (a real allocator failure: CUDA OOM on a GPU)
  crash   the worker process exits abruptly (exit code 3), as a segfault or a killed process would
  hang    the worker stops making progress (sleeps), as an NCCL hang would; the trial timeout must kill it
  assert  an AssertionError, as a library's failed check would
  unpicklable  an error holding a stack frame, which pickle refuses (torch.compile's errors do this)
  held    micro_batch_size=max's probe (trial/probe.py): a candidate fails with torch.OutOfMemoryError while the
          model, engine or optimizer of the candidate tried before it is still alive, as on a GPU whose memory that
          candidate still holds (the CPU has no device memory to run out of); with TRAINSCOUT_FAKE_CAPACITY_MBS
          (candidates above it fail) it checks that a refused candidate's memory is released before the next
The fault fires at the first timed step of rank RANK (default 0); `held` fires in the probe instead (one rank).
"""
from __future__ import annotations

import os
import sys
import time
import weakref

KINDS = ("oom", "crash", "hang", "assert", "unpicklable", "held")
PROBE_KINDS = ("held",)  # fire in micro_batch_size=max's probe, not at the first timed step


class InjectedCompileError(RuntimeError):
    """Holds a stack frame, as torch.compile's errors do: pickle refuses it."""

    def __init__(self, msg: str):
        super().__init__(msg)
        self.frame = sys._getframe(1)


def parse(spec: str | None) -> tuple[str, int] | None:
    """A fault spec KIND[@RANK] as (kind, rank), rank 0 by default; None for no spec, ValueError for a bad one."""
    if not spec:
        return None
    kind, _, rank = spec.partition("@")
    if kind not in KINDS or (rank and not rank.isdigit()):
        raise ValueError(f"fault {spec!r}: use KIND[@RANK] with KIND one of {'|'.join(KINDS)}")
    return kind, int(rank or 0)


def fire(spec: str | None, rank: int, device) -> None:
    """Raise, exit or hang here if the fault is meant for this rank."""
    fault = parse(spec)
    if not fault or fault[1] != rank:
        return
    kind = fault[0]
    if kind in PROBE_KINDS:
        return
    print(f"trainscout: injected fault {kind} on rank {rank}", file=sys.stderr, flush=True)
    if kind == "oom":
        import torch
        torch.empty(1 << 46, dtype=torch.uint8, device=device)  # more than any GPU holds: the allocator refuses it
    elif kind == "crash":
        os._exit(3)
    elif kind == "hang":
        while True:
            time.sleep(3600)
    elif kind == "assert":
        raise AssertionError("injected assertion failure")
    elif kind == "unpicklable":
        raise InjectedCompileError("injected failure that cannot be pickled")


# --- held: micro_batch_size=max's candidates ---------------------------------------------------------------------
_candidate: list[weakref.ref] = []  # the candidates' models, engines and optimizers built so far (weak references)


def _held(spec: str | None) -> bool:
    fault = parse(spec)
    return fault is not None and fault[0] == "held"


def probe_built(spec: str | None, built: tuple) -> None:
    """Fault held: remember the candidate just built (make()'s result: model, ..., engine) and its engine's
    optimizers, weakly."""
    if not _held(spec):
        return
    objs = [o for o in built if hasattr(o, "__weakref__")]
    engine = built[-1]
    objs += list(engine.optimizers()) if hasattr(engine, "optimizers") else []
    _candidate[:] = [r for r in _candidate if r() is not None] + [weakref.ref(o) for o in objs]


def probe_candidate(spec: str | None, mbs: int) -> None:
    """Fault held, before a candidate is built: torch.OutOfMemoryError where anything of the candidate built before it
    is still alive (its memory would still be held on a GPU)."""
    if not _held(spec):
        return
    _candidate[:] = [r for r in _candidate if r() is not None]
    alive = sorted({type(r()).__name__ for r in _candidate})
    if alive:
        import torch
        print(f"trainscout: injected fault held on rank 0: micro-batch {mbs}", file=sys.stderr, flush=True)
        raise torch.OutOfMemoryError(f"injected fault held: micro-batch {mbs} was tried while the previous "
                                     f"candidate's {', '.join(alive)} were still alive (their memory not released)")
