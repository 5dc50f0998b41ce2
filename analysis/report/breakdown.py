"""The numbers of the report's detailed views: where a step's time goes, measured peak memory beside the memory
model's components, and controlled comparisons of measurements that differ in one knob."""
from __future__ import annotations

import itertools
import json
import math
from typing import TYPE_CHECKING

from trainscout.spaces import ConfigError, all_knobs, applies, fmt
from trainscout.trial.records import TOKENS_PER_S

from .analysis import Analysis
from .formatting import first_line, is_missing, label

if TYPE_CHECKING:
    from trainscout.trial.records import Record

VIEW_TOP = 20  # configurations in the step-time and memory views: the fastest
STEP_PARTS = ("accumulating micro-batches", "last micro-batch (synchronises the gradients)", "optimizer")
MEMORY_PARTS = ("weights", "gradients", "optimizer", "buffers", "activations", "logits")
WORKSPACE = "workspace allowance"  # what memory.predict adds to the analytic sum when it has no calibration


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
        if accum is None or any(is_missing(m.get(k)) for k in ("micro_batch_s", "last_micro_batch_s", "optimizer_s",
                                                          "step_s")):
            continue
        parts = dict(zip(STEP_PARTS, ((accum - 1) * m["micro_batch_s"], m["last_micro_batch_s"], m["optimizer_s"])))
        step = m["step_s"]
        out.append({"row": row, "grad_accum": accum, "micro_batch_s": m["micro_batch_s"], "parts": parts,
                    "step_s": step, "residual_s": step - sum(parts.values())})
    return out


def memory_rows(a: Analysis, top: int = VIEW_TOP) -> tuple[list[dict], list[str]]:
    """The fastest GPU measurements with a measured peak: the memory model's components (predictor.memory.components,
    GiB per rank, on the stored record), its prediction (analytic: the components + WORKSPACE; calibrated on the store's
    measured peaks of that GPU where there are 3 or more), the measured peak and the GPU's capacity. Also the labels
    of rows the model could not be evaluated for (a config.json model that is no longer there)."""
    from trainscout.predictor import memory

    calibrations, out, skipped = {}, [], []
    for row, rec in _fastest(a, top):
        m, hw = rec.m, rec.hardware or {}
        if rec.device != "cuda" or is_missing(m.get("peak_memory_gib")):
            continue
        gpu = m.get("gpu") or hw.get("gpu")
        if gpu not in calibrations:
            calibrations[gpu] = memory.fit(memory.calibration_pairs(list(a.records.values()), gpu))
        try:
            comp = {k: v / memory.GiB for k, v in memory.components(rec).items()}
        except (ConfigError, OSError, KeyError, ValueError) as e:
            skipped.append(f"{label(row)} ({first_line(str(e), 120)})")
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
        if not rec.ok or is_missing(m.get(TOKENS_PER_S)) or not m[TOKENS_PER_S]:
            continue
        cfg = {k.name: (rec.config or {}).get(k.name, k.default) for k in knobs}
        on = {k.name for k in knobs if applies(k, cfg)}
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
            ratio = rb.measured.tokens_per_s / ra.measured.tokens_per_s
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
