"""report.html: the whole report as one self-contained HTML document (plots inline, no script, no stylesheet or
image from anywhere else), built from the analysis, the sentences and the plots."""
from __future__ import annotations

import os
import shlex

from trainscout.trial.records import TOKENS_PER_S
from trainscout.trial.status import Status

from .analysis import Analysis, analyse, measured, progress, tied_keys
from .breakdown import VIEW_TOP, knob_pairs, memory_empty_reason, memory_rows, pair_groups, step_breakdown
from .formatting import (NO_SEARCH, STATUS_COLOR, STATUS_TEXT, config_text, contributed, days, escape, first_line,
                         gpu_s_text, is_missing, label, num, search_name, usd, where)
from .plots import (plot_cost, plot_importance, plot_knob_pairs, plot_knob_values, plot_memory, plot_pareto,
                    plot_progress, plot_step_breakdown, plot_timeline)
from .text import hours_unit, progress_text, spent_text, tie_text

TOP = 10  # best configurations listed
FEW_TRIALS = 20  # below this many measured trials, knob importance is a hint: PED-ANOVA's top quantile is 2-4 trials
CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;color:#1a1a1a;margin:0;background:#fafafa}
main{max-width:1180px;margin:0 auto;padding:24px 28px 48px;background:#fff}
h1{font-size:24px;margin:0 0 4px}h2{font-size:18px;margin:32px 0 8px;border-bottom:1px solid #ddd;padding-bottom:4px}
.meta{color:#555;margin:0 0 16px}.note{color:#555;font-size:13px;margin:6px 0}
.verdict{border-left:4px solid #1f77b4;background:#f3f7fb;padding:6px 12px;margin:8px 0}.verdict p{margin:4px 0}
.verdict ul{margin:4px 0 4px 18px;padding:0;font-size:13px;color:#333}
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
"""  # noqa: E501 - the style sheet as the page gets it, one rule set a line


def _table(headers: list[str], rows: list[list[str]], numeric: set[int] = frozenset()) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td class=\"n\">{c}</td>" if i in numeric else f"<td>{c}</td>"
                                    for i, c in enumerate(r)) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _tag(status: str) -> str:
    return f'<span class="tag" style="background:{STATUS_COLOR.get(status, "#999")}">{escape(status)}</span>'


def render_html(a: Analysis) -> str:
    """The whole report as one self-contained HTML document (a string)."""
    out = head_section(a)
    out.extend(progress_section(a))
    out.extend(best_section(a))
    out.append("<h2>Projected days vs peak memory</h2>"
               "<p class=\"note\">Each successful measurement; ringed: the Pareto front (no other configuration "
               "is both faster and lighter), numbered by rank.</p>")
    out.append(f"<div class=\"plot\">{plot_pareto(a)}</div>")
    out.extend(step_section(a))
    out.extend(memory_section(a))
    out.extend(cost_section(a))
    out.extend(importance_section(a))
    out.extend(pairs_section(a))
    out.extend(failures_section(a))
    out.extend(trials_section(a))
    out.extend(prices_section(a))
    out.append("</main></body></html>")
    return "\n".join(out)


def head_section(a: Analysis) -> list[str]:
    """The document's head, the title with what the store holds, and the cards of the fastest measurement."""
    df, b = a.df, a.best
    counts = df["status"].value_counts()
    out = [f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>trainscout report</title>"
           "<meta name=\"viewport\" content=\"width=device-width, "
           f"initial-scale=1\"><style>{CSS}</style></head><body><main>",
           "<h1>trainscout report</h1>",
           f"<p class=\"meta\">{escape(a.source)} · "
           + (f"{df['search'].nunique()} search(es), {len(df)} trials · " if a.searched else
              f"{len(df)} measurements (no search rows: one row per measurement) · ")
           + f"models {escape(', '.join(sorted(map(str, df['model'].dropna().unique()))) or 'n/a')} · generated "
             f"{escape(a.generated)}</p>"]
    cards = [("trials" if a.searched else "measurements", " · ".join(f"{int(n)} {s}" for s, n in counts.items()))]
    if df["gpu_s"].notna().any():
        cards.insert(0, (f"{hours_unit(a)} spent", f"{df['gpu_s'].sum() / 3600:,.3g}"))
    if len(b):
        r = b.iloc[0]
        cards = [("fastest: tokens/s", num(r[TOKENS_PER_S])),
                 ("its projected run", f"{days(r['projected_days'])} days"), ("renting it", usd(r["rent_usd"])),
                 ("buying the box", usd(r["box_usd"])), *cards]
    out.append("<div class=\"cards\">" + "".join(
        f"<div class=\"card{' small' if k in ('trials', 'measurements') else ''}\"><b>{escape(v)}</b>"
        f"<span>{escape(k)}</span></div>"
        for k, v in cards) + "</div>")
    return out


def progress_section(a: Analysis) -> list[str]:
    """Should I keep going: the verdicts, the best tokens/s so far against the time spent, and what it says."""
    out = ["<h2 id=\"progress\">Should I keep going? Best tokens/s so far vs " + hours_unit(a) + " spent</h2>"
           "<p class=\"note\">Trials in the order they ran; the line is the fastest successful trial so far, a "
           "dot each trial (hover for its number, id and key: its row in <a href=\"#trials\">All trials</a>). "
           "Time spent counts every trial that ran: wall time × ranks from its record; a trial ASHA stopped "
           "early ran too and leaves no record, so its time is estimated; a trial served from the store or "
           "refused before running counts 0. A long flat line: more trials of this space are unlikely to "
           "help.</p>"]
    for search, v in a.verdicts:  # the rule and its evidence: analysis/verdict.py
        name = f"{search_name(search or NO_SEARCH)}: " if len(a.verdicts) > 1 else ""
        out.append(f"<div class=\"verdict\"><p><b>{escape(name)}Verdict: {escape(v.word)}</b>: {escape(v.why)}.</p>"
                   "<ul>" + "".join(f"<li>{escape(e)}</li>" for e in v.evidence()) + "</ul></div>")
    out.append(f"<div class=\"plot\">{plot_progress(a)}</div>")
    notes = [progress_text(p, hours_unit(a)) for p in progress(a)]
    if spent := spent_text(a):
        notes.append(spent[0].upper() + spent[1:] + ".")
    out.append("".join(f"<p class=\"note\">{escape(n)}</p>" for n in notes))
    return out


def best_section(a: Analysis) -> list[str]:
    """The fastest configurations, the tie among them and what each column means."""
    b = a.best
    out = ["<h2>Best configurations</h2>"]
    if not len(b):
        out.append("<p>No trial ran to the end: nothing to rank (see what failed below).</p>")
        return out
    tied = tied_keys(a)

    def shared(r):  # a measurement that ran beside other trials (trial.contention)
        return " (shared)" if isinstance(r["shared"], str) else ""
    rows = [[str(i + 1) + (" (tie)" if r["key"] in tied else "") + shared(r), num(r[TOKENS_PER_S]),
             num(r["mfu"], ".3f"), escape(r["quality"]), num(r["peak_memory_gib"], ".2f"),
             days(r["projected_days"]), usd(r["rent_usd"]), usd(r["box_usd"]),
             escape(f"{r['model']} on {where(r)}{contributed(r)}"),
             f"<span class=\"cfg\">{escape(config_text(r, a.varied))}</span>",
             f"<code>{escape(str(r['key'])[:12])}</code>"]
            for i, r in b.head(TOP).iterrows()]
    out.append(_table(["#", "tokens/s", "MFU", "quality", "GiB/rank", "days", "rent", "box", "model / hardware",
                       "configuration (set or varied knobs)", "key"], rows, numeric={0, 1, 2, 4, 5, 6, 7}))
    if tied:
        out.append(f"<p class=\"note\"><b>{escape(tie_text(a))}</b></p>")
    if b["shared"].notna().any():
        out.append("<p class=\"note\">(shared): measured while other trials shared its CPU or GPU on the node "
                   "(its tokens/s is lower than alone): ranked after the clean ones and never served to a later "
                   "search, which measures it again; <code>search --max-concurrent 1</code> measures alone.</p>")
    out.append("<p class=\"note\">days: the recipe's full run projected from the measured optimizer step. rent: "
               "days × 24 × $/GPU-hour × GPUs. box: buying the GPUs and the machines that hold them. MFU: "
               "matrix-product FLOPs counted from the model's modules (embedding lookups not counted, a mixture "
               "of experts' routed experts only) against the GPU's bf16 dense peak (n/a on a CPU). quality: "
               "same (no knob changes the numerics), passed / failed (one step against its reference: gradient "
               "SQNR >= 20 dB), verified / failed (<code>trainscout verify DIR --quality STEPS</code>: trained "
               "against its reference on real text), unverified (no verdict). Export one with "
               "<code>trainscout export DIR --trial KEY --format all --out DIR</code>.</p>")
    return out


def cost_section(a: Analysis) -> list[str]:
    """The hardware side by side, and the rent of each successful configuration's projected run."""
    out = ["<h2>Hardware and cost</h2>"]
    if len(a.hardware):
        rows = [[escape(h["model"]), escape(f"{h['hardware']} x{h['world_size']}"), f"{h['ok']}/{h['trials']}",
                 num(h[TOKENS_PER_S]), num(h["mfu"], ".3f"), days(h["projected_days"]), usd(h["rent_usd"]),
                 usd(h["box_usd"]), escape("no price" if is_missing(h["price"]) else h["price"])]
                for _, h in a.hardware.iterrows()]
        out.append(_table(["model", "hardware", "ok/trials", "best tokens/s", "MFU", "days", "rent", "box",
                           "price entry"], rows, numeric={2, 3, 4, 5, 6, 7}))
    if a.best["rent_usd"].notna().any():
        out.append("<p class=\"note\">Cost of renting each successful configuration's projected run, cheapest "
                   "first.</p>")
        out.append(f"<div class=\"plot\">{plot_cost(a)}</div>")
    else:
        out.append("<p>No rental price for the hardware measured here (the built-in table prices GPUs): add one "
                   "with <code>--prices FILE.json</code>.</p>")
    return out


def importance_section(a: Analysis) -> list[str]:
    """Which knobs mattered: PED-ANOVA per search (a caveat where few trials were measured), tokens/s per value."""
    out = ["<h2>Which knobs mattered</h2>"]
    few = [(imp["search"], measured(a.df[a.df["search"] == imp["search"]])) for imp in a.importance]
    few = [(sname, n) for sname, n in few if n < FEW_TRIALS]
    if few:
        out.append("<p class=\"note\" id=\"importance-caveat\"><b>Caveat: few trials.</b> "
                   + "; ".join(f"{escape(search_name(sname))}: "
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
    return out


def failures_section(a: Analysis) -> list[str]:
    """What failed and why: per status, how many trials, one example error and configuration."""
    out = ["<h2>What failed and why</h2>"]
    if a.failures:
        rows = [[_tag(f["status"]), str(f["count"]), escape(f["what"]), f"<code>{escape(f['error'] or '—')}</code>",
                 f"<span class=\"cfg\">{escape(f['config'])}</span>"] for f in a.failures]
        out.append(_table(["status", "trials", "meaning", "example error", "example configuration"], rows,
                          numeric={1}))
    else:
        out.append("<p>Every trial finished.</p>")
    return out


def trials_section(a: Analysis) -> list[str]:
    """Every trial in a table, and their timeline."""
    out = ["<h2 id=\"trials\">All trials</h2><p class=\"note\">"
           + ("Every trial in the order the search recorded it" if a.searched else
              "Every measurement in the order it started (the store holds no search rows)")
           + ": micro-batch and accumulation as the trial ran them (the resolved plan, not <code>max</code>), "
             "status and reason, device-seconds (wall time × ranks; ≈ est.: a trial ASHA stopped, the median "
             "of its search's trials that ran to the end; 0: served from the store or refused before running), and "
             "the command that exports the measurement.</p>"]
    out.append(trial_table(a))
    out.append("<h2>Trial timeline</h2>")
    out.append(f"<div class=\"plot\">{plot_timeline(a)}</div>")
    return out


def prices_section(a: Analysis) -> list[str]:
    """The price entries the costs were computed with, those used marked."""
    out = ["<h2>Prices used</h2><p class=\"note\">List-price estimates, not quotes"
           + (f"; overridden by <code>{escape(a.prices_path)}</code>" if a.prices_path else "")
           + ". Override them with <code>trainscout report DIR --prices FILE.json</code>.</p>"]
    used = set(a.df["price"].dropna())
    rows = [[escape(p.name) + (" (used)" if p.name in used else ""), f"<code>{escape(p.match)}</code>",
             usd(p.gpu_usd), f"{usd(p.machine_usd)} / {p.gpus_per_machine}", usd(p.rent_usd_per_gpu_hour),
             escape(p.source)]
            for p in a.prices]
    out.append(_table(["entry", "matches", "GPU", "machine / GPUs", "$/GPU-hour", "source"], rows, numeric={2, 3, 4}))
    return out


def step_section(a: Analysis) -> list[str]:
    """Where a step's time goes: the projected optimizer step of the fastest measurements in its parts."""
    rows = step_breakdown(a)
    out = ["<h2 id=\"step-breakdown\">Where a step's time goes</h2>",
           "<p class=\"note\">One projected optimizer step (the recipe's global batch) of each of the fastest "
           f"successful measurements (at most {VIEW_TOP}), in the parts its record holds: (accumulation − 1) × the "
           "median accumulating micro-batch, the last micro-batch (which carries the gradient synchronisation) and the "
           "optimizer step. Hover a segment for its trial and time.</p>",
           f"<div class=\"plot\">{plot_step_breakdown(rows)}</div>"]
    if rows:
        worst = max(rows, key=lambda b: abs(b["residual_s"]) / b["step_s"])
        out.append(f"<p class=\"note\">The parts add up to the record's projected step within "
                   f"{100 * abs(worst['residual_s']) / worst['step_s']:.2f} % on these {len(rows)} rows (largest: "
                   f"{escape(label(worst['row']))}, {1000 * worst['residual_s']:+.1f} ms of {worst['step_s']:.3g} s; "
                   "shown beside a bar when above 0.05 %): the step is the median over the timed steps of each "
                   "step's projection on its slowest rank, the parts are medians of their own.</p>")
    return out


def memory_section(a: Analysis) -> list[str]:
    """Measured peak memory beside the memory model's components and the GPU's capacity."""
    rows, skipped = memory_rows(a)
    out = ["<h2 id=\"memory-model\">Peak memory: measured vs the memory model</h2>"]
    if not rows:
        out.append(f"<p>{escape(memory_empty_reason(a))}</p>")
        return out
    cal = [r for r in rows if r["calibrated_gib"]]
    out.append(f"<p class=\"note\">The fastest GPU measurements (at most {VIEW_TOP}): the upper bar is the memory "
               "model's prediction per rank by component (<code>memory.components</code> on the stored record, "
               "plus the 1 GiB workspace allowance of its uncalibrated prediction), the lower bar the measured peak "
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
        out.append(f"<p class=\"note\">{escape(text)}.</p>")
    if skipped:
        out.append("<p class=\"note\">Not drawn, the memory model could not be evaluated for: "
                   + escape("; ".join(skipped)) + "</p>")
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
               "of their tokens/s (to / from). Error bars: the relative spread of each measurement's timed steps "
               "(step_spread), combined in quadrature; red: the median of a value pair. Hover a dot for the two "
               "trials.</p>")
    out.append(f"<div class=\"plot\">{plot_knob_pairs(a, groups)}</div>")
    rows = [[escape(g["knob"]), escape(f"{g['from']} → {g['to']}"), str(g["n"]), f"{g['median']:.3f}",
             f"{g['min']:.3f} – {g['max']:.3f}"] for g in groups]
    out.append(_table(["knob", "from → to", "pairs", "median ratio (to / from)", "range"], rows, numeric={2, 3, 4}))
    return out


def reason(row) -> str:
    """A trial row's reason: the first line of its error, else "served from the store" for a cached ok trial,
    else its status's meaning (empty for ok)."""
    if isinstance(row.get("error"), str) and row["error"].strip():
        return first_line(row["error"], 200)
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
            hours_unit(a).replace("hours", "s"), "configuration (set or varied knobs)", "key", "export"]
    body = []
    for r in a.df.to_dict("records"):
        cmd = export_command(a, r)
        cells = [str(r["n"]), *([escape(r["search"])] if many else []), f"<code>{escape(r['trial'])}</code>",
                 _tag(r["status"]), escape(reason(r)), num(r[TOKENS_PER_S]), num(r["micro_batch"], "d"),
                 num(r["grad_accum"], "d"),
                 escape(gpu_s_text(r)), f"<span class=\"cfg\">{escape(config_text(r, a.varied))}</span>",
                 f"<code>{escape(str(r['key'])[:12]) if isinstance(r['key'], str) else '—'}</code>",
                 f"<code>{escape(cmd)}</code>" if cmd else "—"]
        body.append(f"<tr id=\"trial-{r['row']}\">" + "".join(
            f"<td class=\"n\">{c}</td>" if h in ("#", "tokens/s", "micro-batch", "accum") or h.endswith("-s")
            else f"<td>{c}</td>" for h, c in zip(head, cells)) + "</tr>")
    return ("<table><thead><tr>" + "".join(f"<th>{escape(h)}</th>" for h in head) + "</tr></thead><tbody>"
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
