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
    # killed by the host's memory monitor (Ray's, the node running low on memory; the kernel's OOM killer): the
    # host's state, not the configuration's oom. Never served from the store, not counted toward --trials
    HOST_OOM = "host_oom"
    # its node left the cluster while it ran (stopped, preempted, failed): the cluster's state, not the configuration's.
    # Never served from the store, not counted toward --trials; the search goes on with the remaining nodes
    NODE_LOST = "node_lost"


MEASURED = (Status.OK, Status.OOM, Status.TIMEOUT, Status.CRASH, Status.INVALID)  # a measurement record's outcomes
# outcomes that say nothing of the configuration (nothing ran, or the host killed it): no measurement is stored,
# the sampler is told nothing, and they do not count toward --trials
NOT_MEASURED = (Status.UNSCHEDULED, Status.HOST_OOM, Status.NODE_LOST)
# of those, the ones that do not count toward --trials either (an unscheduled trial waited its placement limit: it
# counts): the host or the cluster lost the trial, and the search draws another in its place
NOT_COUNTED = (Status.HOST_OOM, Status.NODE_LOST)
DETERMINISTIC = (Status.OK, Status.OOM, Status.INVALID)  # served from the store; crash and timeout are measured again

_OOM = re.compile(r"OutOfMemoryError|CUDA out of memory|can't allocate memory|DefaultCPUAllocator|"
                  r"CUBLAS_STATUS_ALLOC_FAILED|out of memory", re.I)


# Ray's memory monitor ("Task was killed due to the node running low on memory", ray.exceptions.OutOfMemoryError,
# whose name alone would read as the configuration's oom) and the kernel's OOM killer of a rank (SIGKILL, -9)
_HOST_OOM = re.compile(r"running low on memory|killed by the memory monitor|Out of memory: Killed process", re.I)


# Ray's error for an actor whose node left the cluster ("The actor died because its node has died. Node Id: ...")
_NODE_LOST = re.compile(r"its node has died|node (?:has )?died|NodeDiedError", re.I)
_NODE_ID = re.compile(r"Node Id: ([0-9a-f]{8,})", re.I)


# an actor's failure, as Ray words it: its process or node unreachable, or dead ("The actor ID is unavailable: ...
# Socket closed", "The actor died unexpectedly ... actor_id: ID"); the ids of the actors and nodes it names
_ACTOR_FAILED = re.compile(r"ActorUnavailableError|ActorDiedError|RayActorError|actor \S+ is unavailable|"
                           r"actor died|actor is dead", re.I)
_ACTOR_IDS = re.compile(r"\bactor(?:[ _]id)?[:=]?\s+([0-9a-f]{32})\b", re.I)
_NODE_IDS = re.compile(r"\bnode[ _]?id[:=]?\s+([0-9a-f]{56})\b", re.I)


def actor_failure(error: str) -> tuple[list[str], list[str]]:
    """(actor ids, node ids) an actor's failure names, hex; ([], []) for any other error. Whether their nodes are gone
    is Ray's to say (trial.pool.lost_in): the text alone does not tell a lost node from a crashed process."""
    if not _ACTOR_FAILED.search(error):
        return [], []
    return list(dict.fromkeys(_ACTOR_IDS.findall(error))), list(dict.fromkeys(_NODE_IDS.findall(error)))


def classify(error: str) -> Status:
    """host_oom, node_lost, oom or crash, from an error's text (the exception line and the ranks' log tails)."""
    if _HOST_OOM.search(error):
        return Status.HOST_OOM
    if _NODE_LOST.search(error):
        return Status.NODE_LOST
    return Status.OOM if _OOM.search(error) else Status.CRASH


def host_oom_line(error: str) -> str:
    """One line naming the cause of a host_oom, from Ray's message (which says how much memory the node used)."""
    used = re.search(r"Memory on the node \(IP: ([^,]+),[^)]*\) was ([\d.]+\s*\w+ used / [\d.]+\s*\w+ limit"
                     r"(?: \([\d.]+\))?)", error)
    where = f" (node {used.group(1)}: {used.group(2)})" if used else ""
    return (f"killed by the host's memory monitor{where}: the node ran low on memory (other processes, or this "
            "trial's host memory); not the configuration's oom, nothing stored: free host memory, or raise "
            "RAY_memory_usage_threshold, then measure it again")


def node_lost_line(error: str = "", node: str | None = None) -> str:
    """One line naming the node a node_lost trial ran on: node (its address and id, as the pool names it), else the
    node id in Ray's message."""
    if node is None:
        found, ip = _NODE_ID.search(error or ""), re.search(r"\bip: (\S+)", error or "")
        node = (f"{ip.group(1) if ip else '?'} (id {found.group(1)[:8]})") if found else "(not named by Ray)"
    return (f"lost with its node {node}: the node left the cluster (stopped, preempted or failed) while the trial ran; "
            "not the configuration's outcome: nothing stored, not counted toward --trials (a search goes on with the "
            "remaining nodes)")


def lost_node(error: str | None) -> str | None:
    """The node a node_lost trial's line names (node_lost_line's "lost with its node NODE: ..."), else None."""
    found = re.search(r"lost with its node (.+?): the node left", error or "")
    return found.group(1) if found else None


def served(status: str, error: str | None, metrics: dict | None = None) -> bool:
    """Whether a stored outcome is the configuration's own, served from the store instead of measured again: ok, oom
    or invalid (DETERMINISTIC), less an oom that was the host's memory monitor (stored as `oom` before host_oom
    existed: "1 worker(s) were killed due to the node running low on memory", a 7B ZeRO-2 offload on an H100), and
    less a measurement other trials shared the CPU or GPU of (metrics: trial.contention.shared_in)."""
    from .contention import shared_in
    return (status in DETERMINISTIC and not (status == Status.OOM and _HOST_OOM.search(error or ""))
            and not shared_in(metrics))
