"""A search's summary: trials by status, per-trial overhead, the fastest distinct configurations and their quality."""
from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from trainscout.spaces import fmt
from trainscout.trial.metrics import median
from trainscout.trial.records import TOKENS_PER_S, metric_columns
from trainscout.trial.status import NOT_COUNTED, Status, lost_node

from .nearest import fit_lines
from .trainable import counted

if TYPE_CHECKING:
    from trainscout.store import Store

# a best configuration's metrics, in the summary
BEST_METRICS = metric_columns(TOKENS_PER_S, "step_s", "mfu", "peak_memory_gib", "projected_days", "gpu_hours")

def clock(seconds: float) -> str:
    """4m12s, 1h05m, 37s."""
    s = int(round(seconds))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


def days_or_hours(d: float) -> str:
    """1.5 days, 3.00 hours."""
    return f"{d:.1f} days" if d >= 1 else f"{d * 24:.2f} hours"


def _verify_hint(b: dict, out: str) -> str:
    """What to run where a best's numerics differ and no training run has compared it with its reference."""
    if b["quality"] in ("same", "verified"):
        return ""
    return f"; train both to compare: trainscout verify {out} --trial {b['key'][:12]} --quality 500"


def overhead_s(record) -> float:
    """A measured trial's orchestration overhead: its wall less its timed steps (those of micro_batch_size=max's
    compared micro-batch too): start-up, build, probe, compile, warm-up, the quality gate, teardown."""
    return record.wall_s - record.metrics["timed_s"] - record.metrics.get("compared_timed_s", 0.0)


def overhead_parts(records: list, overhead: list[float]) -> str:
    """Medians of what the trials' overhead is made of (the parts a record times), and how many started a fresh
    worker group."""
    m = [r.metrics for r in records]
    parts = []
    timed_parts = all(x.get("model_s") is not None for x in m)  # newer records time the model and gate
    if timed_parts:
        parts.append(f"model and engine {median([x['model_s'] for x in m]):.1f} s")
        steps = [x['build_s'] - x['model_s'] + x['warmup_s'] for x in m]
        if all(x.get("compile_s") is not None for x in m):  # newer ones torch.compile too
            parts.append(f"torch.compile {median([x['compile_s'] for x in m]):.1f} s")
            tuned = (f" (inductor autotuning new kernels {median([x['autotune_s'] for x in m]):.1f} s)"
                     if all(x.get("autotune_s") is not None for x in m) else "")
            parts.append(f"probe or warm-up steps {median([s - x['compile_s'] for s, x in zip(steps, m)]):.1f} "
                         f"s{tuned}")
        else:
            parts.append(f"compile and probe or warm-up steps {median(steps):.1f} s")
    else:
        parts.append(f"build, probe and warm-up {median([x['build_s'] + x['warmup_s'] for x in m]):.1f} s")
    gates = [x["gate_s"] for x in m if x.get("gate_s")]
    if gates:
        parts.append(f"quality gate {median(gates):.1f} s in {len(gates)} of {len(m)}")
    rest = [o - x["build_s"] - x["warmup_s"] - (x.get("gate_s") or 0.0) for o, x in zip(overhead, m)]
    if all(x.get("handoff_s") is not None for x in m):  # and the rest
        inside = [r - x["handoff_s"] - x["reset_s"] for r, x in zip(rest, m)]
        parts.append(f"the rest {median(rest):.1f} s (hand-off: Ray, a worker group's start or a stopped trial's "
                     f"last step {median([x['handoff_s'] for x in m]):.1f}, the reset after "
                     f"{median([x['reset_s'] for x in m]):.1f}, in the trial otherwise {max(0.0, median(inside)):.1f})")
        parts.append(f"Python's garbage collector ran {median([x['gc_s'] for x in m]):.1f} s within the trial's parts")
    else:
        parts.append(f"the rest {median(rest):.1f} s (worker start or hand-off, teardown, the store"
                     f"{'' if timed_parts else ', any quality gate'})")
    fresh = sum(1 for r in records if not r.reused)
    return ", ".join(parts) + f"; {fresh} of {len(records)} in a fresh worker group"


