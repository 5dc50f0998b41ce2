"""The report of a results store: the best configurations with tokens/s, MFU, projected days and cost; where a
step's time goes; measured peak memory beside the memory model's components; the hardware side by side; what failed
and why; which knobs mattered (Optuna's own PED-ANOVA evaluator on a study rebuilt in memory from the table) and
controlled comparisons of measurements that differ in one knob. `report.html` is self-contained: plots are inline
SVG (matplotlib, Agg), no script, no stylesheet or image from anywhere else.
"""
from __future__ import annotations

import html
import io
import json
import itertools
import math
import os
import re
import shlex
import warnings
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING

import pandas as pd

from trainscout.spaces import ConfigError, all_knobs, fmt, get
from trainscout.store import secrets
from trainscout.trial.status import Status

from . import cost, table, ties

if TYPE_CHECKING:
    from trainscout.trial.records import Record

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
TOP = 10  # best configurations listed
NO_SEARCH = "(measurements)"  # the search column of a store's measurements when it holds no search rows
FEW_TRIALS = 20  # below this many measured trials, knob importance is a hint: PED-ANOVA's top quantile is 2-4 trials
_PLOT = itertools.count(1)


@dataclass
class Analysis:
    """What analyse() found in a store: the results table and what the summary and report.html show of it."""
    source: str
    df: pd.DataFrame                 # the results table (analysis.table.load_resolved) with hardware and costs
    prices: list[cost.Price]
    prices_path: str | None
    records: dict                    # measurement key -> stored Record (for started_at / wall_s)
    best: pd.DataFrame               # ok measurements, one row per key, fastest first
    hardware: pd.DataFrame           # cost.compare_hardware
    failures: list[dict]             # per status that is not ok: count and one example
    importance: list[dict]           # per search: PED-ANOVA importances of the knobs it searched
    varied: list[str]                # knobs with more than one value in the store
    searched: bool = True            # False: a store of measurements only (one row per measurement, no search)
    tie: object = None               # analysis.ties.Choice: the best, and what is within its measured noise
    generated: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"))


# --- analysis ---------------------------------------------------------------------------------------------------
def analyse(source, prices_path: str | None = None) -> Analysis:
    """Everything the summary and report.html show. ConfigError for a bad prices file or an empty store."""
    prices = cost.load_prices(prices_path)  # checked before anything heavy
    store = table.store_of(source) if isinstance(source, str) else source
    df = table.load_resolved(store)  # the trials, or the measurements of a store without searches
    if df.empty:
        raise ConfigError("DIR", f"{source} holds no trials or measurements: run `trainscout search --out DIR` (or "
                                 "`trainscout results DIR --import FILE`) first, then report")
    searched = bool(df["search"].notna().any())
    df = cost.with_costs(df.assign(search=df["search"].fillna(NO_SEARCH)), prices)
    # the trial's number in the report: its Optuna trial number (the live table's and optuna-dashboard's; the report
    # said #4 for Optuna's 3), else its row from 0; rows keep their own anchor ("row")
    df.insert(0, "row", range(len(df)))
    df.insert(0, "n", [int(n) if not _na(n) else i for i, n in enumerate(df["number"])])
    records = {m.key: m for m in store.measurements()}
    knobs = [k.name for k in all_knobs() if k.name in df.columns]
    varied = [k for k in knobs if df[k].dropna().map(fmt).nunique() > 1]
    ok = df[(df["status"] == Status.OK) & df["tokens_per_s"].notna()]
    best = ok.sort_values("tokens_per_s", ascending=False).drop_duplicates("key").reset_index(drop=True)
    failures = []
    for status, g in df[df["status"] != Status.OK].groupby("status", sort=False):
        with_error = g[g["error"].notna()]
        ex = (with_error if len(with_error) else g).iloc[0]
        failures.append({"status": status, "count": len(g), "what": STATUS_TEXT.get(status, status),
                         "error": _first_line(ex["error"]) if isinstance(ex["error"], str) else None,
                         "config": config_text(ex, varied, knobs), "key": ex["key"]})
    failures.sort(key=lambda f: -f["count"])
    importance = [imp for search, g in df.groupby("search", sort=False) if (imp := knob_importance(g, search))]
    shown = str(source if isinstance(source, str) else getattr(source, "url", source))
    return Analysis(source=secrets.masked(shown) if "://" in shown else shown, df=df,
                    prices=prices, prices_path=prices_path, records=records, best=best,
                    hardware=cost.compare_hardware(df, prices), failures=failures, importance=importance,
                    varied=varied, searched=searched, tie=ties.choose(list(records.values())))


def _tied_keys(a: Analysis) -> set:
    """The keys of the configurations within the measured noise of the fastest (empty: no tie)."""
    return {r.key for r in a.tie.tied} if a.tie is not None and len(a.tie.tied) > 1 else set()


def tie_text(a: Analysis) -> str:
    """One sentence on the tie at the top (analysis.ties): which is the best, and why."""
    c = a.tie
    if c.is_tie:
        return c.line()[0].upper() + c.line()[1:] + "."
    return (f"The fastest, {c.fastest.key[:12]}, is also the simplest of the {len(c.tied)} configurations within the "
            f"measured noise ({c.noise:.1%}) of it, marked (tie): it is the best (rule: README, ties).")


def _first_line(text: str, limit: int = 300) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    line = "".join(ch for ch in (lines[0] if lines else "") if ord(ch) <= 0xFFFF).strip()  # no emoji
    return line if len(line) <= limit else line[:limit - 1] + "…"


def _native(knob, v):
    """A table cell as the knob's own value (pandas turns an int column with gaps into floats)."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return None
    if hasattr(v, "item"):
        v = v.item()
    if isinstance(v, float) and v.is_integer() and any(type(c) is int for c in knob.choices):
        return int(v)
    return v


def knob_importance(trials: pd.DataFrame, search: str) -> dict | None:
    """Which knobs mattered in one search: its trials as an in-memory Optuna study (the objective the search
    maximised: tokens/s, 0 for an infeasible outcome), evaluated by Optuna's PedAnovaImportanceEvaluator.
    None when fewer than 3 trials or no knob took two values."""
    import optuna
    from optuna.distributions import CategoricalDistribution
    from optuna.importance import PedAnovaImportanceEvaluator, get_param_importances

    knobs = [k for k in all_knobs() if k.name in trials.columns]
    rows = trials.to_dict("records")
    cfgs = [{k.name: _native(k, r[k.name]) for k in knobs} for r in rows]
    searched = {}
    for k in knobs:
        seen = {fmt(c[k.name]): c[k.name] for c in cfgs if c[k.name] is not None}
        if len(seen) > 1:
            order = [c for c in k.choices if fmt(c) in seen] + [v for f, v in seen.items()
                                                                  if f not in {fmt(c) for c in k.choices}]
            searched[k.name] = CategoricalDistribution(order)
    if len(rows) < 3 or not searched:
        return None
    made = []
    for r, c in zip(rows, cfgs):
        tps = r["tokens_per_s"]
        value = float(tps) if r["status"] in (Status.OK, Status.STOPPED) and tps is not None and not pd.isna(tps) else 0.0
        params = {n: c[n] for n in searched if c[n] is not None and get(n).applies(c)}
        made.append(optuna.trial.create_trial(params=params, distributions={n: searched[n] for n in params},
                                              value=value))
    # PED-ANOVA compares the top quantile of trials with all of them; at least 2 trials on top
    quantile = min(0.5, max(0.1, 2 / len(made)))
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            study = optuna.create_study(direction="maximize")
            study.add_trials(made)
            values = get_param_importances(study, evaluator=PedAnovaImportanceEvaluator(target_quantile=quantile),
                                           params=sorted(searched))
    finally:
        optuna.logging.set_verbosity(verbosity)
    return {"search": search, "trials": len(made), "evaluator": f"PED-ANOVA (Optuna), top {quantile:.0%} of trials",
            "values": {k: float(v) for k, v in sorted(values.items(), key=lambda kv: -kv[1])}}


def config_text(row, varied: list[str], knobs: list[str] | None = None) -> str:
    """The knobs worth reading: those set away from their default and those the store varied."""
    out = []
    for name in knobs or [k.name for k in all_knobs()]:
        if name not in row:
            continue
        knob = get(name)
        v = _native(knob, row[name])
        if v is None:
            continue
        if name in varied or fmt(v) != fmt(knob.default):
            out.append(f"{name}={fmt(v)}")
    return " ".join(out)


def pareto_front(points: list[tuple[float, float, int]]) -> list[int]:
    """Indices of the points no other point beats on both axes (both minimised), by the first axis."""
    front, best_y = [], math.inf
    for x, y, i in sorted(points):
        if y < best_y:
            front.append(i)
            best_y = y
    return front


# --- formatting -----------------------------------------------------------------------------------------------
def _na(v) -> bool:
    return v is None or (pd.api.types.is_scalar(v) and bool(pd.isna(v)))


def usd(v) -> str:
    """US dollars as text: whole dollars from $1000, else cents (2 significant digits under one); "n/a" if missing."""
    if _na(v):
        return "n/a"
    if 0 < v < 0.01:
        return f"${v:.2g}"  # a tiny model's run: the digits that are there, not $0.00
    return f"${v:,.2f}" if v < 1000 else f"${v:,.0f}"


def days(v) -> str:
    """Days as text, no unit: one decimal from 10 up, three significant digits below; "n/a" if missing."""
    if _na(v):
        return "n/a"
    return f"{v:,.1f}" if v >= 10 else f"{v:.3g}"


def num(v, spec: str = ",.0f") -> str:
    """A number formatted with spec (default: whole, thousands separated); "n/a" if missing."""
    return "n/a" if _na(v) else format(v, spec)


def where(row) -> str:
    """A row's hardware and world size as text, e.g. "H200 x8"; "?" for unknown hardware."""
    n = row.get("world_size")
    return f"{row.get('hardware') or '?'} x{int(n)}" if not _na(n) else str(row.get("hardware") or "?")


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
    """A row's device-seconds (wall time × ranks) as text, "≈N (est.)" when estimated; "n/a" if missing."""
    v = row.get("gpu_s")
    if _na(v):
        return "n/a"
    return f"≈{v:,.0f} (est.)" if row.get("gpu_s_estimated") else f"{v:,.0f}"


