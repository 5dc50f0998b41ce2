"""The report's figures, each returned as inline SVG: progress, Pareto front, cost, knob importance, tokens/s per
knob value, timeline, step time, memory model and one-knob comparisons."""
from __future__ import annotations

import math
from datetime import datetime, timedelta, timezone

from trainscout.spaces import fmt, get
from trainscout.trial.records import TOKENS_PER_S
from trainscout.trial.status import Status

from .analysis import Analysis, pareto_front, progress
from .breakdown import STEP_PARTS, WORKSPACE
from .formatting import STATUS_COLOR, days, is_missing, label, native_value, num, search_name, usd, where
from .svg import bar_label, dot, figure, note, thousands_axis, tip, to_svg
from .text import hours_unit

COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22"]
STEP_COLORS = ("#5c6bc0", "#ef6c00", "#2e7d32")
MEMORY_COLORS = ("#1565c0", "#42a5f5", "#7e57c2", "#8d6e63", "#ef6c00", "#fbc02d", "#bdbdbd")


def _group(row) -> str:
    return f"{row.get('model')} on {where(row)}"


def _colors(a: Analysis) -> dict:
    """One colour per model x hardware x world size, the same in every plot."""
    groups = dict.fromkeys(_group(r) for r in a.best.to_dict("records"))
    return {g: COLORS[i % len(COLORS)] for i, g in enumerate(groups)}


def plot_pareto(a: Analysis) -> str:
    """Projected days against peak memory per rank of each successful measurement, each model's Pareto front
    ringed (inline SVG)."""
    fig = figure(10, 4.6)
    ax = fig.subplots()
    b = a.best[a.best["projected_days"].notna() & a.best["peak_memory_gib"].notna()]
    if b.empty:
        note(ax, "no successful measurement: nothing to plot")
        return to_svg(fig)
    colors = _colors(a)
    groups = [_group(r) for r in b.to_dict("records")]
    for g, color in colors.items():
        sel = b[[x == g for x in groups]]
        for j, (i, r) in enumerate(sel.iterrows()):
            dot(fig, ax, r["peak_memory_gib"], r["projected_days"],
                 f"{label(r)}: {num(r[TOKENS_PER_S])} tokens/s, {days(r['projected_days'])} days (rank {i + 1})",
                 s=40, color=color, alpha=0.75, label=g if j == 0 else "_nolegend_", zorder=2)
    for model, g in b.groupby("model"):
        front = pareto_front(list(zip(g["peak_memory_gib"], g["projected_days"], g.index)))
        f = g.loc[front]
        ax.plot(f["peak_memory_gib"], f["projected_days"], "--", color="#c62828", lw=1.2, zorder=1,
                drawstyle="steps-post", alpha=0.8)
        ax.scatter(f["peak_memory_gib"], f["projected_days"], s=130, facecolors="none", edgecolors="#c62828",
                   linewidths=1.8, zorder=3, label=f"Pareto front ({model})")
        for i, r in f.iterrows():
            ax.annotate(f"rank {i + 1}", (r["peak_memory_gib"], r["projected_days"]), textcoords="offset points",
                        xytext=(7, 5), fontsize=9, color="#c62828")
    if b["projected_days"].max() / max(b["projected_days"].min(), 1e-12) > 30:
        ax.set_yscale("log")
    ax.set_xlabel("peak memory per rank (GiB)")
    ax.set_ylabel("projected days of the full run")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    return to_svg(fig)