def sources_measured(trials: list[dict], points: list[tuple[dict, str]]) -> list[dict]:
    """Each start point taken from elsewhere (the atlas's: search.start.Reason) beside what this search measured of
    it: the first trial ok (else the first) whose configuration has the point's values (a probed micro-batch, max,
    matches any)."""
    out = []
    for point, why in points:
        mine = [t for t in trials if all(v == "max" or t["config"].get(k) == v for k, v in point.items())]
        got = next((t for t in mine if t["status"] == Status.OK), mine[0] if mine else None)
        said = getattr(why, TOKENS_PER_S, None)
        measured = got[TOKENS_PER_S] if got and got["status"] == Status.OK else None
        out.append({"config": point, "why": str(why), "source": getattr(why, "kind", None),
                    "source_tokens_per_s": said, "status": got["status"] if got else None,
                    TOKENS_PER_S: measured,
                    "error": None if not (said and measured) else said / measured - 1})
    return out


def source_lines(rows: list[dict], where: str) -> list[str]:
    """One line per start point from `where`: its source's tokens/s beside this search's measurement."""
    lines = []
    for r in rows:
        said = (f"{r['source']} {r['source_tokens_per_s']:,.0f} tokens/s" if r["source_tokens_per_s"]
                else r["why"])
        got = (f"measured {r[TOKENS_PER_S]:,.0f}" + (
            "" if r["error"] is None else f", the {r['source']} figure {abs(r['error']):.1%} "
                                          f"{'above' if r['error'] > 0 else 'below'} it")
               if r[TOKENS_PER_S] else f"not measured ({r['status'] or 'never ran'})")
        lines.append(f"  start point from {where}: {said}, {got}")
    return lines


_FITS: dict[tuple[str, str], dict] = {}  # (store URL, search) -> nearest_fit's answer given to summarize here


def summarize(store: Store, name: str, stream=sys.stdout, top: int = 3, out: str = "OUT",
              fit: dict | None = None) -> dict:
    """Print a search's outcome to stream: trials by status, per-trial overhead, the `top` fastest distinct
    configurations, each with its quality status (trial/quality.py: the same model as its reference, or not, or
    not known); a search run with --quality strict calls best only those that train the same model (same, passed,
    verified) and names the faster ones it passed over. Where no trial ended ok it says so, and fit (nearest_fit's
    answer; the one this process gave for the search before, where none is given: `search -q` prints the summary
    again) says which configuration came closest to fitting and what would make it fit ("nothing_fits").
    Returns the same as a dict."""
    if fit is not None:
        _FITS[(store.url, name)] = fit
    fit = fit or _FITS.get((store.url, name))
    store.checkpoint()
    strict = (store.search_args(name) or {}).get("quality") == "strict"
    verified = store.verified()
    trials = store.trials(name)
    by_status: dict[str, int] = {}
    for t in trials:
        by_status[t["status"]] = by_status.get(t["status"], 0) + 1
    best, records = _distinct_best(store, trials, verified)
    best, passed_over = _called_best(best, strict, top)
    tie = _tie(best, records, verified)
    # orchestration overhead, in the order the trials ran
    ran = [r for r in (store.get(t["key"]) for t in trials if t["status"] == Status.OK and t["key"] and not t["cached"])
           if r and r.wall_s]
    overhead = [overhead_s(r) for r in ran]
    summary = {"search": name, "trials": len(trials), "by_status": by_status, "best": best[:top],
               "overhead_s": overhead, "tie": tie, "quality": "strict" if strict else "mark",
               "passed_over": passed_over}
    _print_counts(trials, by_status, stream)
    summary["node_lost"] = by_status.get(Status.NODE_LOST, 0)
    summary["unscheduled"] = by_status.get(Status.UNSCHEDULED, 0)
    _print_not_run(trials, summary["node_lost"], summary["unscheduled"], out, stream)
    from trainscout.analysis.table import shared_line
    if shared := shared_line(store, trials):  # measurements taken beside other trials on the node (trial.contention)
        print(shared, file=stream)
    _print_overhead(ran, overhead, stream)
    _print_best(store, name, trials, best, top, tie, out, stream)
    for b in passed_over:  # faster, but not shown to train the same model (strict) or shown not to (failed)
        print(f"not best ({'--quality strict' if strict else 'quality failed'}): {b[TOKENS_PER_S]:,.0f} tokens/s, "
              f"quality {b['quality']}: "
              f"{b['quality_why']}{_verify_hint(b, out)}", file=stream)
    if strict and not best and trials:
        print("no configuration shown to train the same model as its reference: none is called best", file=stream)
    summary["measured"] = by_status.get(Status.OK, 0)  # trials that ended ok (answered from the store included)
    if trials and not summary["measured"]:
        print("nothing measured: no trial of this search ended ok ("
              + ", ".join(f"{v} {k}" for k, v in sorted(by_status.items())) + "): no configuration to call best",
              file=stream)
        if fit is not None:
            summary["nothing_fits"] = fit
            print("\n".join(fit_lines(fit)), file=stream)
    summary["verdict"] = _print_verdict(store, name, out, stream)
    return summary