def spent_text(a: Analysis) -> str | None:
    """The device time the trials held, with the share estimated for trials ASHA stopped (they leave no record)."""
    df = a.df
    if not df["gpu_s"].notna().any():
        return None
    unit = "GPU-hours" if (df["device"].dropna() != "cpu").any() else "worker-hours (CPU)"
    est = df[df["gpu_s_estimated"]]
    text = f"{df['gpu_s'].sum() / 3600:,.3g} {unit} spent"
    if len(est):
        text += (f", of which ≈{est['gpu_s'].sum() / 3600:,.3g} by {len(est)} trial(s) ASHA stopped early "
                 "(estimated: the median of the search's trials that ran to the end; a stopped trial leaves no record)")
    unknown = int((df["gpu_s"].isna()).sum())
    if unknown:
        text += f"; {unknown} trial(s) without a record of their time are not counted"
    return text


# --- terminal summary ------------------------------------------------------------------------------------------
def summary(a: Analysis, top: int = 5) -> str:
    """The terminal summary: counts, device time spent, the `top` fastest configurations, hardware side by side,
    what failed and which knobs mattered."""
    df = a.df
    counts = df["status"].value_counts()
    cached = int(df["cached"].sum())
    parts = ", ".join(f"{int(n)} {s}" for s, n in counts.items()) + (f"; {cached} served from the store" if cached else "")
    searches = df["search"].nunique()
    if a.searched:
        lines = [f"report of {a.source}: {searches} search{'es' if searches != 1 else ''}, {len(df)} trials ({parts})"]
    else:
        lines = [f"report of {a.source}: {len(df)} measurements, no search ({parts})"]
    spent = spent_text(a)
    if spent:
        lines.append(spent)
    if len(a.best):
        lines.append("best configurations (fastest first; rent = projected days x $/GPU-hour x GPUs, box = buying "
                     "the GPUs and machines):")
        tied = _tied_keys(a)
        for i, r in a.best.head(top).iterrows():
            lines.append(f"  #{i + 1}{' (tie)' if r['key'] in tied else ''} {num(r['tokens_per_s'])} tokens/s  "
                         f"MFU {num(r['mfu'], '.3f')}  quality {r['quality']}  "
                         f"{num(r['peak_memory_gib'], '.2f')} GiB/rank  {days(r['projected_days'])} days  "
                         f"rent {usd(r['rent_usd'])}  box {usd(r['box_usd'])}  {r['model']} on {where(r)}  "
                         f"{config_text(r, a.varied)}  [{str(r['key'])[:12]}]{contributed(r)}")
        if tied:
            lines.append(f"  {tie_text(a)}")
    else:
        lines.append("no trial ran to the end: nothing to rank (see what failed below)")
    if len(a.hardware) > 1:
        lines.append("hardware side by side (fastest configuration of each):")
        for _, h in a.hardware.iterrows():
            lines.append(f"  {h['model']} on {h['hardware']} x{h['world_size']}: {h['ok']}/{h['trials']} ok, "
                         f"{num(h['tokens_per_s'])} tokens/s, {days(h['projected_days'])} days, rent "
                         f"{usd(h['rent_usd'])}, box {usd(h['box_usd'])}")
    unpriced = sorted({str(h) for h, p in zip(a.df["hardware"], a.df["price"]) if not _na(h) and _na(p)})
    if unpriced:
        lines.append(f"no price for {', '.join(unpriced)}: add it with --prices FILE.json (see analysis/prices.json)")
    if a.failures:
        lines.append("did not finish:")
        for f in a.failures:
            why = f["error"] or f["what"]
            why = why if len(why) <= 160 else why[:159] + "…"
            lines.append(f"  {f['status']} x{f['count']}: {why}" + (f"  (e.g. {f['config']})" if f["config"] else ""))
    else:
        lines.append("every trial finished")
    for imp in a.importance[:3]:
        vals = ", ".join(f"{k} {v:.2f}" for k, v in imp["values"].items())
        lines.append(f"knobs that mattered in {search_name(imp['search'])} ({imp['trials']} trials, {imp['evaluator']}): "
                     + (vals if any(imp["values"].values()) else "none separated the fast trials from the rest"))
    if not a.importance:
        lines.append("knobs that mattered: too few trials (a search with >= 3 trials and a knob that took two values)")
    return "\n".join(lines)


# --- plots (inline SVG) ----------------------------------------------------------------------------------------
def _tip(fig, artist, title: str) -> None:
    """A hover title (an SVG <title>) on any drawn artist: a bar segment, a line."""
    tips = fig.__dict__.setdefault("_tips", {})
    gid = f"tip{len(tips)}"
    tips[gid] = title
    artist.set_gid(gid)


def _dot(fig, ax, x, y, title: str, **kw) -> None:
    """One plotted point with a hover title (an SVG <title>), so that a dot can be matched to its table row."""
    _tip(fig, ax.scatter([x], [y], **kw), title)


def _svg(fig) -> str:
    import matplotlib
    buf = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none"}):  # text stays text: no glyph definitions per plot
        fig.savefig(buf, format="svg", bbox_inches="tight")
    s = buf.getvalue()
    s = s[s.index("<svg"):]
    s = re.sub(r"<metadata>.*?</metadata>", "", s, flags=re.S)
    s = re.sub(r'\s+xmlns(:xlink)?="[^"]*"', "", s, count=2)  # namespaces are implied in HTML
    # the plots share one document: give each plot's ids (and the references to them) its own prefix
    p = f"p{next(_PLOT)}-"
    s = re.sub(r'(\sid=")([^"]+")', rf"\g<1>{p}\2", s)
    s = re.sub(r'(url\(#|href="#)', rf"\g<1>{p}", s)
    tips = fig.__dict__.get("_tips", {})
    return re.sub(rf'(<g id="{p}(tip\d+)">)', lambda m: f"{m[1]}<title>{_e(tips.get(m[2], ''))}</title>", s)


def _figure(w: float, h: float):
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib.figure import Figure
    fig = Figure(figsize=(w, h), dpi=100, layout="constrained")
    return fig


def _label(ax, x: float, y: float, text: str, size: float) -> None:
    """Text just right of a bar's end (an offset, since SVG text drops leading spaces)."""
    ax.annotate(text, (x, y), xytext=(3, 0), textcoords="offset points", va="center", fontsize=size)


def _note(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, wrap=True, color="#555")
    ax.set_axis_off()


COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22"]


def _group(row) -> str:
    return f"{row.get('model')} on {where(row)}"


