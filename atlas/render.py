"""A lookup's answer as text for people: each measured group's rows with their provenance, the prediction with its
leave-one-out error, the budget's verdict; several models one line each."""
from __future__ import annotations

import math

from trainscout.trial.records import TOKENS_PER_S

from . import families


def _provenance_line(prov: dict) -> str:
    v = lambda k: prov.get(k) if prov.get(k) is not None else "not installed"  # noqa: E731
    return (f"{prov.get('date', 'unknown')[:10]}, {prov.get('gpu')} (driver "
            f"{prov.get('driver')}, CUDA {prov.get('cuda')}), torch {v('torch')}, transformers {v('transformers')}, "
            f"deepspeed {v('deepspeed')}, trainscout {v('trainscout')}; {prov.get('command')}; "
            f"{prov.get('origin')}: {prov.get('source')}")


def _num(v, fmt="{:,.0f}", none="-"):
    return none if v is None or (isinstance(v, float) and math.isnan(v)) else fmt.format(v)


def _pct(v):
    return "-" if v is None else f"{100 * v:.1f} %"


def render(answer: dict, provenance: bool = True) -> str:
    """The answer as text for people."""
    name = answer["model"]
    lines = _measured_lines(answer, name, provenance)
    labels = {w for g in answer["measured"] for r in g["rows"] for w in r["label_why"]}
    for why in sorted(labels):
        lines.append(f"   label: {why}")
    conv = next((r["mfu_convention"] for g in answer["measured"] for r in g["rows"] if r.get("mfu_convention")), None)
    if conv:
        lines.append(f"   MFU: {conv}; rent: analysis/prices.json list-price estimates")
    p = answer.get("predicted")
    if p:
        lines.extend(_predicted_lines(p, name))
    for note in answer["notes"]:
        lines.append(f"   note: {note}")
    if answer.get("budget"):
        lines.append(f"   budget: {answer['budget']['text']}")
    return "\n".join(lines)


def _measured_lines(answer: dict, name: str, provenance: bool) -> list[str]:
    """Each measured group: its rows with their repeats, labels, quality, verification and provenance; its
    configurations out of memory."""
    lines = []
    for g in answer["measured"]:
        if not g["rows"] and not g["oom"]:
            continue
        tokens = g["rows"][0]["train_tokens"] if g["rows"] else None
        lines.append(f"{name} on {g['gpus']} x {g['gpu']}: MEASURED (global batch {g['global_batch']:,}"
                     + (f", {tokens / 1e9:,.1f} B tokens" if tokens else "") + ")")
        lines.append(f"   {'tokens/s':>9}  {'MFU':>5}  {'peak GiB':>8}  {'days':>6}  {'rent':>9}  configuration")
        for i, r in enumerate(g["rows"], 1):
            reps = f" [median of {len(r['repeats'])}]" if len(r["repeats"]) > 1 else ""
            lab = f" [{', '.join(r['labels'])}]" if r["labels"] else ""
            contributed = " [contributed]" if "contributed" in r["origins"] else ""
            contributed += " [shared: measured beside other trials]" if r.get("shared") else ""
            contributed += " [best: what export --best writes]" if r.get("best") and len(g["rows"]) > 1 else ""
            lines.append(f"{i:2} {_num(r[TOKENS_PER_S]):>9}  {_num(r['mfu'], '{:.3f}'):>5}  "
                         f"{_num(r['peak_memory_gib'], '{:.1f}'):>8}  {_num(r['projected_days'], '{:.1f}'):>6}  "
                         f"{_num(r['rent_usd'], '${:,.0f}'):>9}  {r['describe']}{reps}{lab}{contributed}")
            if r["quality"][0] != "same":  # knobs that change the numerics (trial/quality.py)
                lines.append(f"     quality: {r['quality'][0]}: {r['quality'][1]}")
            if r.get("verified"):
                v = r["verified"][0]
                lines.append(f"     verified: {v['steps']} full optimizer steps ({v['runner']}) at "
                             f"{v['ratio']:.3f} x the projected step")
            if provenance:
                lines.append(f"     provenance: {_provenance_line(r['provenance'])}")
        if g["more"]:
            lines.append(f"   ({g['more']} more measured configurations: --top N shows more)")
        for o in g["oom"]:
            lines.append(f"   out of memory: {o['describe']}")
    return lines


