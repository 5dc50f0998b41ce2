"""A store that fails (deleted, full, read-only) while a search runs: the first reason, kept per process, ends the
search (the driver's stopper reads it, the searcher draws nothing more, run_search says what was kept). A driver
whose lease of its search another driver took over (store.claims: it was paused past the lease) stops the same way,
and ends with its own line instead (lease_failure)."""
from __future__ import annotations

_STORE_FAILED: list[str] = []  # why the store failed in this process's running search (the first reason)
_LEASE_LOST: list[str] = []  # the line of a driver whose search another driver took over (store.claims.Lease.check)


def store_failed(why: str) -> None:
    """Record that the store failed (the search's stopper then ends the run; run_search says what was kept)."""
    if not _STORE_FAILED:
        _STORE_FAILED.append(why)


def store_failure() -> str | None:
    """Why the store of the search running in this process failed, or None."""
    return _STORE_FAILED[0] if _STORE_FAILED else None


def lease_lost(line: str) -> None:
    """Another driver took this search's lease over: nothing more is written, the run stops as for a failed store
    (store_failed), and the driver ends with `line`."""
    if not _LEASE_LOST:
        _LEASE_LOST.append(line)
    store_failed(line)


def lease_failure() -> str | None:
    """The line of a lost lease of the search running in this process, or None."""
    return _LEASE_LOST[0] if _LEASE_LOST else None


def clear_store_failure() -> None:
    """Forget an earlier search's store failure or lost lease (a new search starts in this process)."""
    _STORE_FAILED.clear()
    _LEASE_LOST.clear()
