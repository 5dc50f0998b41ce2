"""Fault injection for tests: make one rank of a trial fail like real trials do. Off unless asked for.

Set TRAINSCOUT_FAULT (or the hidden CLI flag --inject-fault) to KIND[@RANK] with KIND one of
  oom     allocate far more than the device holds (a real allocator failure: CUDA OOM on a GPU)
  crash   the worker process exits abruptly (exit code 3), as a segfault or a killed process would
  hang    the worker stops making progress (sleeps), as an NCCL hang would; the trial timeout must kill it
  assert  an AssertionError, as a library's failed check would
  unpicklable  an error holding a stack frame, which pickle refuses (torch.compile's errors do this)
The fault fires at the first timed step of rank RANK (default 0).
"""
from __future__ import annotations

import os
import sys
import time

KINDS = ("oom", "crash", "hang", "assert", "unpicklable")


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
    print(f"trainscout: injected fault {kind} on rank {rank}", file=sys.stderr, flush=True)
    if kind == "oom":
        import torch
        torch.empty(1 << 46, dtype=torch.uint8, device=device)  # 64 TiB: the allocator refuses it
    elif kind == "crash":
        os._exit(3)
    elif kind == "hang":
        while True:
            time.sleep(3600)
    elif kind == "assert":
        raise AssertionError("injected assertion failure")
    elif kind == "unpicklable":
        raise InjectedCompileError("injected failure that cannot be pickled")