def _predicted_lines(p: dict, name: str) -> list[str]:
    """The prediction: its rows with the leave-one-out error of the rows they are calibrated on, its notes, where it
    comes from and the search that would measure it."""
    lines = []
    if not p["rows"]:
        lines.append(f"{name}: not measured, and nothing is PREDICTED to fit (up to 8 GPUs)")
    for i, r in enumerate(p["rows"], 1):
        if i == 1:
            lines.append(f"{name} on {r['gpus']} x {r['gpu']}: NOT MEASURED - PREDICTED (global batch "
                         f"{r['global_batch']:,}, {r['train_tokens'] / 1e9:,.1f} B tokens)")
            lines.append(f"   {'tokens/s':>9}  {'MFU':>5}  {'peak GiB':>8}  {'host GiB':>8}  {'days':>6}  "
                         f"{'rent':>9}  configuration (predicted)")
        lines.append(f"{i:2} {_num(r[TOKENS_PER_S]):>9}  {_num(r.get('mfu'), '{:.3f}'):>5}  "
                     f"{_num(r['peak_memory_gib'], '{:.1f}'):>8}  {_num(r.get('host_memory_gib'), '{:.1f}'):>8}  "
                     f"{_num(r['projected_days'], '{:.1f}'):>6}  {_num(r['rent_usd'], '${:,.0f}'):>9}  "
                     f"{r['describe']}")
        e, ea = r["error"], r["error_all"]
        lines.append(f"     calibrated on {', '.join(r['calibrated_on'])} (level {r['level']}: "
                     f"{families.LEVEL_WORDS[r['level']]}); leave-one-model-out error of those rows: "
                     f"tokens/s median {_pct(e[TOKENS_PER_S]['median_abs'])}, worst "
                     f"{_pct(e[TOKENS_PER_S]['worst'])} ({e[TOKENS_PER_S]['n']} rows); peak memory median "
                     f"{_pct(e['peak_memory']['median_abs'])}, worst {_pct(e['peak_memory']['worst'])}")
        if i == 1:
            lines.append(f"     over all {ea[TOKENS_PER_S]['n']} {r.get('error_scope', '')} rows: tokens/s "
                         f"median {_pct(ea[TOKENS_PER_S]['median_abs'])}, worst "
                         f"{_pct(ea[TOKENS_PER_S]['worst'])}; peak memory median "
                         f"{_pct(ea['peak_memory']['median_abs'])}, worst {_pct(ea['peak_memory']['worst'])}")
    for note in p["notes"]:
        lines.append(f"   note: {note}")
    lines.append(f"   prediction {p['source']}")
    lines.append(f"   measure it: {p['search_command']}")
    return lines


def render_summary(answers: list[dict]) -> str:
    """Several models, one line each: the best measured row, else the best predicted one (the seed paper's
    question: every Pythia size on one GPU)."""
    head = f"{'model':14} {'':9} {'tokens/s':>9} {'MFU':>6} {'peak GiB':>8} {'days':>7} {'rent':>9}  best configuration"
    lines = [head]
    for a in answers:
        rows = [r for g in a["measured"] for r in g["rows"]]
        r = next((r for r in rows if r.get("best")), rows[0]) if rows else None
        aside = None
        if r and (a.get("predicted") or {}).get("rows"):  # measured at another global batch only: predicted too
            aside, r = (f"measured {_num(r[TOKENS_PER_S])} tokens/s at {r['global_batch']:,} sequences per step "
                        f"({r['describe']})"), None
        if r:
            lab = f" [{', '.join(r['labels'])}]" if r["labels"] else ""
            lines.append(f"{a['model']:14} {'measured':9} {_num(r[TOKENS_PER_S]):>9} {_num(r['mfu'], '{:.3f}'):>6} "
                         f"{_num(r['peak_memory_gib'], '{:.1f}'):>8} {_num(r['projected_days'], '{:.1f}'):>7} "
                         f"{_num(r['rent_usd'], '${:,.0f}'):>9}  {r['describe']} ({r['gpus']} x {r['gpu']}){lab}")
            continue
        p = a.get("predicted") or {}
        if p.get("rows"):
            r = p["rows"][0]
            lines.append(f"{a['model']:14} {'PREDICTED':9} {_num(r[TOKENS_PER_S]):>9} "
                         f"{_num(r.get('mfu'), '{:.3f}'):>6} {_num(r['peak_memory_gib'], '{:.1f}'):>8} "
                         f"{_num(r['projected_days'], '{:.1f}'):>7} {_num(r['rent_usd'], '${:,.0f}'):>9}  "
                         f"{r['describe']} ({r['gpus']} x {r['gpu']}; tokens/s "
                         f"+-{_pct(r['error'][TOKENS_PER_S]['median_abs'])} median, "
                         f"{_pct(r['error'][TOKENS_PER_S]['worst'])} worst)")
        else:
            lines.append(f"{a['model']:14} {'PREDICTED':9} does not fit up to 8 GPUs")
        for note in ([aside] if aside else []) + p.get("notes", [])[:1]:
            lines.append(f"{'':25}note: {note}")
    return "\n".join(lines)