def _distinct_best(store: Store, trials: list[dict], verified: dict) -> tuple[list[dict], list]:
    """The search's distinct configurations that ended ok, fastest first, each with its measurement and quality
    status; and their records (the key set on each)."""
    from trainscout.trial import quality
    best = []
    seen, records = set(), []
    for t in sorted((t for t in trials if t["status"] == Status.OK and t["key"]),
                    key=lambda t: -(t[TOKENS_PER_S] or 0)):
        if t["key"] in seen:
            continue
        seen.add(t["key"])
        rec = store.get(t["key"])
        rec.key = t["key"]
        records.append(rec)
        status, why = quality.status(rec.metrics, verified.get(t["key"]), rec.config, rec.device)
        best.append({"key": t["key"], "config": rec.config, **{k: rec.metrics.get(k) for k in BEST_METRICS},
                     "quality": status, "quality_why": why, "notes": rec.plan.notes if rec.plan else []})
    return best, records


def _called_best(best: list[dict], strict: bool, top: int) -> tuple[list[dict], list[dict]]:
    """(those that may be called best, the faster ones passed over: at most `top`): --quality strict, those shown
    to train the same model; mark, all but a failed verdict where anything else ran."""
    from trainscout.trial import quality
    passed_over = []
    if strict:  # the faster configurations not shown to train the same model are named, not called best
        good = [b for b in best if b["quality"] in quality.GOOD]
        line = good[0][TOKENS_PER_S] if good else 0.0
        passed_over = [b for b in best if b["quality"] not in quality.GOOD and b[TOKENS_PER_S] > line][:top]
        best = good
    elif good := [b for b in best if b["quality"] != quality.FAILED]:  # mark: a failed verdict is named, never
        line = good[0][TOKENS_PER_S]  # called best while anything else ran (analysis.ties: export --best alike)
        passed_over = [b for b in best if b["quality"] == quality.FAILED and b[TOKENS_PER_S] > line][:top]
        best = good
    return best, passed_over


def _tie(best: list[dict], records: list, verified: dict) -> dict | None:
    """The best of those: the fastest, or the simplest within its measured noise (analysis.ties; rule: README), put
    first in best; the tie where two or more are within that noise, else None."""
    from trainscout.analysis.ties import choose
    called = {b["key"] for b in best}
    choice = choose([r for r in records if r.key in called], verified)
    if choice is not None and choice.is_tie:
        best.sort(key=lambda b: b["key"] != choice.best.key)  # the chosen first, the others fastest first
    return None if choice is None or len(choice.tied) < 2 else {
        "best": choice.best.key, "fastest": choice.fastest.key, "tied": [r.key for r in choice.tied],
        "noise": choice.noise, "why": choice.line()}


def _print_counts(trials: list[dict], by_status: dict[str, int], stream) -> None:
    """The trials by status, and how many count toward --trials."""
    free = len(trials) - counted(trials)
    lost = sum(1 for t in trials if t["status"] in NOT_COUNTED)  # host_oom, node_lost: the host's or the cluster's
    print(f"\n{len(trials)} trials: " + ", ".join(f"{v} {k}" for k, v in sorted(by_status.items()))
          + (f" ({counted(trials)} toward --trials; " + ", ".join(
              [f"{free - lost} refused or pruned before running"] * (free > lost)
              + [f"{lost} lost with their host or node"] * bool(lost)) + ")" if free else ""), file=stream)


