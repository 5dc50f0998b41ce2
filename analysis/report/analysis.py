"""The report's numbers: a store's results table with costs, the fastest configurations, what failed, which knobs
mattered (Optuna's PED-ANOVA on a study rebuilt in memory), the Pareto front and a search's progress."""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from datetime import datetime, timezone

import pandas as pd

from trainscout.spaces import ConfigError, all_knobs, applies, fmt, get
from trainscout.store import secrets
from trainscout.trial.records import TOKENS_PER_S
from trainscout.trial.status import Status

from .. import cost, table, ties
from .formatting import NO_SEARCH, STATUS_TEXT, config_text, first_line, is_missing, native_value

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
    verdicts: list = field(default_factory=list)  # per search: (name, analysis.verdict.Verdict): keep searching?
    generated: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"))


def analyse(source, prices_path: str | None = None) -> Analysis:
    """Everything the summary and report.html show. ConfigError for a bad prices file or an empty store."""
    prices = cost.load_prices(prices_path)  # checked before anything heavy
    store = table.store_of(source) if isinstance(source, str) else source
    df = table.load_resolved(store)  # the trials, or the measurements of a store without searches
    if df.empty:
        from trainscout.store.secrets import masked
        raise ConfigError("DIR", f"{masked(str(source))} holds no trials or measurements: run `trainscout search --out "
                                 "DIR` (or `trainscout results DIR --import FILE`) first, then report")
    searched = bool(df["search"].notna().any())
    df = cost.with_costs(df.assign(search=df["search"].fillna(NO_SEARCH)), prices)
    # the trial's number in the report: its Optuna trial number (the live table's and optuna-dashboard's; the report
    # said #4 for Optuna's 3), else its row from 0; rows keep their own anchor ("row")
    df.insert(0, "row", range(len(df)))
    df.insert(0, "n", [int(n) if not is_missing(n) else i for i, n in enumerate(df["number"])])
    records = {m.key: m for m in store.measurements()}
    knobs = [k.name for k in all_knobs() if k.name in df.columns]
    varied = [k for k in knobs if df[k].dropna().map(fmt).nunique() > 1]
    ok = df[(df["status"] == Status.OK) & df[TOKENS_PER_S].notna()]
    # a failed quality verdict last (it trains another model: never the best, as export --best), then measurements
    # other trials shared the CPU or GPU of (trial.contention) after the clean ones, marked
    from trainscout.trial.quality import FAILED
    best = (ok.assign(_failed=ok["quality"] == FAILED, _shared=ok["shared"].notna())
            .sort_values(["_failed", "_shared", TOKENS_PER_S], ascending=[True, True, False])
            .drop(columns=["_failed", "_shared"]).drop_duplicates("key").reset_index(drop=True))
    failures = []
    for status, g in df[df["status"] != Status.OK].groupby("status", sort=False):
        with_error = g[g["error"].notna()]
        ex = (with_error if len(with_error) else g).iloc[0]
        failures.append({"status": status, "count": len(g), "what": STATUS_TEXT.get(status, status),
                         "error": first_line(ex["error"]) if isinstance(ex["error"], str) else None,
                         "config": config_text(ex, varied, knobs), "key": ex["key"]})
    failures.sort(key=lambda f: -f["count"])
    importance = [imp for search, g in df.groupby("search", sort=False) if (imp := knob_importance(g, search))]
    shown = str(source if isinstance(source, str) else getattr(source, "url", source))
    from ..verdict import of_frame
    verdicts = of_frame(df, store, none=NO_SEARCH)
    return Analysis(source=secrets.masked(shown) if "://" in shown else shown, df=df,
                    prices=prices, prices_path=prices_path, records=records, best=best,
                    hardware=cost.compare_hardware(df, prices), failures=failures, importance=importance,
                    varied=varied, searched=searched, tie=ties.choose(list(records.values()), store.verified()),
                    verdicts=verdicts)


def tied_keys(a: Analysis) -> set:
    """The keys of the configurations within the measured noise of the fastest (empty: no tie)."""
    return {r.key for r in a.tie.tied} if a.tie is not None and len(a.tie.tied) > 1 else set()


def knob_importance(trials: pd.DataFrame, search: str) -> dict | None:
    """Which knobs mattered in one search: its trials as an in-memory Optuna study (the objective the search
    maximised: tokens/s, 0 for an infeasible outcome), evaluated by Optuna's PedAnovaImportanceEvaluator.
    None when fewer than 3 trials or no knob took two values."""
    import optuna
    from optuna.distributions import CategoricalDistribution
    from optuna.importance import PedAnovaImportanceEvaluator, get_param_importances

    knobs = [k for k in all_knobs() if k.name in trials.columns]
    rows = trials.to_dict("records")
    cfgs = [{k.name: native_value(k, r[k.name]) for k in knobs} for r in rows]
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
        tps = r[TOKENS_PER_S]
        value = (float(tps) if r["status"] in (Status.OK, Status.STOPPED) and tps is not None and not pd.isna(tps)
                 else 0.0)
        params = {n: c[n] for n in searched if c[n] is not None and applies(get(n), c)}
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


def pareto_front(points: list[tuple[float, float, int]]) -> list[int]:
    """Indices of the points no other point beats on both axes (both minimised), by the first axis."""
    front, best_y = [], math.inf
    for x, y, i in sorted(points):
        if y < best_y:
            front.append(i)
            best_y = y
    return front


def progress(a: Analysis) -> list[dict]:
    """Per search, in trial order: the device-hours spent after each trial and the best tokens/s so far (ok trials
    only: a stopped trial's tokens/s is the best step it reached before ASHA ended it); and where the best was found."""
    out = []
    for search, g in a.df.groupby("search", sort=False):
        hours = (g["gpu_s"].fillna(0).cumsum() / 3600).tolist()
        ok = g[TOKENS_PER_S].where(g["status"] == Status.OK)
        best = ok.cummax().ffill().tolist()
        found = None if ok.isna().all() else g.index.get_loc(ok.idxmax())
        out.append({"search": search, "rows": g, "hours": hours, "best": best, "found": found})
    return out


def measured(df: pd.DataFrame) -> int:
    """Trials that measured tokens/s: ok (served from the store included) or stopped by ASHA after some steps."""
    return int((df["status"].isin([Status.OK, Status.STOPPED]) & df[TOKENS_PER_S].notna()).sum())