def plot_cost(a: Analysis, top: int = 20) -> str:
    """Rent of the projected run (US$) of the `top` cheapest priced measurements, as bars (inline SVG)."""
    b = a.best[a.best["rent_usd"].notna()].sort_values("rent_usd").head(top)
    fig = figure(8, max(2.2, 0.38 * len(b) + 1.2))
    ax = fig.subplots()
    if b.empty:
        note(ax, "no rental price for the hardware measured here: add one with --prices FILE.json")
        return to_svg(fig)
    labels = [f"rank {i + 1} {where(r)} [{str(r['key'])[:8]}]" for i, r in b.iterrows()]
    y = range(len(b))
    ax.barh(list(y), b["rent_usd"], color="#00897b")
    for yi, (_, r) in zip(y, b.iterrows()):
        bar_label(ax, r["rent_usd"], yi, f"{usd(r['rent_usd'])} · {days(r['projected_days'])} days", 8)
    ax.set_yticks(list(y), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("renting the projected run (US$, list-price estimate)")
    ax.set_xlim(0, b["rent_usd"].max() * 1.35)
    ax.grid(axis="x", alpha=0.3)
    return to_svg(fig)


def plot_importance(imp: dict) -> str:
    """One search's knob importances as bars (inline SVG)."""
    vals = imp["values"]
    fig = figure(7, max(1.8, 0.45 * len(vals) + 1))
    ax = fig.subplots()
    names = list(vals)
    ax.barh(names, [vals[n] for n in names], color="#5c6bc0")
    for i, n in enumerate(names):
        bar_label(ax, vals[n], i, f"{vals[n]:.2f}", 9)
    ax.invert_yaxis()
    ax.set_xlim(0, max(1e-9, max(vals.values())) * 1.2)
    ax.set_xlabel("importance (normalised, sums to 1)")
    ax.set_title(f"{search_name(imp['search'])}: {imp['trials']} trials, {imp['evaluator']}", fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    return to_svg(fig)


def plot_knob_values(a: Analysis) -> str:
    """Tokens/s of each successful measurement per value of each varied knob, a panel per knob (inline SVG)."""
    ok = a.df[(a.df["status"] == Status.OK) & a.df[TOKENS_PER_S].notna()].drop_duplicates("key")
    knobs = [k for k in a.varied if ok[k].dropna().map(fmt).nunique() > 1] or a.varied
    cols = min(3, max(1, len(knobs)))
    rows = max(1, math.ceil(len(knobs) / cols))
    fig = figure(3.6 * cols, 2.9 * rows)
    axes = fig.subplots(rows, cols, squeeze=False)
    for ax in axes.flat[len(knobs):]:
        ax.set_axis_off()
    if not knobs or ok.empty:
        note(axes.flat[0], "no knob took two values among successful trials")
        return to_svg(fig)
    colors = _colors(a)
    rows = ok.to_dict("records")
    groups = [_group(r) for r in rows]
    if len(colors) > 1:
        fig.legend(handles=[axes.flat[0].scatter([], [], color=c, label=g) for g, c in colors.items()],
                   loc="outside upper center", ncols=min(3, len(colors)), fontsize=8, frameon=False)
    for ax, name in zip(axes.flat, knobs):
        knob = get(name)
        vals = [native_value(knob, v) for v in ok[name]]
        order = [fmt(c) for c in knob.choices if fmt(c) in {fmt(v) for v in vals if v is not None}]
        order += sorted({fmt(v) for v in vals if v is not None} - set(order))
        for xi, value in enumerate(order):
            pts = [(t, colors.get(g, "#1f77b4"), r) for v, t, g, r in zip(vals, ok[TOKENS_PER_S], groups, rows)
                   if v is not None and fmt(v) == value]
            ys = [t for t, *_ in pts]
            xs = [xi + (j - (len(ys) - 1) / 2) * min(0.08, 0.6 / max(1, len(ys))) for j in range(len(ys))]
            for x, (t, c, r) in zip(xs, pts):
                dot(fig, ax, x, t, f"{label(r)}: {num(t)} tokens/s, {name}={value}", s=28, color=c, alpha=0.8,
                     zorder=2)
            if len(colors) <= 1:  # a median across different hardware would mean nothing
                med = sorted(ys)[len(ys) // 2]
                ax.plot([xi - 0.3, xi + 0.3], [med, med], color="#c62828", lw=2, zorder=3)
        ax.set_xticks(range(len(order)), order, fontsize=8, rotation=20 if len(order) > 3 else 0)
        ax.set_xlim(-0.6, len(order) - 0.4)
        ax.set_title(name, fontsize=10)
        ax.set_ylabel("tokens/s", fontsize=8)
        thousands_axis(ax)
        ax.tick_params(axis="y", labelsize=8)
        ax.grid(axis="y", alpha=0.3)
    return to_svg(fig)


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
    marks = [(_when(r["created_at"]), r["status"], bool(r["cached"]))
             for i, r in zip(a.df.index, a.df.to_dict("records"))
             if (r["cached"] or not r["key"] or r["key"] not in a.records) and i not in stopped]
    marks = [m for m in marks if m[0]]
    fig = figure(8, max(2.2, 0.32 * (len(bars) + bool(marks)) + 1.2))
    ax = fig.subplots()
    if not bars and not marks:
        note(ax, "no start times recorded")
        return to_svg(fig)
    bars.sort()
    t0 = min([b[0] for b in bars] + [m[0] for m in marks])
    span = max([(b[0] - t0).total_seconds() + b[1] for b in bars] + [(m[0] - t0).total_seconds() for m in marks] + [1])
    unit, scale = ("min", 60.0) if span > 600 else ("s", 1.0)
    for yi, (start, wall, status, name) in enumerate(bars):
        x = (start - t0).total_seconds() / scale
        est = name.endswith("est.")
        ax.barh(yi, wall / scale, left=x, color=STATUS_COLOR.get(status, "#999"), height=0.6,
                hatch="//" if est else None, alpha=0.55 if est else 1.0)
        bar_label(ax, x + wall / scale, yi, f"{status} (time estimated)" if est else status, 7)
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
    return to_svg(fig)


def plot_progress(a: Analysis) -> str:
    """Should I keep going: the best tokens/s so far against the device-hours spent, in trial order; each trial a
    dot at the hours spent once it ended (ok filled, stopped hollow, a failure an x on the axis)."""
    fig = figure(10, 4.2)
    ax = fig.subplots()
    if not a.df["gpu_s"].notna().any():
        note(ax, "no trial recorded its time: nothing to plot")
        return to_svg(fig)
    unit = hours_unit(a)
    for si, p in enumerate(progress(a)):
        color = COLORS[si % len(COLORS)]
        name = p["search"] if len(a.df["search"].unique()) > 1 else "best so far"
        ax.step(p["hours"], p["best"], where="post", color=color, lw=1.8, label=name, zorder=1)
        for h, (_, r) in zip(p["hours"], p["rows"].iterrows()):
            tps, status = r[TOKENS_PER_S], r["status"]
            ran = status in (Status.OK, Status.STOPPED) and not is_missing(tps)
            kw = ({"s": 34, "color": color} if status == Status.OK else
                  {"s": 34, "facecolors": "none", "edgecolors": color} if ran else
                  {"s": 30, "marker": "x", "color": STATUS_COLOR.get(status, "#999")})
            dot(fig, ax, h, tps if ran else 0.0, f"{label(r)} {status}: {num(tps) + ' tokens/s' if ran else ''} "
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
    top = a.df[TOKENS_PER_S].max()
    ax.set_ylim(bottom=-0.03 * (top if not is_missing(top) else 1))  # a failure's x on the axis stays visible
    thousands_axis(ax)
    ax.grid(alpha=0.3)
    return to_svg(fig)


def plot_step_breakdown(rows: list[dict]) -> str:
    """step_breakdown's rows as stacked horizontal bars, each part with a hover title naming the trial."""
    fig = figure(10, max(2.2, 0.34 * len(rows) + 1.3))
    ax = fig.subplots()
    if not rows:
        note(ax, "no successful measurement with its phase times: nothing to plot")
        return to_svg(fig)
    for y, b in enumerate(rows):
        left = 0.0
        for name, color in zip(STEP_PARTS, STEP_COLORS):
            v = b["parts"][name]
            how = f"{b['grad_accum'] - 1} x {b['micro_batch_s']:.4g} s = " if name == STEP_PARTS[0] else ""
            bar = ax.barh(y, v, left=left, color=color, height=0.62, label=name if y == 0 else "_nolegend_")[0]
            tip(fig, bar, f"{label(b['row'])}: {name} {how}{v:.4g} s of a {b['step_s']:.4g} s step")
            left += v
        off = b["residual_s"] / b["step_s"]
        bar_label(ax, left, y, f"{b['step_s']:.3g} s = " + " + ".join(f"{b['parts'][n]:.3g}" for n in STEP_PARTS)
               + (f" ({100 * off:+.2f} %)" if abs(off) > 5e-4 else ""), 7.5)
    ax.set_yticks(range(len(rows)), [label(b["row"]) for b in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, max(sum(b["parts"].values()) for b in rows) * 1.45)
    ax.set_xlabel("seconds of one projected optimizer step (the recipe's global batch)")
    ax.legend(fontsize=8, loc="lower left", bbox_to_anchor=(0, 1.0), frameon=False, ncols=3)
    ax.grid(axis="x", alpha=0.3)
    return to_svg(fig)


def plot_memory(rows: list[dict]) -> str:
    """memory_rows as a stacked bar of the model's components above a bar of the measured peak, per configuration;
    the calibrated prediction a diamond, the GPU's capacity a dashed line."""
    fig = figure(10, max(2.4, 0.56 * len(rows) + 1.5))
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
            tip(fig, bar, f"{label(r['row'])}: predicted {name} {v:.2f} GiB of {r['predicted_gib']:.2f} GiB")
            left += v
        bar = ax.barh(y + h / 2, r["measured_gib"], height=h, color="#37474f", label="measured peak (allocated)")[0]
        tip(fig, bar, f"{label(r['row'])}: measured peak {r['measured_gib']:.2f} GiB per rank (predicted "
             f"{r['predicted_gib']:.2f} analytic" + (f", {r['calibrated_gib']:.2f} calibrated" if r["calibrated_gib"]
                                                     else "") + ")")
        bar_label(ax, max(left, r["measured_gib"]), y, f"{r['measured_gib']:.1f} measured / {r['predicted_gib']:.1f} "
               "predicted GiB", 7.5)
        if r["calibrated_gib"]:
            dot(fig, ax, r["calibrated_gib"], y - h / 2, f"{label(r['row'])}: calibrated prediction "
                 f"{r['calibrated_gib']:.2f} GiB (fitted on {r['calibration_n']} measured peaks of {r['gpu']})",
                 marker="D", s=26, color="#c62828", zorder=3, label="calibrated prediction")
    caps = {(r["gpu"], r["capacity_gib"]) for r in rows if not is_missing(r["capacity_gib"])}
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
    return to_svg(fig)


def plot_knob_pairs(a: Analysis, groups: list[dict]) -> str:
    """pair_groups as one row per knob and value pair: each pair's ratio a dot with its error bar, the median a bar."""
    fig = figure(10, max(2.4, 0.42 * len(groups) + 1.4))
    ax = fig.subplots()
    labels = {r["key"]: label(r) for r in a.best.to_dict("records")}
    for y, g in enumerate(groups):
        n = len(g["pairs"])
        for j, p in enumerate(g["pairs"]):
            yj = y + (j - (n - 1) / 2) * min(0.12, 0.7 / max(1, n))
            ax.errorbar([p["ratio"]], [yj], xerr=[[min(p["err"], 0.95 * p["ratio"])], [p["err"]]], fmt="none",
                        ecolor="#90a4ae", elinewidth=1, capsize=2, zorder=1)
            dot(fig, ax, p["ratio"], yj, f"{g['knob']} {g['from']} → {g['to']}: {labels.get(p['b'].key, p['b'].key)}"
                 f" / {labels.get(p['a'].key, p['a'].key)} = {p['ratio']:.3f} ± {p['err']:.3f} ("
                 f"{num(p['b'].measured.tokens_per_s)} / {num(p['a'].measured.tokens_per_s)} tokens/s)",
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
    return to_svg(fig)