def _print_not_run(trials: list[dict], node_lost: int, unscheduled: int, out: str, stream) -> None:
    """The trials lost with their node, and those the cluster gave no room, with what to do."""
    if node_lost:  # the nodes, as each trial's reason names them (trial.status.node_lost_line)
        nodes = sorted({node for t in trials if t["status"] == Status.NODE_LOST and (node := lost_node(t["error"]))})
        n = node_lost
        print(f"{n} trial{'s were' if n != 1 else ' was'} lost with {'their node' if len(nodes) < 2 else 'their nodes'}"
              f" {', '.join(nodes) or '(not named)'}: the node left the cluster while {'they' if n != 1 else 'it'} "
              "ran; nothing measured, not counted toward --trials; the search went on with the remaining nodes",
              file=stream)
    if unscheduled:
        print(f"{unscheduled} trial{'s were' if unscheduled != 1 else ' was'} unscheduled: the "
              "cluster gave their ranks no room within the time limit (other searches or jobs held it; nothing ran "
              f"and the sampler learnt nothing): `trainscout search --resume {out}` runs them again; a smaller "
              "--max-concurrent leaves room", file=stream)


def _print_overhead(ran: list, overhead: list[float], stream) -> None:
    """The measured trials' orchestration overhead (wall less timed steps), and where it went."""
    if overhead:
        later = f"; after the first: median {median(overhead[1:]):.1f} s" if len(overhead) > 1 else ""
        print(f"per-trial overhead (wall − timed steps): median {median(overhead):.1f} s, range "
              f"{min(overhead):.1f}–{max(overhead):.1f} s over {len(overhead)} measured trials{later}", file=stream)
        parts = overhead_parts(ran[1:] or ran, overhead[1:] or overhead)
        print(f"  where it went{' after the first' if len(ran) > 1 else ''}: {parts}", file=stream)


def _print_best(store: Store, name: str, trials: list[dict], best: list[dict], top: int, tie: dict | None, out: str,
                stream) -> None:
    """The `top` best, each with its trial number (the live table's "#", set on every best), measurement, knobs
    within the terminal's width, quality and notes; then why the first of a tie is the best."""
    tied = set(tie["tied"]) if tie else set()
    from trainscout.analysis.table import trial_numbers  # the live table's "#": Optuna's trial number
    numbers, first = trial_numbers(store, name), {}
    for t in trials:
        if t["status"] == Status.OK and t["key"]:
            first.setdefault(t["key"], numbers.get(t["trial"]))
    for b in best:
        b["trial_number"] = first.get(b["key"])
    for i, b in enumerate(best[:top], 1):
        mfu = f", MFU {b['mfu']:.3f}" if b["mfu"] else ""
        from trainscout.analysis.terminal import terminal_width, wrap_fields
        cfg = "\n".join(wrap_fields([f"{k}={fmt(v)}" for k, v in b["config"].items()], terminal_width(stream),
                                     " " * 9)).lstrip()  # a terminal: whole knob=value fields within its width
        mark = " (tie)" if b["key"] in tied else ""
        number = f" (trial #{b['trial_number']})" if b.get("trial_number") is not None else ""
        print(f"best, rank {i}{number}{mark}: {b[TOKENS_PER_S]:,.0f} tokens/s{mfu}, {b['peak_memory_gib']:.1f} GiB, "
              f"{days_or_hours(b['projected_days'])} for the recipe\n         {cfg}\n         quality: {b['quality']}: "
              f"{b['quality_why']}{_verify_hint(b, out)}", file=stream)
        for note in b["notes"]:
            print(f"         note: {note}", file=stream)
    if tie:
        why = tie["why"] or (f"the fastest is also the simplest of the {len(tied)} configurations within the measured "
                             f"noise ({tie['noise']:.1%}) of it, marked (tie): it is the best (rule: README, ties)")
        print(f"  {why}", file=stream)


def _print_verdict(store: Store, name: str, out: str, stream) -> dict:
    """Keep searching? The rule's verdict and its evidence (analysis.verdict), printed with the next commands;
    returns the verdict as a dict."""
    from trainscout.analysis.terminal import terminal_width
    from trainscout.analysis.verdict import of_search  # keep searching? the rule and its evidence
    verdict = of_search(store, name)
    as_dict = verdict.as_dict()
    print(verdict.line(terminal_width(stream)), file=stream)
    print(f"results: trainscout results {out}   export: trainscout export {out} --best --format all", file=stream)
    return as_dict
