"""Leave-one-out over the shipped rows: each row predicted without its model (or without itself and its repeats),
the errors summarised, and the tables docs/BENCHMARKS.md prints."""
from __future__ import annotations

from trainscout.trial.records import TOKENS_PER_S

from .calibrate import calibrate, knob_effects, memory_calibration, memory_fit
from .families import LEVEL_WORDS, LEVELS
from .samples import Sample


def leave_one_out(pool: list[Sample], hold: str) -> list[dict]:
    """Each sample predicted without itself: hold="model" leaves out every row of its model (a model never
    measured), hold="row" its own key (the row and its repeats). Per row: the level calibrated at, the signed
    relative errors of tokens/s and peak memory (None where no peak was recorded)."""
    from trainscout.predictor import memory
    out, effects = [], {}
    for s in pool:
        others = [x for x in pool if (x.shape != s.shape if hold == "model" else x.key != s.key)]
        rest = [x for x in others if x.gpu == s.gpu]
        held = s.shape if hold == "model" else s.key
        if held not in effects:  # the knobs' effects from every GPU kind's rows but the held-out ones
            effects[held] = knob_effects(others)
        got = calibrate(s.fam, s.n_params, s.arch, rest, s.knobs, effects[held])
        if got is None:
            continue
        ratio, used, level = got
        tps = s.tokens_per_step / s.predicted_s(ratio)
        mem = fitted = None
        if s.peak:
            cal = memory_calibration(s.fam, s.n_params, s.arch, rest)
            mem = memory.predict_terms(s.states, s.acts, cal[0]) if cal else None
            fitted = memory.predict_terms(s.states, s.acts, memory_fit(rest))
        out.append({"id": s.id, "model": s.model, "gpu": s.gpu, "family": s.family, "level": level,
                    "calibrated_families": sorted({x.family for x in used}), "tps_err": tps / s.tokens_per_s - 1,
                    "mem_err": None if mem is None else mem / s.peak - 1,
                    "mem_fit_err": None if fitted is None else fitted / s.peak - 1})
    return out


def summary(errors: list[float]) -> dict:
    """n, the median |error| and the worst error (signed) of a list of relative errors."""
    from trainscout.trial.metrics import median
    if not errors:
        return {"n": 0, "median_abs": None, "worst": None}
    return {"n": len(errors), "median_abs": median([abs(e) for e in errors]), "worst": max(errors, key=abs)}


def loo_summary(results: list[dict], level: int | None = None, gpu: str | None = None, family: str | None = None,
                ids=None) -> dict:
    """The tokens/s and memory error summaries of leave_one_out's results (at one calibration level, or all; of
    one GPU kind, one architecture family, the rows of ids)."""
    ids = set(ids) if ids is not None else None
    sel = [r for r in results if (level is None or r["level"] == level) and (gpu is None or r.get("gpu") == gpu)
           and (family is None or r.get("family") == family) and (ids is None or r["id"] in ids)]
    return {TOKENS_PER_S: summary([r["tps_err"] for r in sel]),
            "peak_memory": summary([r["mem_err"] for r in sel if r["mem_err"] is not None]),
            "peak_memory_one_fit": summary([r["mem_fit_err"] for r in sel if r.get("mem_fit_err") is not None])}


def _pct(v) -> str:
    return "-" if v is None else f"{100 * v:+.1f} %" if v < 0 or v > 0 else "0.0 %"


def loo_table_by(model: dict) -> str:
    """The leave-one-out error per GPU kind and architecture family (docs/BENCHMARKS.md, markdown)."""
    lines = ["| held out | GPU | family | rows | tokens/s: median \\|error\\| | worst | peak memory: median "
             "\\|error\\| | worst |", "|---|---|---|---|---|---|---|---|"]
    names = {"model": "the row's model", "row": "the row and its repeats"}
    for hold, by in model.get("loo_by", {}).items():
        for what, s in by.items():
            gpu, fam = what.split("|")
            t, m = s[TOKENS_PER_S], s["peak_memory"]
            lines.append(f"| {names[hold]} | {gpu} | {fam} | {t['n']} | {100 * t['median_abs']:.1f} % | "
                         f"{_pct(t['worst'])} | " + (f"{100 * m['median_abs']:.1f} % | {_pct(m['worst'])} |"
                                                      if m["n"] else "- | - |"))
    return "\n".join(lines)


def loo_table(model: dict) -> str:
    """The leave-one-out table of docs/BENCHMARKS.md (markdown)."""
    lines = ["| held out | calibrated at | rows | tokens/s: median \\|error\\| | worst | peak memory: median "
             "\\|error\\| | worst | one memory fit over all: median, worst |", "|---|---|---|---|---|---|---|---|"]
    names = {"model": "the row's model (as for a model never measured)", "row": "the row and its repeats"}
    for hold, by in model["loo_summary"].items():
        for lv in ["all", *[str(i) for i in range(len(LEVELS))]]:
            s = by[lv]
            if not s[TOKENS_PER_S]["n"]:
                continue
            t, m = s[TOKENS_PER_S], s["peak_memory"]
            what = "any level" if lv == "all" else f"level {lv}: {LEVEL_WORDS[int(lv)]}"
            lines.append(f"| {names[hold]} | {what} | {t['n']} | {100 * t['median_abs']:.1f} % | {_pct(t['worst'])} | "
                         + (f"{100 * m['median_abs']:.1f} % | {_pct(m['worst'])} |" if m["n"] else "- | - |")
                         + (f" {100 * f['median_abs']:.1f} %, {_pct(f['worst'])} |"
                            if (f := s["peak_memory_one_fit"])["n"]
                            else " - |"))
    return "\n".join(lines)