def _colors(a: Analysis) -> dict:
    """One colour per model x hardware x world size, the same in every plot."""
    return {g: COLORS[i % len(COLORS)] for i, g in enumerate(dict.fromkeys(_group(r) for r in a.best.to_dict("records")))}


def _thousands(ax) -> None:
    from matplotlib.ticker import FuncFormatter
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))


def plot_pareto(a: Analysis) -> str:
    """Projected days against peak memory per rank of each successful measurement, each model's Pareto front
    ringed (inline SVG)."""
    fig = _figure(10, 4.6)
    ax = fig.subplots()
    b = a.best[a.best["projected_days"].notna() & a.best["peak_memory_gib"].notna()]
    if b.empty:
        _note(ax, "no successful measurement: nothing to plot")
        return _svg(fig)
    colors = _colors(a)
    groups = [_group(r) for r in b.to_dict("records")]
    for g, color in colors.items():
        sel = b[[x == g for x in groups]]
        for j, (i, r) in enumerate(sel.iterrows()):
            _dot(fig, ax, r["peak_memory_gib"], r["projected_days"],
                 f"{label(r)}: {num(r['tokens_per_s'])} tokens/s, {days(r['projected_days'])} days (best #{i + 1})",
                 s=40, color=color, alpha=0.75, label=g if j == 0 else "_nolegend_", zorder=2)
    for model, g in b.groupby("model"):
        front = pareto_front(list(zip(g["peak_memory_gib"], g["projected_days"], g.index)))
        f = g.loc[front]
        ax.plot(f["peak_memory_gib"], f["projected_days"], "--", color="#c62828", lw=1.2, zorder=1,
                drawstyle="steps-post", alpha=0.8)
        ax.scatter(f["peak_memory_gib"], f["projected_days"], s=130, facecolors="none", edgecolors="#c62828",
                   linewidths=1.8, zorder=3, label=f"Pareto front ({model})")
        for i, r in f.iterrows():
            ax.annotate(f"#{i + 1}", (r["peak_memory_gib"], r["projected_days"]), textcoords="offset points",
                        xytext=(7, 5), fontsize=9, color="#c62828")
    if b["projected_days"].max() / max(b["projected_days"].min(), 1e-12) > 30:
        ax.set_yscale("log")
    ax.set_xlabel("peak memory per rank (GiB)")
    ax.set_ylabel("projected days of the full run")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    return _svg(fig)


