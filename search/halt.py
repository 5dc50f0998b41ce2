"""A store that fails (deleted, full, read-only) while a search runs: the first reason, kept per process, ends the
search (the driver's stopper reads it, the searcher draws nothing more, run_search says what was kept)."""
from __future__ import annotations

_STORE_FAILED: list[str] = []  # why the store failed in this process's running search (the first reason)


def store_failed(why: str) -> None:
    """Record that the store failed (the search's stopper then ends the run; run_search says what was kept)."""
    if not _STORE_FAILED:
        _STORE_FAILED.append(why)


def store_failure() -> str | None:
    """Why the store of the search running in this process failed, or None."""
    return _STORE_FAILED[0] if _STORE_FAILED else None


def clear_store_failure() -> None:
    """Forget an earlier search's store failure (a new search starts in this process)."""
    _STORE_FAILED.clear()
