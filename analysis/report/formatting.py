"""How the report writes a value, a row and a status: numbers, dollars, days, a trial's label, the knobs worth
reading, HTML-escaped text. Shared by the terminal summary, the plots and the page."""
from __future__ import annotations

import html

import pandas as pd

from trainscout.spaces import all_knobs, fmt, get
from trainscout.trial.status import Status

NO_SEARCH = "(measurements)"  # the search column of a store's measurements when it holds no search rows
STATUS_TEXT = {
    Status.OOM: "out of memory", Status.TIMEOUT: "ran past its time limit; workers killed",
    Status.CRASH: "a rank crashed",
    Status.INVALID: "refused before running: the configuration cannot run here",
    Status.STOPPED: "stopped early by ASHA: slower than its peers at the same step",
    Status.PRUNED: "skipped: the memory model predicted it over the GPU's memory",
    Status.UNSCHEDULED: "never ran: the cluster gave its ranks no room within the time limit",
}
STATUS_COLOR = {Status.OK: "#2e7d32", Status.OOM: "#c62828", Status.TIMEOUT: "#ef6c00", Status.CRASH: "#6a1b9a",
                Status.INVALID: "#757575", Status.STOPPED: "#1565c0", Status.PRUNED: "#8d6e63",
                Status.UNSCHEDULED: "#bdbdbd"}


MISSING = "-"  # a value not known or not measured, in every table and line (pandas printed <NA> and NaN)


def is_missing(v) -> bool:
    """Whether a value is missing: None, NaN or pandas' NA."""
    return v is None or (pd.api.types.is_scalar(v) and bool(pd.isna(v)))


def escape(v) -> str:
    """A value as HTML-escaped text ("" for None)."""
    return html.escape("" if v is None else str(v))


def first_line(text: str, limit: int = 300) -> str:
    """The first non-blank line of text, without emoji, cut to limit characters."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    line = "".join(ch for ch in (lines[0] if lines else "") if ord(ch) <= 0xFFFF).strip()  # no emoji
    return line if len(line) <= limit else line[:limit - 1] + "…"


def native_value(knob, v):
    """A table cell as the knob's own value (pandas turns an int column with gaps into floats)."""
    if is_missing(v):  # None, NaN and pandas' NA (an Int64 column's gap: a knob added after a record was stored)
        return None
    if hasattr(v, "item"):
        v = v.item()
    if isinstance(v, float) and v.is_integer() and any(type(c) is int for c in knob.choices):
        return int(v)
    return v


def config_text(row, varied: list[str], knobs: list[str] | None = None) -> str:
    """The knobs worth reading: those set away from their default and those the store varied."""
    out = []
    for name in knobs or [k.name for k in all_knobs()]:
        if name not in row:
            continue
        knob = get(name)
        v = native_value(knob, row[name])
        if v is None:
            continue
        if name in varied or fmt(v) != fmt(knob.default):
            out.append(f"{name}={fmt(v)}")
    return " ".join(out)


def usd(v) -> str:
    """US dollars as text: whole dollars from $1000, else cents (2 significant digits under one); "-" if missing."""
    if is_missing(v):
        return MISSING
    if 0 < v < 0.01:
        return f"${v:.2g}"  # a tiny model's run: the digits that are there, not a rounded zero
    return f"${v:,.2f}" if v < 1000 else f"${v:,.0f}"


def days(v) -> str:
    """Days as text, no unit: one decimal from 10 up, three significant digits below; "-" if missing."""
    if is_missing(v):
        return MISSING
    return f"{v:,.1f}" if v >= 10 else f"{v:.3g}"


def num(v, spec: str = ",.0f") -> str:
    """A number formatted with spec (default: whole, thousands separated); "-" if missing."""
    return MISSING if is_missing(v) else format(v, spec)


def where(row) -> str:
    """A row's hardware and world size as text, e.g. "H200 x8"; "?" for unknown hardware."""
    n = row.get("world_size")
    return f"{row.get('hardware') or '?'} x{int(n)}" if not is_missing(n) else str(row.get("hardware") or "?")


def search_name(search: str) -> str:
    """A search as prose names it: "search NAME", or "the measurements" for a store without searches."""
    return "the measurements" if search == NO_SEARCH else f"search {search}"


def label(row) -> str:
    """A trial as its row in the trial table names it: number, trial id, key."""
    key = row.get("key")
    return f"#{row['n']} {row.get('trial') or ''}" + (f" [{str(key)[:8]}]" if isinstance(key, str) else "")


def contributed(row) -> str:
    """" (contributed: FILE)" for a row imported from a share file (store/contrib.py), else ""."""
    origin = row.get("origin")
    return f" (contributed: {origin.split(':', 1)[1]})" if isinstance(origin, str) and origin.startswith(
        "contributed:") else ""


def gpu_s_text(row) -> str:
    """A row's device-seconds (wall time × ranks) as text, "≈N (est.)" when estimated; "-" if missing."""
    v = row.get("gpu_s")
    if is_missing(v):
        return MISSING
    return f"≈{v:,.0f} (est.)" if row.get("gpu_s_estimated") else f"{v:,.0f}"
