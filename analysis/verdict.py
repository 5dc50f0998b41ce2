"""Should I keep searching? One rule, with the evidence it read (the search summary and the report print both).

The evidence, from a search's trials in the order they ended (or a store's measurements in the order they were made):
- measured: the trials that ran to the end (ok, answered from the store included); the others are counted by status
  (stopped by ASHA, invalid, pruned, oom, crash, ...): they say where not to go, not how fast the best can be.
- the best's improvement over the last WINDOW measured trials: (best now - best before them) / best before them,
  and that per trial.
- the noise band: the larger of the measured trials' median step spread ((slowest - fastest) / median of the timed
  steps) and the median spread of a key's repeated measurements, where the store holds any.
- unexplored: the values of the searched space (the search's Optuna study's distributions) that no measured trial
  ran; for a store of measurements without a search (a grid), the values its measurements took.

The rule (verdict()):
1. fewer than MIN_MEASURED measured trials: "keep searching" (thin evidence is never a reason to stop, however many
   trials were stopped or refused);
2. the best rose by more than the noise band over the last WINDOW measured trials: "keep searching";
3. it did not, and values of the space were never measured, or no space is known: "diminishing returns";
4. it did not, and every value of the space was measured: "enough".
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from trainscout.trial.records import TOKENS_PER_S

WINDOW = 5        # the last N measured trials the improvement is read over
MIN_MEASURED = 6  # fewer measured trials than this: too few to tell (WINDOW + the best before them)
KEEP, DIMINISHING, ENOUGH = "keep searching", "diminishing returns", "enough"


@dataclass
class Verdict:
    word: str                        # KEEP, DIMINISHING or ENOUGH
    why: str                         # the rule's reason, one clause
    measured: int                    # trials that ran to the end
    trials: int                      # all trials (or measurements)
    not_measured: dict = field(default_factory=dict)  # status -> count of the others
    window: int = 0                  # measured trials the gain is read over (0: too few)
    gain: float | None = None        # the best's relative rise over the window
    noise: float = 0.0               # the noise band (fraction of tokens/s)
    noise_from: str = "no spread recorded"
    unexplored: dict | None = None   # knob -> values of the space never measured (None: no space known)
    space_from: str = "the search's space"

    @property
    def per_trial(self) -> float | None:
        return None if self.gain is None or not self.window else self.gain / self.window

    def line(self, width: int | None = None) -> str:
        """The verdict and its evidence: one line, or lines of at most width (a terminal's) with the evidence
        indented."""
        if width is None:
            return f"verdict: {self.word}: {self.why}; " + "; ".join(self.evidence())
        import textwrap
        first = textwrap.wrap(f"verdict: {self.word}: {self.why}", width, subsequent_indent="  ")
        return "\n".join(first + [ln for e in self.evidence()
                                   for ln in textwrap.wrap(e, width, initial_indent="  ", subsequent_indent="    ")])

    def evidence(self) -> list[str]:
        others = ", ".join(f"{n} {s}" for s, n in sorted(self.not_measured.items(), key=lambda kv: -kv[1]))
        out = [f"{self.measured} of {self.trials} trials measured" + (f" (not measured: {others})" if others else "")]
        if self.gain is not None:
            out.append(f"best +{self.gain:.1%} over the last {self.window} measured ({self.per_trial:+.2%} per trial)")
        out.append(f"noise band {self.noise:.1%} ({self.noise_from})")
        if self.unexplored is None:
            out.append("unexplored: not known (no search space recorded)")
        elif not self.unexplored:
            out.append(f"unexplored: none of {self.space_from}")
        else:
            n = sum(len(v) for v in self.unexplored.values())
            out.append(f"unexplored: {n} value{'s' if n != 1 else ''} of {self.space_from} never measured ("
                       + ", ".join(f"{k}={'|'.join(v)}" for k, v in self.unexplored.items()) + ")")
        return out

    def as_dict(self) -> dict:
        return {"verdict": self.word, "why": self.why, "measured": self.measured, "trials": self.trials,
                "not_measured": self.not_measured, "window": self.window, "gain": self.gain,
                "gain_per_trial": self.per_trial, "noise": self.noise, "noise_from": self.noise_from,
                "unexplored": self.unexplored}


def _num(v) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) else f


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    n = len(xs)
    return (xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2) if n else 0.0


def verdict(trials: list[dict], space: dict[str, list[str]] | None = None, window: int = WINDOW,
            min_measured: int = MIN_MEASURED, space_from: str = "the search's space") -> Verdict:
    """The rule (module docstring) over trials in the order they ended: dicts with `status`, `tokens_per_s`, and
    where known `step_spread`, `tokens_per_s_spread` (a key's repeated measurements) and `config` (knob -> value as
    text). space: knob -> its values as text (space_of), None where not known."""
    ok = [t for t in trials if t.get("status") == "ok" and _num(t.get(TOKENS_PER_S))]
    others: dict[str, int] = {}
    measured = {id(t) for t in ok}
    for t in trials:
        if id(t) not in measured:
            s = str(t.get("status"))
            others[s] = others.get(s, 0) + 1
    spreads = [s for t in ok if (s := _num(t.get("step_spread"))) is not None]
    repeats = [s for t in ok if (s := _num(t.get("tokens_per_s_spread"))) is not None]
    noise, noise_from = 0.0, "no spread recorded"
    if spreads:
        noise, noise_from = _median(spreads), f"median step spread of {len(spreads)} measured"
    if repeats and _median(repeats) > noise:
        noise, noise_from = _median(repeats), f"median spread of {len(repeats)} repeated measurements"
    unexplored = None
    if space is not None:
        ran = {}
        for t in ok:
            for k, v in (t.get("config") or {}).items():
                ran.setdefault(k, set()).add(str(v))
        unexplored = {k: [v for v in vals if v not in ran.get(k, set())] for k, vals in space.items()}
        unexplored = {k: v for k, v in unexplored.items() if v}
    v = Verdict(KEEP, "", len(ok), len(trials), others, noise=noise, noise_from=noise_from, unexplored=unexplored,
                space_from=space_from)
    if len(ok) < max(min_measured, window + 1):
        v.why = (f"too few measured trials to tell ({len(ok)}, fewer than {max(min_measured, window + 1)}): the "
                 "stopped, refused and failed ones say where not to go, not how fast the best can be")
        return v
    best = [_num(t[TOKENS_PER_S]) for t in ok]
    before, now = max(best[:-window]), max(best)
    v.window, v.gain = window, (now - before) / before
    if v.gain > noise:
        v.why = f"the best still rose beyond the noise band over the last {window} measured trials"
    elif unexplored is None or unexplored:
        v.word = DIMINISHING
        v.why = (f"the best did not rise beyond the noise band over the last {window} measured trials, but "
                 + ("no space is recorded to say what is left" if unexplored is None
                    else "values of the space were never measured"))
    else:
        v.word = ENOUGH
        v.why = (f"the best did not rise beyond the noise band over the last {window} measured trials, and "
                 f"nothing of {space_from} is left unmeasured")
    return v


def space_of(store, search: str) -> dict[str, list[str]] | None:
    """The searched space: knob -> the values its Optuna study's distributions offered (as text); None where the
    store holds no such study (a benchmark grid, an import)."""
    import optuna
    from optuna.distributions import CategoricalDistribution

    from trainscout.spaces import fmt
    from trainscout.store import Store
    try:
        from optuna.storages import RDBStorage
        storage = RDBStorage(store.url, skip_compatibility_check=True, skip_table_creation=True,
                             engine_kwargs=Store.engine_kwargs(store.url))
        trials = optuna.load_study(study_name=search, storage=storage).get_trials(deepcopy=False)
    except Exception:  # noqa: BLE001 - no study, or another schema: no space known
        return None
    space: dict[str, list[str]] = {}
    for t in trials:
        for k, d in t.distributions.items():
            if isinstance(d, CategoricalDistribution):
                for c in d.choices:
                    if fmt(c) not in space.setdefault(k, []):
                        space[k].append(fmt(c))
    return space or None


def of_frame(df, store=None, none: str = "<no search>") -> list[tuple[str | None, Verdict]]:
    """Per search of a results table (analysis.table.load_resolved: a search's trials, or a store's measurements
    under search None, or named `none`), in the table's order: its verdict."""
    from trainscout.spaces import all_knobs, fmt
    knobs = [k.name for k in all_knobs() if k.name in df.columns]
    out = []
    for search, g in df.groupby(df["search"].fillna(none), sort=False):
        search = None if search == none else search
        if "created_at" in g.columns and search is None:
            g = g.sort_values("created_at", kind="stable")
        rows = [{"status": str(r["status"]), TOKENS_PER_S: r.get(TOKENS_PER_S), "step_spread": r.get("step_spread"),
                 "tokens_per_s_spread": r.get("tokens_per_s_spread"),
                 "config": {k: fmt(r[k]) for k in knobs if r[k] is not None and not _isna(r[k])}}
                for r in g.to_dict("records")]
        if search is None:  # measurements only (a grid): the values its measurements took, for knobs they varied
            took = {k: list(dict.fromkeys(r["config"][k] for r in rows if k in r["config"])) for k in knobs}
            out.append((None, verdict(rows, {k: v for k, v in took.items() if len(v) > 1},
                                      space_from="the knob values the store's measurements took")))
        else:
            out.append((search, verdict(rows, space_of(store, search) if store is not None else None)))
    return out


def _isna(v) -> bool:
    try:
        return bool(v != v)
    except Exception:  # noqa: BLE001
        return False


def of_search(store, name: str) -> Verdict:
    """The verdict on one search of a store, from its trial rows (their records' spreads) and its study's space."""
    from trainscout.spaces import fmt
    rows = []
    for t in store.trials(name):
        rec = store.get(t["key"]) if t.get("key") and t["status"] == "ok" else None
        m = rec.metrics if rec is not None else {}
        rows.append({"status": str(t["status"]), TOKENS_PER_S: t.get(TOKENS_PER_S),
                     "step_spread": m.get("step_spread"),
                     "config": {k: fmt(v) for k, v in (t.get("config") or {}).items()}})
    return verdict(rows, space_of(store, name))
