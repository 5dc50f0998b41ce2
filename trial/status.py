"""A trial's outcome: the one list of statuses, and how a failure's text is classified."""
from __future__ import annotations

import re
from enum import StrEnum


class Status(StrEnum):
    """Outcomes of a trial (a measurement) and of a search's trial. A StrEnum: stored and compared as its value."""

    OK = "ok"
    OOM = "oom"            # out of memory: the configuration does not fit
    TIMEOUT = "timeout"    # no result within the hard time limit
    CRASH = "crash"        # any other failure (measured again up to --max-failures times)
    INVALID = "invalid"    # refused before launch: an impossible combination
    PRUNED = "pruned"      # search only: not launched, the memory model predicts it does not fit
    STOPPED = "stopped"    # search only: ended early by ASHA
    RUNNING = "running"    # search only: a trial's report after a timed step, before its outcome
    UNSCHEDULED = "unscheduled"  # never got its resources in time (a cluster others use): says nothing of the config


MEASURED = (Status.OK, Status.OOM, Status.TIMEOUT, Status.CRASH, Status.INVALID)  # a measurement record's outcomes
DETERMINISTIC = (Status.OK, Status.OOM, Status.INVALID)  # served from the store; crash and timeout are measured again

_OOM = re.compile(r"OutOfMemoryError|CUDA out of memory|can't allocate memory|DefaultCPUAllocator|"
                  r"CUBLAS_STATUS_ALLOC_FAILED|out of memory", re.I)


def classify(error: str) -> Status:
    """oom or crash, from an error's text (the exception line and the ranks' log tails)."""
    return Status.OOM if _OOM.search(error) else Status.CRASH
