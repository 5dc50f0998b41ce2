"""The report in words: the terminal summary, and the sentences the page shares with it."""
from __future__ import annotations

from trainscout.trial.records import TOKENS_PER_S

from .analysis import Analysis, tied_keys
from .formatting import NO_SEARCH, config_text, contributed, days, is_missing, label, num, search_name, usd, where

def hours_unit(a: Analysis) -> str:
    """The unit of device time spent: GPU-hours where a trial ran on a GPU, else worker-hours."""
    return "GPU-hours" if (a.df["device"].dropna() != "cpu").any() else "worker-hours"


def tie_text(a: Analysis) -> str:
    """One sentence on the tie at the top (analysis.ties): which is the best, and why."""
    c = a.tie
    if c.is_tie:
        return c.line()[0].upper() + c.line()[1:] + "."
    return (f"The fastest, {c.fastest.key[:12]}, is also the simplest of the {len(c.tied)} configurations within the "
            f"measured noise ({c.noise:.1%}) of it, marked (tie): it is the best (rule: README, ties).")


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


def summary(a: Analysis, top: int = 5) -> str:
    """The terminal summary: counts, device time spent, the `top` fastest configurations, hardware side by side,
    what failed and which knobs mattered."""
    df = a.df
    counts = df["status"].value_counts()
    cached = int(df["cached"].sum())
    parts = (", ".join(f"{int(n)} {s}" for s, n in counts.items())
             + (f"; {cached} served from the store" if cached else ""))
    searches = df["search"].nunique()
    if a.searched:
        lines = [f"report of {a.source}: {searches} search{'es' if searches != 1 else ''}, {len(df)} trials ({parts})"]
    else:
        lines = [f"report of {a.source}: {len(df)} measurements, no search ({parts})"]
    spent = spent_text(a)
    if spent:
        lines.append(spent)
    for search, v in a.verdicts:  # keep searching? (analysis/verdict.py: the rule and its evidence)
        lines.append((f"{search_name(search or NO_SEARCH)}: " if len(a.verdicts) > 1 else "") + v.line())
    if len(a.best):
        lines.append("best configurations (fastest first; rent = projected days x $/GPU-hour x GPUs, box = buying "
                     "the GPUs and machines):")
        tied = tied_keys(a)
        for i, r in a.best.head(top).iterrows():
            lines.append(f"  rank {i + 1}{' (tie)' if r['key'] in tied else ''} {num(r[TOKENS_PER_S])} tokens/s  "
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
                         f"{num(h[TOKENS_PER_S])} tokens/s, {days(h['projected_days'])} days, rent "
                         f"{usd(h['rent_usd'])}, box {usd(h['box_usd'])}")
    unpriced = sorted({str(h) for h, p in zip(a.df["hardware"], a.df["price"])
                       if not is_missing(h) and is_missing(p)})
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
        lines.append(f"knobs that mattered in {search_name(imp['search'])} ({imp['trials']} trials, "
                     f"{imp['evaluator']}): "
                     + (vals if any(imp["values"].values()) else "none separated the fast trials from the rest"))
    if not a.importance:
        lines.append("knobs that mattered: too few trials (a search with >= 3 trials and a knob that took two values)")
    return "\n".join(lines)