def plot_cost(a: Analysis, top: int = 20) -> str:
    """Rent of the projected run (US$) of the `top` cheapest priced measurements, as bars (inline SVG)."""
    b = a.best[a.best["rent_usd"].notna()].sort_values("rent_usd").head(top)
    fig = _figure(8, max(2.2, 0.38 * len(b) + 1.2))
    ax = fig.subplots()
    if b.empty:
        _note(ax, "no rental price for the hardware measured here: add one with --prices FILE.json")
        return _svg(fig)
    labels = [f"#{i + 1} {where(r)} [{str(r['key'])[:8]}]" for i, r in b.iterrows()]
    y = range(len(b))
    ax.barh(list(y), b["rent_usd"], color="#00897b")
    for yi, (_, r) in zip(y, b.iterrows()):
        _label(ax, r["rent_usd"], yi, f"{usd(r['rent_usd'])} · {days(r['projected_days'])} days", 8)
    ax.set_yticks(list(y), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("renting the projected run (US$, list-price estimate)")
    ax.set_xlim(0, b["rent_usd"].max() * 1.35)
    ax.grid(axis="x", alpha=0.3)
    return _svg(fig)


def plot_importance(imp: dict) -> str:
    """One search's knob importances as bars (inline SVG)."""
    vals = imp["values"]
    fig = _figure(7, max(1.8, 0.45 * len(vals) + 1))
    ax = fig.subplots()
    names = list(vals)
    ax.barh(names, [vals[n] for n in names], color="#5c6bc0")
    for i, n in enumerate(names):
        _label(ax, vals[n], i, f"{vals[n]:.2f}", 9)
    ax.invert_yaxis()
    ax.set_xlim(0, max(1e-9, max(vals.values())) * 1.2 or 1)
    ax.set_xlabel("importance (normalised, sums to 1)")
    ax.set_title(f"{search_name(imp['search'])}: {imp['trials']} trials, {imp['evaluator']}", fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    return _svg(fig)


def plot_knob_values(a: Analysis) -> str:
    """Tokens/s of each successful measurement per value of each varied knob, a panel per knob (inline SVG)."""
    ok = a.df[(a.df["status"] == Status.OK) & a.df["tokens_per_s"].notna()].drop_duplicates("key")
    knobs = [k for k in a.varied if ok[k].dropna().map(fmt).nunique() > 1] or a.varied
    cols = min(3, max(1, len(knobs)))
    rows = max(1, math.ceil(len(knobs) / cols))
    fig = _figure(3.6 * cols, 2.9 * rows)
    axes = fig.subplots(rows, cols, squeeze=False)
    for ax in axes.flat[len(knobs):]:
        ax.set_axis_off()
    if not knobs or ok.empty:
        _note(axes.flat[0], "no knob took two values among successful trials")
        return _svg(fig)
    colors = _colors(a)
    rows = ok.to_dict("records")
    groups = [_group(r) for r in rows]
    if len(colors) > 1:
        fig.legend(handles=[axes.flat[0].scatter([], [], color=c, label=g) for g, c in colors.items()],
                   loc="outside upper center", ncols=min(3, len(colors)), fontsize=8, frameon=False)
    for ax, name in zip(axes.flat, knobs):
        knob = get(name)
        vals = [_native(knob, v) for v in ok[name]]
        order = [fmt(c) for c in knob.choices if fmt(c) in {fmt(v) for v in vals if v is not None}]
        order += sorted({fmt(v) for v in vals if v is not None} - set(order))
        for xi, value in enumerate(order):
            pts = [(t, colors.get(g, "#1f77b4"), r) for v, t, g, r in zip(vals, ok["tokens_per_s"], groups, rows)
                   if v is not None and fmt(v) == value]
            ys = [t for t, *_ in pts]
            xs = [xi + (j - (len(ys) - 1) / 2) * min(0.08, 0.6 / max(1, len(ys))) for j in range(len(ys))]
            for x, (t, c, r) in zip(xs, pts):
                _dot(fig, ax, x, t, f"{label(r)}: {num(t)} tokens/s, {name}={value}", s=28, color=c, alpha=0.8,
                     zorder=2)
            if len(colors) <= 1:  # a median across different hardware would mean nothing
                med = sorted(ys)[len(ys) // 2]
                ax.plot([xi - 0.3, xi + 0.3], [med, med], color="#c62828", lw=2, zorder=3)
        ax.set_xticks(range(len(order)), order, fontsize=8, rotation=20 if len(order) > 3 else 0)
        ax.set_xlim(-0.6, len(order) - 0.4)
        ax.set_title(name, fontsize=10)
        ax.set_ylabel("tokens/s", fontsize=8)
        _thousands(ax)
        ax.tick_params(axis="y", labelsize=8)
        ax.grid(axis="y", alpha=0.3)
    return _svg(fig)


def _when(s) -> datetime | None:
    try:
        t = datetime.fromisoformat(str(s))
        return t if t.tzinfo else t.replace(tzinfo=timezone.utc)
    except (TypeError, ValueError):
        return None


def _stopped_walls(a: Analysis) -> dict:
    """Row index -> estimated wall seconds of each trial ASHA stopped (no record: the median of its search's ok
    trials measured here, as for its GPU-seconds)."""
    out = {}
    for i, r in a.df[a.df["gpu_s_estimated"]].iterrows():
        same = a.df[(a.df["search"] == r["search"]) & ~a.df["cached"] & (a.df["status"] == Status.OK)
                    & a.df["wall_s"].notna()]["wall_s"]
        if len(same) and _when(r["created_at"]):
            out[i] = float(same.median())
    return out


def plot_timeline(a: Analysis) -> str:
    """Each measurement from its start for its wall time; a trial ASHA stopped (it ran, but leaves no record) as a
    hatched bar of its estimated time ending when the search recorded it; trials that ran nothing (invalid, pruned,
    served from the store) as a mark at the time the search recorded them."""
    bars = []
    for key in dict.fromkeys(a.df["key"].dropna()):
        rec = a.records.get(key)
        start = _when(rec.started_at) if rec else None
        if start and rec.wall_s is not None:
            bars.append((start, float(rec.wall_s), rec.status, str(key)[:8]))
    stopped = _stopped_walls(a)
    for i, wall in stopped.items():
        r = a.df.loc[i]
        bars.append((_when(r["created_at"]) - timedelta(seconds=wall), wall, Status.STOPPED, f"#{r['n']} est."))
    marks = [(_when(r["created_at"]), r["status"], bool(r["cached"])) for i, r in zip(a.df.index, a.df.to_dict("records"))
             if (r["cached"] or not r["key"] or r["key"] not in a.records) and i not in stopped]
    marks = [m for m in marks if m[0]]
    fig = _figure(8, max(2.2, 0.32 * (len(bars) + bool(marks)) + 1.2))
    ax = fig.subplots()
    if not bars and not marks:
        _note(ax, "no start times recorded")
        return _svg(fig)
    bars.sort()
    t0 = min([b[0] for b in bars] + [m[0] for m in marks])
    span = max([(b[0] - t0).total_seconds() + b[1] for b in bars] + [(m[0] - t0).total_seconds() for m in marks] + [1])
    unit, scale = ("min", 60.0) if span > 600 else ("s", 1.0)
    for yi, (start, wall, status, name) in enumerate(bars):
        x = (start - t0).total_seconds() / scale
        est = name.endswith("est.")
        ax.barh(yi, wall / scale, left=x, color=STATUS_COLOR.get(status, "#999"), height=0.6,
                hatch="//" if est else None, alpha=0.55 if est else 1.0)
        _label(ax, x + wall / scale, yi, f"{status} (time estimated)" if est else status, 7)
    labels = [name for *_, name in bars]
    if marks:
        y = len(bars)
        for t, status, cached in marks:
            ax.scatter((t - t0).total_seconds() / scale, y, marker="o" if cached else "x", s=40,
                       color=STATUS_COLOR.get(status, "#999"), zorder=3)
        labels.append("no run (x) / stored (o)")
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel(f"{unit} since the first trial started ({t0:%Y-%m-%d %H:%M} UTC)")
    handles = [ax.scatter([], [], color=c, marker="s", label=s) for s, c in STATUS_COLOR.items()
               if s in {b[2] for b in bars} | {m[1] for m in marks}]
    ax.legend(handles=handles, fontsize=8, loc="lower left", bbox_to_anchor=(0, 1.0), frameon=False,
              ncols=max(1, len(handles)))
    ax.grid(axis="x", alpha=0.3)
    return _svg(fig)


def progress(a: Analysis) -> list[dict]:
    """Per search, in trial order: the device-hours spent after each trial and the best tokens/s so far (ok trials
    only: a stopped trial's tokens/s is the best step it reached before ASHA ended it); and where the best was found."""
    out = []
    for search, g in a.df.groupby("search", sort=False):
        hours = (g["gpu_s"].fillna(0).cumsum() / 3600).tolist()
        ok = g["tokens_per_s"].where(g["status"] == Status.OK)
        best = ok.cummax().ffill().tolist()
        found = None if ok.isna().all() else g.index.get_loc(ok.idxmax())
        out.append({"search": search, "rows": g, "hours": hours, "best": best, "found": found})
    return out


def progress_text(p: dict, unit: str) -> str:
    """One sentence on a progress() entry: when its best tokens/s came, and what was spent since (in unit)."""
    g, hours = p["rows"], p["hours"]
    name, what = search_name(p["search"]), ("trial" if p["search"] != NO_SEARCH else "measurement")
    if p["found"] is None:
        return f"{name}: no {what} ran to the end after {hours[-1]:,.3g} {unit}"
    f = p["found"]
    after = len(g) - f - 1
    text = (f"{name}: the best ({num(p['best'][-1])} tokens/s, {label(g.iloc[f])}) came with {what} {f + 1} of "
            f"{len(g)}, after {hours[f]:,.3g} of {hours[-1]:,.3g} {unit}")
    if after:
        text += f"; the {after} {what}(s) since, {hours[-1] - hours[f]:,.3g} {unit}, found nothing faster"
    return text + "."


def _unit(a: Analysis) -> str:
    return "GPU-hours" if (a.df["device"].dropna() != "cpu").any() else "worker-hours"


def plot_progress(a: Analysis) -> str:
    """Should I keep going: the best tokens/s so far against the device-hours spent, in trial order; each trial a
    dot at the hours spent once it ended (ok filled, stopped hollow, a failure an x on the axis)."""
    fig = _figure(10, 4.2)
    ax = fig.subplots()
    if not a.df["gpu_s"].notna().any():
        _note(ax, "no trial recorded its time: nothing to plot")
        return _svg(fig)
    unit = _unit(a)
    for si, p in enumerate(progress(a)):
        color = COLORS[si % len(COLORS)]
        name = p["search"] if len(a.df["search"].unique()) > 1 else "best so far"
        ax.step(p["hours"], p["best"], where="post", color=color, lw=1.8, label=name, zorder=1)
        for h, (_, r) in zip(p["hours"], p["rows"].iterrows()):
            tps, status = r["tokens_per_s"], r["status"]
            ran = status in (Status.OK, Status.STOPPED) and not _na(tps)
            kw = ({"s": 34, "color": color} if status == Status.OK else
                  {"s": 34, "facecolors": "none", "edgecolors": color} if ran else
                  {"s": 30, "marker": "x", "color": STATUS_COLOR.get(status, "#999")})
            _dot(fig, ax, h, tps if ran else 0.0, f"{label(r)} {status}: {num(tps) + ' tokens/s' if ran else ''} "
                 f"after {h:,.3g} {unit}" + (" (its time estimated)" if r["gpu_s_estimated"] else ""),
                 zorder=2, alpha=0.85, **kw)
    lines = ax.get_legend_handles_labels()[0]
    seen = set(a.df["status"])
    handles = [ax.scatter([], [], s=34, color="#555", label="ok")] if Status.OK in seen else []
    if Status.STOPPED in seen:
        handles.append(ax.scatter([], [], s=34, facecolors="none", edgecolors="#555", label="stopped by ASHA (ran)"))
    if seen - {Status.OK, Status.STOPPED}:
        handles.append(ax.scatter([], [], s=30, marker="x", color="#c62828", label="failed / did not run"))
    ax.legend(handles=lines + handles, fontsize=8, loc="upper left",
              bbox_to_anchor=(1.01, 1.0), frameon=False)
    ax.set_xlabel(f"{unit} spent (cumulative, in trial order)")
    ax.set_ylabel("tokens/s")
    top = a.df["tokens_per_s"].max()
    ax.set_ylim(bottom=-0.03 * (top if not _na(top) else 1))  # a failure's x on the axis stays visible
    _thousands(ax)
    ax.grid(alpha=0.3)
    return _svg(fig)


# --- step time, memory model, one-knob comparisons --------------------------------------------------------------
VIEW_TOP = 20  # configurations in the step-time and memory views: the fastest
STEP_PARTS = ("accumulating micro-batches", "last micro-batch (synchronises the gradients)", "optimizer")
STEP_COLORS = ("#5c6bc0", "#ef6c00", "#2e7d32")
MEMORY_PARTS = ("weights", "gradients", "optimizer", "buffers", "activations", "logits")
MEMORY_COLORS = ("#1565c0", "#42a5f5", "#7e57c2", "#8d6e63", "#ef6c00", "#fbc02d", "#bdbdbd")
WORKSPACE = "workspace allowance"  # memory.predict adds 1 GiB to the analytic sum when it has no calibration


def _fastest(a: Analysis, top: int = VIEW_TOP) -> list[tuple[dict, Record]]:
    """(row, its stored record) of the fastest ok measurements that have a record, fastest first."""
    return [(r, a.records[r["key"]]) for r in a.best.to_dict("records") if r["key"] in a.records][:top]


def step_breakdown(a: Analysis, top: int = VIEW_TOP) -> list[dict]:
    """One projected optimizer step of each fastest measurement in the parts its record holds: (grad_accum - 1)
    accumulating micro-batches, the last (synchronising) one and the optimizer; with the record's step_s and what the
    parts leave of it (runner.derive takes step_s as the median over the timed steps of each step's projection on its
    slowest rank, the parts as medians of their own, so they add up to it only nearly)."""
    out = []
    for row, rec in _fastest(a, top):
        m, accum = rec.m, rec.grad_accum
        if accum is None or any(_na(m.get(k)) for k in ("micro_batch_s", "last_micro_batch_s", "optimizer_s",
                                                          "step_s")):
            continue
        parts = dict(zip(STEP_PARTS, ((accum - 1) * m["micro_batch_s"], m["last_micro_batch_s"], m["optimizer_s"])))
        step = m["step_s"]
        out.append({"row": row, "grad_accum": accum, "micro_batch_s": m["micro_batch_s"], "parts": parts,
                    "step_s": step, "residual_s": step - sum(parts.values())})
    return out


def plot_step_breakdown(rows: list[dict]) -> str:
    """step_breakdown's rows as stacked horizontal bars, each part with a hover title naming the trial."""
    fig = _figure(10, max(2.2, 0.34 * len(rows) + 1.3))
    ax = fig.subplots()
    if not rows:
        _note(ax, "no successful measurement with its phase times: nothing to plot")
        return _svg(fig)
    for y, b in enumerate(rows):
        left = 0.0
        for name, color in zip(STEP_PARTS, STEP_COLORS):
            v = b["parts"][name]
            how = f"{b['grad_accum'] - 1} x {b['micro_batch_s']:.4g} s = " if name == STEP_PARTS[0] else ""
            bar = ax.barh(y, v, left=left, color=color, height=0.62, label=name if y == 0 else "_nolegend_")[0]
            _tip(fig, bar, f"{label(b['row'])}: {name} {how}{v:.4g} s of a {b['step_s']:.4g} s step")
            left += v
        off = b["residual_s"] / b["step_s"]
        _label(ax, left, y, f"{b['step_s']:.3g} s = " + " + ".join(f"{b['parts'][n]:.3g}" for n in STEP_PARTS)
               + (f" ({100 * off:+.2f} %)" if abs(off) > 5e-4 else ""), 7.5)
    ax.set_yticks(range(len(rows)), [label(b["row"]) for b in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, max(sum(b["parts"].values()) for b in rows) * 1.45)
    ax.set_xlabel("seconds of one projected optimizer step (the recipe's global batch)")
    ax.legend(fontsize=8, loc="lower left", bbox_to_anchor=(0, 1.0), frameon=False, ncols=3)
    ax.grid(axis="x", alpha=0.3)
    return _svg(fig)


def memory_rows(a: Analysis, top: int = VIEW_TOP) -> tuple[list[dict], list[str]]:
    """The fastest GPU measurements with a measured peak: the memory model's components (trial.memory.components,
    GiB per rank, on the stored record), its prediction (analytic: the components + 1 GiB; calibrated on the store's
    measured peaks of that GPU where there are 3 or more), the measured peak and the GPU's capacity. Also the labels
    of rows the model could not be evaluated for (a config.json model that is no longer there)."""
    from trainscout.trial import memory

    calibrations, out, skipped = {}, [], []
    for row, rec in _fastest(a, top):
        m, hw = rec.m, rec.hardware or {}
        if rec.device != "cuda" or _na(m.get("peak_memory_gib")):
            continue
        gpu = m.get("gpu") or hw.get("gpu")
        if gpu not in calibrations:
            calibrations[gpu] = memory.fit(memory.calibration_pairs(list(a.records.values()), gpu))
        try:
            comp = {k: v / memory.GiB for k, v in memory.components(rec).items()}
        except (ConfigError, OSError, KeyError, ValueError) as e:
            skipped.append(f"{label(row)} ({_first_line(str(e), 120)})")
            continue
        cal = calibrations[gpu]
        # the model's own terms in its order; any other term an engine adds after them
        parts = {k: comp.get(k, 0.0) for k in MEMORY_PARTS} | {k: v for k, v in comp.items() if k not in MEMORY_PARTS}
        parts[WORKSPACE] = memory.predict(rec) / memory.GiB - sum(parts.values())
        out.append({"row": row, "parts": parts, "predicted_gib": sum(parts.values()),
                    "calibrated_gib": memory.predict(rec, cal) / memory.GiB if cal else None,
                    "calibration_n": cal["n"] if cal else 0, "measured_gib": float(m["peak_memory_gib"]),
                    "capacity_gib": hw.get("gpu_memory_gib"), "gpu": gpu})
    return out, skipped


def memory_empty_reason(a: Analysis) -> str:
    """Why the memory view has nothing to draw."""
    ok = [rec for _, rec in _fastest(a, len(a.best))]
    if not ok:
        return "No successful measurement: no peak memory to compare with the memory model."
    if all(rec.device != "cuda" for rec in ok):
        return ("No measurement here ran on a GPU (all on the CPU): the memory model predicts GPU memory per rank, and "
                "a CPU trial's peak is its process's resident memory (peak_rss_mib), which the model does not "
                "describe. Measure on a GPU to compare.")
    return "No GPU measurement here recorded its peak allocated memory (peak_memory_gib)."


def plot_memory(rows: list[dict]) -> str:
    """memory_rows as a stacked bar of the model's components above a bar of the measured peak, per configuration;
    the calibrated prediction a diamond, the GPU's capacity a dashed line."""
    fig = _figure(10, max(2.4, 0.56 * len(rows) + 1.5))
    ax = fig.subplots()
    names = list(dict.fromkeys(k for r in rows for k in r["parts"]))
    colors = dict(zip([n for n in names if n != WORKSPACE], MEMORY_COLORS)) | {WORKSPACE: MEMORY_COLORS[-1]}
    h = 0.36
    for y, r in enumerate(rows):
        left = 0.0
        for name in names:
            v = r["parts"].get(name, 0.0)
            if v <= 0:
                continue
            bar = ax.barh(y - h / 2, v, left=left, height=h, color=colors.get(name, "#999"), label=name)[0]
            _tip(fig, bar, f"{label(r['row'])}: predicted {name} {v:.2f} GiB of {r['predicted_gib']:.2f} GiB")
            left += v
        bar = ax.barh(y + h / 2, r["measured_gib"], height=h, color="#37474f", label="measured peak (allocated)")[0]
        _tip(fig, bar, f"{label(r['row'])}: measured peak {r['measured_gib']:.2f} GiB per rank (predicted "
             f"{r['predicted_gib']:.2f} analytic" + (f", {r['calibrated_gib']:.2f} calibrated" if r["calibrated_gib"]
                                                     else "") + ")")
        _label(ax, max(left, r["measured_gib"]), y, f"{r['measured_gib']:.1f} measured / {r['predicted_gib']:.1f} "
               "predicted GiB", 7.5)
        if r["calibrated_gib"]:
            _dot(fig, ax, r["calibrated_gib"], y - h / 2, f"{label(r['row'])}: calibrated prediction "
                 f"{r['calibrated_gib']:.2f} GiB (fitted on {r['calibration_n']} measured peaks of {r['gpu']})",
                 marker="D", s=26, color="#c62828", zorder=3, label="calibrated prediction")
    caps = {(r["gpu"], r["capacity_gib"]) for r in rows if not _na(r["capacity_gib"])}
    for i, (gpu, cap) in enumerate(sorted(caps, key=lambda c: c[1])):
        ax.axvline(cap, color="#c62828", ls="--", lw=1.3, label=f"GPU memory: {gpu} {cap:g} GiB" if i < 4 else None)
    ax.set_yticks(range(len(rows)), [label(r["row"]) for r in rows], fontsize=8)
    top = max([max(sum(r["parts"].values()), r["measured_gib"]) for r in rows] + [c for _, c in caps])
    ax.set_xlim(0, top * 1.3)
    ax.set_xlabel("GiB per rank (upper bar: the memory model's components; lower: the measured peak)")
    ax.set_ylim(len(rows) - 0.45, -0.55)
    handles, labels = ax.get_legend_handles_labels()
    seen = dict(zip(labels, handles))  # one legend entry per component, in the bars' order
    order = [n for n in names if n in seen] + [n for n in seen if n not in names]
    ax.legend([seen[n] for n in order], order, fontsize=8, loc="lower left", bbox_to_anchor=(0, 1.0), frameon=False,
              ncols=5)
    ax.grid(axis="x", alpha=0.3)
    return _svg(fig)


def _value_order(knob, v) -> tuple:
    """A knob's values in its own order (its choices), values outside them after, by their text."""
    texts = [fmt(c) for c in knob.choices]
    return (texts.index(fmt(v)), "") if fmt(v) in texts else (len(texts), fmt(v))


def knob_pairs(records: list) -> list[dict]:
    """Controlled comparisons: pairs of ok measurements (Records with tokens_per_s) of the same model, world size,
    device, GPU and recipe whose configurations differ in exactly one knob among the knobs that apply to both (a
    knob missing from a stored config is at its default). A knob that applies to one side only follows from the
    changed one (compile_scope with compile=true): named with that side's value where that is not its default (which
    puts each such value in a group of its own). `a` holds the knob's earlier value (in its choices' order), `b` the
    later; ratio is b's tokens/s over a's, err its spread: the two measurements' step_spread (relative spread of their
    timed steps) combined in quadrature. Sorted by knob, value pair, fastest ratio first."""
    knobs = all_knobs()
    names = [k.name for k in knobs]
    cells = {}
    for rec in records:
        m = rec.m
        if not rec.ok or _na(m.get("tokens_per_s")) or not m["tokens_per_s"]:
            continue
        cfg = {k.name: (rec.config or {}).get(k.name, k.default) for k in knobs}
        on = {k.name for k in knobs if k.applies(cfg)}
        where_ = (rec.model, rec.world_size, rec.device, (rec.hardware or {}).get("gpu") or m.get("gpu"),
                  json.dumps(rec.recipe, sort_keys=True, default=str))
        cells.setdefault(where_, []).append((rec, cfg, on))
    out = []
    for group in cells.values():
        for (ra, ca, oa), (rb, cb, ob) in itertools.combinations(group, 2):
            diff = [k for k in knobs if k.name in oa & ob and fmt(ca[k.name]) != fmt(cb[k.name])]
            if len(diff) != 1:
                continue
            knob = diff[0]
            if _value_order(knob, ca[knob.name]) > _value_order(knob, cb[knob.name]):
                (ra, ca, oa), (rb, cb, ob) = (rb, cb, ob), (ra, ca, oa)
            # a knob the change switches on or off, where it is not at its default: part of what was compared
            side = [" ".join(f"{k.name}={fmt(c[k.name])}" for k in knobs
                             if k.name in o - other and fmt(c[k.name]) != fmt(k.default))
                    for c, o, other in ((ca, oa, ob), (cb, ob, oa))]
            ratio = rb.m["tokens_per_s"] / ra.m["tokens_per_s"]
            spread = math.hypot(*(float(r.m.get("step_spread") or 0.0) for r in (ra, rb)))
            order = (names.index(knob.name), _value_order(knob, ca[knob.name]), _value_order(knob, cb[knob.name]),
                     side, -ratio)
            out.append((order, {"knob": knob.name, "from": fmt(ca[knob.name]) + (f" ({side[0]})" if side[0] else ""),
                                "to": fmt(cb[knob.name]) + (f" ({side[1]})" if side[1] else ""), "a": ra, "b": rb,
                                "ratio": ratio, "err": ratio * spread}))
    return [p for _, p in sorted(out, key=lambda op: op[0])]


def pair_groups(pairs: list[dict]) -> list[dict]:
    """The pairs grouped by knob and value pair, in knob order: n, median ratio, range."""
    groups = {}
    for p in pairs:
        groups.setdefault((p["knob"], p["from"], p["to"]), []).append(p)
    out = []
    for (knob, a, b), ps in groups.items():
        r = sorted(p["ratio"] for p in ps)
        med = r[len(r) // 2] if len(r) % 2 else 0.5 * (r[len(r) // 2 - 1] + r[len(r) // 2])
        out.append({"knob": knob, "from": a, "to": b, "pairs": ps, "n": len(ps), "median": med,
                    "min": r[0], "max": r[-1]})
    return out


def plot_knob_pairs(a: Analysis, groups: list[dict]) -> str:
    """pair_groups as one row per knob and value pair: each pair's ratio a dot with its error bar, the median a bar."""
    fig = _figure(10, max(2.4, 0.42 * len(groups) + 1.4))
    ax = fig.subplots()
    labels = {r["key"]: label(r) for r in a.best.to_dict("records")}
    for y, g in enumerate(groups):
        n = len(g["pairs"])
        for j, p in enumerate(g["pairs"]):
            yj = y + (j - (n - 1) / 2) * min(0.12, 0.7 / max(1, n))
            ax.errorbar([p["ratio"]], [yj], xerr=[[min(p["err"], 0.95 * p["ratio"])], [p["err"]]], fmt="none",
                        ecolor="#90a4ae", elinewidth=1, capsize=2, zorder=1)
            _dot(fig, ax, p["ratio"], yj, f"{g['knob']} {g['from']} → {g['to']}: {labels.get(p['b'].key, p['b'].key)}"
                 f" / {labels.get(p['a'].key, p['a'].key)} = {p['ratio']:.3f} ± {p['err']:.3f} ("
                 f"{num(p['b'].m['tokens_per_s'])} / {num(p['a'].m['tokens_per_s'])} tokens/s)",
                 s=26, color="#1f77b4", alpha=0.8, zorder=2)
        ax.plot([g["median"]] * 2, [y - 0.38, y + 0.38], color="#c62828", lw=2, zorder=1.5,  # under the dots
                label="median" if y == 0 else "_nolegend_")
    ax.axvline(1.0, color="#555", lw=1, ls=":")
    ax.set_yticks(range(len(groups)), [f"{g['knob']}: {g['from']} → {g['to']}  (n={g['n']})" for g in groups],
                  fontsize=8)
    ax.invert_yaxis()
    lo = min(p["ratio"] - p["err"] for g in groups for p in g["pairs"])
    hi = max(p["ratio"] + p["err"] for g in groups for p in g["pairs"])
    if hi / max(lo, 1e-9) > 4:
        ax.set_xscale("log")
    from matplotlib.ticker import FuncFormatter
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
    ax.set_xlabel("tokens/s ratio, to / from (1: no change; error bar: both measurements' step spread)")
    ax.legend(fontsize=8, loc="lower right", bbox_to_anchor=(1.0, 1.0), frameon=False)
    ax.grid(axis="x", alpha=0.3)
    return _svg(fig)


# --- HTML ------------------------------------------------------------------------------------------------------
CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;color:#1a1a1a;margin:0;background:#fafafa}
main{max-width:1180px;margin:0 auto;padding:24px 28px 48px;background:#fff}
h1{font-size:24px;margin:0 0 4px}h2{font-size:18px;margin:32px 0 8px;border-bottom:1px solid #ddd;padding-bottom:4px}
.meta{color:#555;margin:0 0 16px}.note{color:#555;font-size:13px;margin:6px 0}
.cards{display:flex;gap:12px;flex-wrap:wrap;margin:16px 0}
.card{flex:1 1 180px;border:1px solid #e0e0e0;border-radius:6px;padding:10px 14px;background:#f7f9fc}
.card b{display:block;font-size:20px}.card.small b{font-size:15px}.card span{color:#555;font-size:12px}
table{border-collapse:collapse;width:100%;font-size:13px;margin:6px 0}
th,td{border-bottom:1px solid #e6e6e6;padding:5px 8px;text-align:left;vertical-align:top}
th{background:#f1f3f5;font-weight:600}td.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
tr:nth-child(even) td{background:#fbfbfb}code,.cfg{font:12px ui-monospace,"DejaVu Sans Mono",monospace;word-break:break-word}
.plot{margin:10px 0 4px}.plot svg{width:100%;height:auto;max-width:900px;display:block}
.grid2{display:grid;grid-template-columns:1fr 1fr;gap:16px}.grid2 .plot svg{max-width:100%}
.tag{display:inline-block;padding:0 6px;border-radius:3px;color:#fff;font-size:12px}
"""


def _e(v) -> str:
    return html.escape("" if v is None else str(v))


def _table(headers: list[str], rows: list[list[str]], numeric: set[int] = frozenset()) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td class=\"n\">{c}</td>" if i in numeric else f"<td>{c}</td>"
                                    for i, c in enumerate(r)) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _tag(status: str) -> str:
    return f'<span class="tag" style="background:{STATUS_COLOR.get(status, "#999")}">{_e(status)}</span>'


def render_html(a: Analysis) -> str:
    """The whole report as one self-contained HTML document (a string)."""
    df, b = a.df, a.best
    counts = df["status"].value_counts()
    out = [f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>trainscout report</title>"
           f"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"><style>{CSS}</style></head><body><main>",
           "<h1>trainscout report</h1>",
           f"<p class=\"meta\">{_e(a.source)} · "
           + (f"{df['search'].nunique()} search(es), {len(df)} trials · " if a.searched else
              f"{len(df)} measurements (no search rows: one row per measurement) · ")
           + f"models {_e(', '.join(sorted(map(str, df['model'].dropna().unique()))) or 'n/a')} · generated {_e(a.generated)}</p>"]
    cards = [("trials" if a.searched else "measurements", " · ".join(f"{int(n)} {s}" for s, n in counts.items()))]
    if df["gpu_s"].notna().any():
        cards.insert(0, (f"{_unit(a)} spent", f"{df['gpu_s'].sum() / 3600:,.3g}"))
    if len(b):
        r = b.iloc[0]
        cards = [("fastest: tokens/s", num(r["tokens_per_s"])), ("its projected run", f"{days(r['projected_days'])} days"),
                 ("renting it", usd(r["rent_usd"])), ("buying the box", usd(r["box_usd"])), *cards]
    out.append("<div class=\"cards\">" + "".join(
        f"<div class=\"card{' small' if k in ('trials', 'measurements') else ''}\"><b>{_e(v)}</b><span>{_e(k)}</span></div>"
        for k, v in cards) + "</div>")

    out.append("<h2 id=\"progress\">Should I keep going? Best tokens/s so far vs " + _unit(a) + " spent</h2>"
               "<p class=\"note\">Trials in the order they ran; the line is the fastest successful trial so far, a "
               "dot each trial (hover for its number, id and key: its row in <a href=\"#trials\">All trials</a>). "
               "Time spent counts every trial that ran: wall time × ranks from its record; a trial ASHA stopped "
               "early ran too and leaves no record, so its time is estimated; a trial served from the store or "
               "refused before running counts 0. A long flat line: more trials of this space are unlikely to "
               "help.</p>")
    out.append(f"<div class=\"plot\">{plot_progress(a)}</div>")
    notes = [progress_text(p, _unit(a)) for p in progress(a)]
    if spent := spent_text(a):
        notes.append(spent[0].upper() + spent[1:] + ".")
    out.append("".join(f"<p class=\"note\">{_e(n)}</p>" for n in notes))

    out.append("<h2>Best configurations</h2>")
    if len(b):
        tied = _tied_keys(a)
        rows = [[str(i + 1) + (" (tie)" if r["key"] in tied else ""), num(r["tokens_per_s"]), num(r["mfu"], ".3f"),
                 _e(r["quality"]), num(r["peak_memory_gib"], ".2f"),
                 days(r["projected_days"]), usd(r["rent_usd"]), usd(r["box_usd"]),
                 _e(f"{r['model']} on {where(r)}{contributed(r)}"),
                 f"<span class=\"cfg\">{_e(config_text(r, a.varied))}</span>", f"<code>{_e(str(r['key'])[:12])}</code>"]
                for i, r in b.head(TOP).iterrows()]
        out.append(_table(["#", "tokens/s", "MFU", "quality", "GiB/rank", "days", "rent", "box", "model / hardware",
                           "configuration (set or varied knobs)", "key"], rows, numeric={0, 1, 2, 4, 5, 6, 7}))
        if tied:
            out.append(f"<p class=\"note\"><b>{_e(tie_text(a))}</b></p>")
        out.append("<p class=\"note\">days: the recipe's full run projected from the measured optimizer step. rent: "
                   "days × 24 × $/GPU-hour × GPUs. box: buying the GPUs and the machines that hold them. MFU: "
                   "matrix-product FLOPs counted from the model's modules (embedding lookups not counted, a mixture "
                   "of experts' routed experts only) against the GPU's bf16 dense peak (n/a on a CPU). quality: "
                   "same (no knob changes the numerics), passed / failed (one step against its reference: gradient "
                   "SQNR >= 20 dB), verified / failed (<code>trainscout verify DIR --quality STEPS</code>: trained "
                   "against its reference on real text), unverified (no verdict). Export one with "
                   "<code>trainscout export DIR --trial KEY --format all --out DIR</code>.</p>")
    else:
        out.append("<p>No trial ran to the end: nothing to rank (see what failed below).</p>")

    out.append("<h2>Projected days vs peak memory</h2>"
               "<p class=\"note\">Each successful measurement; ringed: the Pareto front (no other configuration "
               "is both faster and lighter), numbered by rank.</p>")
    out.append(f"<div class=\"plot\">{plot_pareto(a)}</div>")

    out.extend(step_section(a))
    out.extend(memory_section(a))

    out.append("<h2>Hardware and cost</h2>")
    if len(a.hardware):
        rows = [[_e(h["model"]), _e(f"{h['hardware']} x{h['world_size']}"), f"{h['ok']}/{h['trials']}",
                 num(h["tokens_per_s"]), num(h["mfu"], ".3f"), days(h["projected_days"]), usd(h["rent_usd"]),
                 usd(h["box_usd"]), _e("no price" if _na(h["price"]) else h["price"])] for _, h in a.hardware.iterrows()]
        out.append(_table(["model", "hardware", "ok/trials", "best tokens/s", "MFU", "days", "rent", "box",
                           "price entry"], rows, numeric={2, 3, 4, 5, 6, 7}))
    if b["rent_usd"].notna().any():
        out.append("<p class=\"note\">Cost of renting each successful configuration's projected run, cheapest "
                   "first.</p>")
        out.append(f"<div class=\"plot\">{plot_cost(a)}</div>")
    else:
        out.append("<p>No rental price for the hardware measured here (the built-in table prices GPUs): add one "
                   "with <code>--prices FILE.json</code>.</p>")

    out.append("<h2>Which knobs mattered</h2>")
    few = [(imp["search"], measured(a.df[a.df["search"] == imp["search"]])) for imp in a.importance]
    few = [(sname, n) for sname, n in few if n < FEW_TRIALS]
    if few:
        out.append("<p class=\"note\" id=\"importance-caveat\"><b>Caveat: few trials.</b> "
                   + "; ".join(f"{_e(search_name(sname))}: "
                               f"{n} trial(s) measured tokens/s" for sname, n in few)
                   + f" (fewer than {FEW_TRIALS}). The fastest trials PED-ANOVA compares are then only a few, so one "
                     "noisy measurement can move a knob's score: read these as hints, not a ranking, and check "
                     "the tokens/s per knob value below.</p>")
    if a.importance:
        out.append("<p class=\"note\">Optuna's PED-ANOVA importance evaluator on each search's trials, rebuilt as an "
                   "in-memory study with the objective the search maximised (tokens/s; 0 for an infeasible or "
                   "failed trial): how much a knob's values among the fastest trials differ from all trials.</p>")
        plots = [f"<div class=\"plot\">{plot_importance(imp)}</div>" for imp in a.importance[:4]]
        out.append("<div class=\"grid2\">" + "".join(plots) + "</div>" if len(plots) > 1 else plots[0])
    else:
        out.append("<p>Too few trials: importance needs a search with at least 3 trials and a knob that took two "
                   "values.</p>")
    out.append("<h3>Tokens/s per knob value</h3><p class=\"note\">Successful measurements (one per key), coloured by "
               "hardware; red: the median (when one hardware was measured).</p>")
    out.append(f"<div class=\"plot\">{plot_knob_values(a)}</div>")

    out.extend(pairs_section(a))

    out.append("<h2>What failed and why</h2>")
    if a.failures:
        rows = [[_tag(f["status"]), str(f["count"]), _e(f["what"]), f"<code>{_e(f['error'] or '—')}</code>",
                 f"<span class=\"cfg\">{_e(f['config'])}</span>"] for f in a.failures]
        out.append(_table(["status", "trials", "meaning", "example error", "example configuration"], rows,
                          numeric={1}))
    else:
        out.append("<p>Every trial finished.</p>")

    out.append("<h2 id=\"trials\">All trials</h2><p class=\"note\">"
               + ("Every trial in the order the search recorded it" if a.searched else
                  "Every measurement in the order it started (the store holds no search rows)")
               + ": micro-batch and accumulation as the trial ran them (the resolved plan, not <code>max</code>), "
                 "status and reason, device-seconds (wall time × ranks; ≈ est.: a trial ASHA stopped, the median "
                 "of its search's trials that ran to the end; 0: served from the store or refused before running), and the "
                 "command that exports the measurement.</p>")
    out.append(trial_table(a))

    out.append("<h2>Trial timeline</h2>")
    out.append(f"<div class=\"plot\">{plot_timeline(a)}</div>")

    out.append("<h2>Prices used</h2><p class=\"note\">List-price estimates, not quotes"
               + (f"; overridden by <code>{_e(a.prices_path)}</code>" if a.prices_path else "")
               + ". Override them with <code>trainscout report DIR --prices FILE.json</code>.</p>")
    used = set(df["price"].dropna())
    rows = [[_e(p.name) + (" (used)" if p.name in used else ""), f"<code>{_e(p.match)}</code>", usd(p.gpu_usd),
             f"{usd(p.machine_usd)} / {p.gpus_per_machine}", usd(p.rent_usd_per_gpu_hour), _e(p.source)]
            for p in a.prices]
    out.append(_table(["entry", "matches", "GPU", "machine / GPUs", "$/GPU-hour", "source"], rows, numeric={2, 3, 4}))
    out.append("</main></body></html>")
    return "\n".join(out)


def step_section(a: Analysis) -> list[str]:
    """Where a step's time goes: the projected optimizer step of the fastest measurements in its parts."""
    rows = step_breakdown(a)
    out = ["<h2 id=\"step-breakdown\">Where a step's time goes</h2>",
           "<p class=\"note\">One projected optimizer step (the recipe's global batch) of each of the fastest "
           f"successful measurements (at most {VIEW_TOP}), in the parts its record holds: (accumulation − 1) × the median "
           "accumulating micro-batch, the last micro-batch (which carries the gradient synchronisation) and the "
           "optimizer step. Hover a segment for its trial and time.</p>",
           f"<div class=\"plot\">{plot_step_breakdown(rows)}</div>"]
    if rows:
        worst = max(rows, key=lambda b: abs(b["residual_s"]) / b["step_s"])
        out.append(f"<p class=\"note\">The parts add up to the record's projected step within "
                   f"{100 * abs(worst['residual_s']) / worst['step_s']:.2f} % on these {len(rows)} rows (largest: "
                   f"{_e(label(worst['row']))}, {1000 * worst['residual_s']:+.1f} ms of {worst['step_s']:.3g} s; "
                   "shown beside a bar when above 0.05 %): the step is the median over the timed steps of each "
                   "step's projection on its slowest rank, the parts are medians of their own.</p>")
    return out


def memory_section(a: Analysis) -> list[str]:
    """Measured peak memory beside the memory model's components and the GPU's capacity."""
    rows, skipped = memory_rows(a)
    out = ["<h2 id=\"memory-model\">Peak memory: measured vs the memory model</h2>"]
    if not rows:
        out.append(f"<p>{_e(memory_empty_reason(a))}</p>")
        return out
    cal = [r for r in rows if r["calibrated_gib"]]
    out.append(f"<p class=\"note\">The fastest GPU measurements (at most {VIEW_TOP}): the upper bar is the memory model's "
               "prediction per rank by component (<code>trial.memory.components</code> on the stored record, plus "
               "the 1 GiB workspace allowance of its uncalibrated prediction), the lower bar the measured peak "
               "(torch.cuda.max_memory_allocated, the fullest rank); the dashed line is the GPU's memory."
               + (" Red diamonds: the prediction calibrated on this store's measured peaks of that GPU (what a "
                  "search prunes with; the row's own peak is among them)." if cal else "") + "</p>")
    out.append(f"<div class=\"plot\">{plot_memory(rows)}</div>")
    errs = sorted(r["predicted_gib"] / r["measured_gib"] - 1 for r in rows if r["measured_gib"] > 0)
    if errs:
        text = (f"Analytic prediction against the measured peak: median {100 * errs[len(errs) // 2]:+.1f} %, from "
                f"{100 * errs[0]:+.1f} % to {100 * errs[-1]:+.1f} %")
        cerrs = sorted(r["calibrated_gib"] / r["measured_gib"] - 1 for r in cal if r["measured_gib"] > 0)
        if cerrs:
            text += f"; calibrated: median {100 * cerrs[len(cerrs) // 2]:+.1f} %"
        out.append(f"<p class=\"note\">{_e(text)}.</p>")
    if skipped:
        out.append("<p class=\"note\">Not drawn, the memory model could not be evaluated for: "
                   + _e("; ".join(skipped)) + "</p>")
    return out


def pairs_section(a: Analysis) -> list[str]:
    """Controlled comparisons: tokens/s ratios of measurement pairs that differ in one knob."""
    groups = pair_groups(knob_pairs([a.records[k] for k in a.best["key"] if k in a.records]))
    out = ["<h3 id=\"knob-pairs\">One knob changed: controlled comparisons</h3>"]
    if not groups:
        out.append("<p>No two successful measurements here differ in exactly one knob (same model, world size, "
                   "device, GPU and recipe): no controlled comparison to show.</p>")
        return out
    out.append("<p class=\"note\">Each dot: two successful measurements of the same model, world size, device, GPU "
               "and recipe whose configurations differ in one knob (of the knobs that apply to both; a knob that "
               "the change switches on or off is named in brackets where it is not at its default), as the ratio "
               "of their tokens/s (to / from). Error bars: the relative spread of each measurement's timed steps (step_spread), combined in quadrature; "
               "red: the median of a value pair. Hover a dot for the two trials.</p>")
    out.append(f"<div class=\"plot\">{plot_knob_pairs(a, groups)}</div>")
    rows = [[_e(g["knob"]), _e(f"{g['from']} → {g['to']}"), str(g["n"]), f"{g['median']:.3f}",
             f"{g['min']:.3f} – {g['max']:.3f}"] for g in groups]
    out.append(_table(["knob", "from → to", "pairs", "median ratio (to / from)", "range"], rows, numeric={2, 3, 4}))
    return out


def measured(df: pd.DataFrame) -> int:
    """Trials that measured tokens/s: ok (served from the store included) or stopped by ASHA after some steps."""
    return int((df["status"].isin([Status.OK, Status.STOPPED]) & df["tokens_per_s"].notna()).sum())


def reason(row) -> str:
    """A trial row's reason: the first line of its error, else "served from the store" for a cached ok trial,
    else its status's meaning (empty for ok)."""
    if isinstance(row.get("error"), str) and row["error"].strip():
        return _first_line(row["error"], 200)
    if row["status"] == Status.OK:
        return "served from the store" if row.get("cached") else ""
    return STATUS_TEXT.get(row["status"], "")


def export_command(a: Analysis, row) -> str | None:
    """The command that exports this row's measurement (an ok one; export refuses the rest)."""
    key = row.get("key")
    if row["status"] != Status.OK or not isinstance(key, str) or key not in a.records:
        return None
    where_ = a.source if "://" in a.source else os.path.relpath(a.source) if not os.path.isabs(a.source) else a.source
    return f"trainscout export {shlex.quote(where_)} --trial {key[:12]} --format all --out export-{key[:12]}"


def trial_table(a: Analysis) -> str:
    """The "All trials" HTML table: one row per trial with its status, reason, tokens/s, plan, device-seconds,
    configuration, key and export command."""
    many = a.df["search"].nunique() > 1
    head = ["#", *(["search"] if many else []), "trial", "status", "reason", "tokens/s", "micro-batch", "accum",
            _unit(a).replace("hours", "s"), "configuration (set or varied knobs)", "key", "export"]
    body = []
    for r in a.df.to_dict("records"):
        cmd = export_command(a, r)
        cells = [str(r["n"]), *([_e(r["search"])] if many else []), f"<code>{_e(r['trial'])}</code>", _tag(r["status"]),
                 _e(reason(r)), num(r["tokens_per_s"]), num(r["micro_batch"], "d"), num(r["grad_accum"], "d"),
                 _e(gpu_s_text(r)), f"<span class=\"cfg\">{_e(config_text(r, a.varied))}</span>",
                 f"<code>{_e(str(r['key'])[:12]) if isinstance(r['key'], str) else '—'}</code>",
                 f"<code>{_e(cmd)}</code>" if cmd else "—"]
        body.append(f"<tr id=\"trial-{r['row']}\">" + "".join(
            f"<td class=\"n\">{c}</td>" if h in ("#", "tokens/s", "micro-batch", "accum") or h.endswith("-s")
            else f"<td>{c}</td>" for h, c in zip(head, cells)) + "</tr>")
    return ("<table><thead><tr>" + "".join(f"<th>{_e(h)}</th>" for h in head) + "</tr></thead><tbody>"
            + "".join(body) + "</tbody></table>")


def write_html(a: Analysis, out_dir: str) -> str:
    """Write report.html into out_dir (created if missing); returns its path."""
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "report.html")
    with open(path, "w", encoding="utf-8") as f:
        f.write(render_html(a))
    return path


def report(source, out_dir: str, prices_path: str | None = None) -> str:
    """Write out_dir/report.html for a store (a search's --out folder or a storage URL); returns its path."""
    return write_html(analyse(source, prices_path), out_dir)
