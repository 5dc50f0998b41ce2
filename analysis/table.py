"""Results as a pandas table: one row per trial of every search in a store, one column per knob and metric."""
from __future__ import annotations

import json
import os

import pandas as pd

from trainscout.spaces import ConfigError, all_knobs
from trainscout.store import Store, default_url, samples
from trainscout.trial import contention
from trainscout.trial.records import Record, TOKENS_PER_S, metric_columns
from trainscout.trial.status import Status

METRICS = metric_columns(TOKENS_PER_S, "step_s", "mfu", "hfu", "peak_memory_gib", "projected_days", "gpu_hours",
                         "micro_batch_s", "optimizer_s", "step_spread")


def store_of(source: str, create: bool = False) -> Store:
    """A search's --out folder (its results.db) or a SQLAlchemy URL; create=True makes a new folder's store."""
    if "://" in source:
        from trainscout.store.guard import sqlite_path
        path = sqlite_path(source)
        if path is not None and not create and not os.path.isfile(path):  # a typo made an empty database there
            raise ConfigError("DIR", f"{source}: no SQLite file {path}: give a search's --out folder or the URL of an "
                                     "existing store")
        return Store(source)
    if create:
        os.makedirs(source, exist_ok=True)
    elif not os.path.exists(os.path.join(source, "results.db")):
        raise ConfigError("DIR", f"{source} holds no results.db: give a search's --out folder or a storage URL")
    return Store(default_url(source))


def load(source: str) -> pd.DataFrame:
    """One row per trial (failures included, with their reason), then one per measurement no search of the store ran:
    search, status, knobs, metrics, hardware."""
    store = store_of(source) if isinstance(source, str) else source
    knobs = [k.name for k in all_knobs()]
    records = {m.key: m for m in store.measurements()}
    others = samples.summary(store.engine)  # a key's other measurements (store.samples)
    verified = store.verified()
    with store.engine.connect() as c:
        searches = [r[0] for r in c.exec_driver_sql("SELECT name FROM trainscout_searches")]
    rows = []
    for search in searches:
        numbers = trial_numbers(store, search)
        for t in store.trials(search):
            rec = records.get(t["key"])
            # why it failed or did not run: the record's error, else the search's row (an invalid or pruned trial
            # has no record)
            row = _row(rec, knobs, search=search, trial=t["trial"], status=t["status"], cached=bool(t["cached"]),
                       error=(rec.error if rec else None) or t.get("error"), key=t["key"],
                       created_at=t["created_at"], config=t["config"], number=numbers.get(t["trial"]),
                       verified=verified.get(t["key"]))
            if t["status"] == Status.STOPPED:
                row[TOKENS_PER_S] = t[TOKENS_PER_S]  # the throughput it was stopped at
            rows.append(dict(row, **_samples(rec, others.get(t["key"]))))
    listed = {r["key"] for r in rows}
    # a measurement no search of this store ran (imported, a bench's), by start time: export --best may take it
    for rec in sorted((r for k, r in records.items() if k not in listed), key=lambda r: (r.started_at or "", r.key)):
        rows.append(dict(_row(rec, knobs, search=None, trial=rec.trial_id or rec.key[:12], status=str(rec.status),
                              cached=False, error=rec.error, key=rec.key, created_at=rec.started_at,
                              config=rec.config, verified=verified.get(rec.key)), **_samples(rec, others.get(rec.key))))
    return typed(pd.DataFrame(rows, columns=columns(knobs)))


def columns(knobs: list[str]) -> list[str]:
    """load()'s columns, in order."""
    return ["search", "trial", "number", "status", "cached", "error", "model", "device", "world_size", "gpu",
            "placement", *knobs, *METRICS, "quality", "shared", "samples", "tokens_per_s_spread", "key", "created_at",
            "origin"]


def typed(df: pd.DataFrame) -> pd.DataFrame:
    """The same dtypes in every store: metrics float (mfu was object on a CPU store, where it is None: nlargest
    raised), each knob's column by its domain (whole numbers: Int64, booleans: boolean, anything mixed such as
    micro_batch_size's numbers and "max": object; it was int64 in one store and float or text in another)."""
    from trainscout.spaces import all_knobs
    for col in METRICS:
        df[col] = pd.to_numeric(df[col], errors="coerce").astype("float64")
    for k in all_knobs():
        if k.name not in df.columns:
            continue
        kinds = {type(c) for c in k.choices}
        dtype = "Int64" if kinds == {int} else "boolean" if kinds == {bool} else object
        try:
            df[k.name] = df[k.name].astype(dtype)
        except (TypeError, ValueError):  # a stored value outside the domain's kind (an older store): as stored
            df[k.name] = df[k.name].astype(object)
    if "number" in df.columns:
        df["number"] = df["number"].astype("Int64")
    return df


def trial_numbers(store: Store, search: str) -> dict[str, int]:
    """Tune trial id -> the number of its trial in the search's Optuna study (the numbering the live table, the
    report and optuna-dashboard share); {} where the store holds no such study."""
    import optuna
    from optuna.storages import RDBStorage
    try:
        storage = RDBStorage(store.url, skip_compatibility_check=True, skip_table_creation=True,
                             engine_kwargs=Store.engine_kwargs(store.url))
        trials = optuna.load_study(study_name=search, storage=storage).get_trials(deepcopy=False)
    except Exception:  # noqa: BLE001 - no study (a benchmark grid, an import), or another schema: no numbers
        return {}
    return {t.user_attrs["tune_trial_id"]: t.number for t in trials if "tune_trial_id" in t.user_attrs}


def placement(rec) -> str | None:
    """Where a measurement's ranks ran: "1 node", or "2 nodes (2+2)" for one split over nodes (None: not known)."""
    p = (rec.placement if rec else None) or {}
    if not p.get("nodes"):
        return None
    return "1 node" if p["nodes"] == 1 else f"{p['nodes']} nodes ({'+'.join(map(str, p['ranks_per_node']))})"


def _samples(rec, others: list | None) -> dict:
    """How many measurements a key has (its record and the other samples) and the spread of their ok tokens/s,
    (max - min) / the record's (None with fewer than two)."""
    if rec is None:
        return {"samples": None, "tokens_per_s_spread": None, "placement": None}
    ok = [v for st, v in [(str(rec.status), rec.measured.tokens_per_s), *(others or [])] if st == Status.OK and v]
    spread = (max(ok) - min(ok)) / ok[0] if len(ok) > 1 else None
    return {"samples": 1 + len(others or []), "tokens_per_s_spread": spread, "placement": placement(rec)}


def _row(rec, knobs: list[str], *, search, trial, status, cached, error, key, created_at, config,
         verified: dict | None = None, number=None) -> dict:
    """One row of load(): a trial's (or a measurement's) identity and outcome, its knobs, its record's metrics and,
    for an ok one, its quality status (trial/quality.py: same, passed, verified, failed or unverified)."""
    from trainscout.trial.quality import status as quality_status
    m, hw = (rec.m if rec else {}), ((rec.hardware if rec else None) or {})
    row = {"search": search, "trial": trial, "number": number, "status": status, "cached": cached, "error": error,
           "model": rec.model if rec else None, "device": rec.device if rec else None,
           "world_size": rec.world_size if rec else None, "gpu": hw.get("gpu"), "key": key, "created_at": created_at,
           "origin": rec.source if rec else None}  # local, imported:FILE or contributed:FILE (store/contrib.py)
    row.update({k: config.get(k) for k in knobs})
    row.update({k: (m.get(k) if status == Status.OK else None) for k in METRICS})
    row["quality"] = quality_status(m, verified, rec.config, rec.device)[0] if status == Status.OK and rec else None
    # other trials shared its CPU or GPU while it was measured: kept apart (trial.contention), e.g. "4 trials (cpu)"
    row["shared"] = contention.label(m) if status == Status.OK else None
    return row


def measured_by(store: Store, trials: list[dict]) -> list[Record]:
    """The records a search's trials measured (ok, not served from the store): each trial's own among its key's
    samples (store.samples), the one whose tokens/s is the trial row's."""
    out = []
    for t in trials:
        if t["status"] == Status.OK and t["key"] and not t["cached"] and t[TOKENS_PER_S]:
            out += [r for r in store.samples(t["key"]) if r.ok and r.measured.tokens_per_s == t[TOKENS_PER_S]][:1]
    return out


def shared_line(store: Store, trials: list[dict]) -> str | None:
    """The line saying how many of a search's measurements ran beside other trials on the node (None: none did)."""
    return contention.note(measured_by(store, trials))


def measurement(source: str, key: str | None = None, best: bool = False) -> Record:
    """One stored record: by key (a prefix is enough), or the best ok one (the fastest, or the simplest of those
    within its measured noise: analysis.ties)."""
    store = store_of(source) if isinstance(source, str) else source
    if best:
        choice = best_choice(store)
        if choice is None:
            raise ConfigError("--best", "no successful measurement in this store: run a search first")
        return choice.best
    hits = [m for m in store.measurements() if key and m.key.startswith(key)]
    if len(hits) != 1:
        raise ConfigError("--trial", f"--trial {key}: {'no' if not hits else 'more than one'} measurement matches: "
                                     "give a longer key (see `trainscout results --format csv`) or --best")
    if not hits[0].ok:
        raise ConfigError("--trial", f"--trial {key} ended {hits[0].status}: export a measurement that ran")
    return hits[0]


def ran_config(rec: Record) -> dict:
    """The record's configuration with the values it ran (Search.measured: a probed micro-batch, the one the probe
    settled on, not another probe)."""
    knobs = {k.name: k for k in all_knobs()}
    return {k: knobs[k].search.measured(v, rec.plan) if k in knobs else v for k, v in rec.config.items()}


def best_choice(source):
    """analysis.ties.choose over a store's measurements: the best, the fastest, and the tie between them."""
    from .ties import choose
    store = store_of(source) if isinstance(source, str) else source
    return choose(store.measurements(), store.verified())


MISSING = "-"  # a value not known or not measured, as every table prints it (analysis/report/formatting.py too)


def as_text(df: pd.DataFrame, float_format=lambda v: f"{v:,.3f}") -> pd.DataFrame:
    """The table as a terminal shows it: every value text, a missing one "-" (pandas' to_string printed <NA> for a
    missing whole number and NaN for a missing float, whatever its na_rep said), floats by float_format."""
    def cell(v) -> str:
        if v is None or (pd.api.types.is_scalar(v) and bool(pd.isna(v))):
            return MISSING
        if isinstance(v, float):
            return float_format(v)
        return str(v)
    return pd.DataFrame({c: [cell(v) for v in df[c].tolist()] for c in df.columns}, index=df.index)


def fit_table(df: pd.DataFrame, width: int | None, free: tuple[str, ...] = ("error",)) -> str:
    """A text table (as_text's cells) within width: the free-text columns (the reason) cut with "…" first, then
    whole columns left out from the right, named in a last line; width None: every column whole."""
    text = as_text(df)
    render = lambda t: t.to_string(index=False)  # noqa: E731
    out = render(text)
    if width is None or max(map(len, out.splitlines())) <= width:
        return out
    for col in (c for c in free if c in text.columns):
        over = max(map(len, out.splitlines())) - width
        keep = max(10, int(text[col].str.len().max()) - over)
        text[col] = [v if len(v) <= keep else v[:keep - 1] + "…" for v in text[col]]
        out = render(text)
    dropped = []
    while max(map(len, out.splitlines())) > width and len(text.columns) > 1:
        dropped.insert(0, text.columns[-1])
        text = text[text.columns[:-1]]
        out = render(text)
    if dropped:
        import textwrap
        note = (f"({len(dropped)} more column{'s' if len(dropped) != 1 else ''} not shown at this width: "
                f"{', '.join(dropped)}; all with --format csv or json, or to a pipe)")
        out += "\n" + "\n".join(textwrap.wrap(note, width, break_on_hyphens=False))
    return out


def dumps(df: pd.DataFrame) -> str:
    """A table as a JSON list of rows, one object a row (missing values as null), as `results --format json` prints."""
    return json.dumps(json.loads(df.to_json(orient="records")), indent=1)


def load_resolved(source) -> pd.DataFrame:
    """What users see: load()'s rows, one per trial in the order the search recorded them, then one per measurement
    no search ran (a benchmark grid, a `results --import`) by start time;
    with what each one actually ran: micro_batch (the record's plan, not "max"), grad_accum, wall_s, and gpu_s
    (wall_s x world_size: GPU-seconds, worker-seconds on a CPU; 0 for a trial served from the store or refused before
    running). A trial ASHA stopped leaves no record: its gpu_s is the median of its search's trials that ran to the
    end (ok, measured here), flagged gpu_s_estimated."""
    store = store_of(source) if isinstance(source, str) else source
    records = {m.key: m for m in store.measurements()}
    df = load(store)
    mbs, accum, wall, gpu_s, estimated = [], [], [], [], []
    from trainscout.spaces import micro_batch
    knob = micro_batch().name
    for r in df.to_dict("records"):
        rec = records.get(r["key"]) if isinstance(r["key"], str) else None
        # no record: only a trial ASHA stopped ran, with its knob's value (unless max/auto, resolved in the run)
        plan_mbs = rec.micro_batch if rec else r.get(knob) if r["status"] == Status.STOPPED else None
        mbs.append(plan_mbs if isinstance(plan_mbs, int) and not isinstance(plan_mbs, bool) else None)
        accum.append(rec.grad_accum if rec else None)
        wall.append(rec.wall_s if rec else None)
        if r["cached"] or r["status"] in (Status.INVALID, Status.PRUNED):
            gpu_s.append(0.0)  # nothing ran for this trial
        elif rec and rec.wall_s is not None:
            gpu_s.append(float(rec.wall_s) * (rec.world_size or 1))
        else:
            gpu_s.append(None)
        estimated.append(False)
    df = df.assign(micro_batch=pd.array(mbs, dtype="Int64"), grad_accum=pd.array(accum, dtype="Int64"),
                   wall_s=pd.array(wall, dtype="Float64").astype(float),
                   gpu_s=pd.array(gpu_s, dtype="Float64").astype(float), gpu_s_estimated=estimated)
    # a crash can end at any point; a stopped trial ran like the ok ones until ASHA ended it
    measured = df[~df["cached"] & (df["status"] == Status.OK) & df["key"].map(lambda k: k in records)
                  & df["gpu_s"].notna()]
    for i in df.index[(df["status"] == Status.STOPPED) & ~df["cached"] & df["gpu_s"].isna()]:
        same = measured[measured["search"] == df.at[i, "search"]]["gpu_s"]
        if len(same):
            df.at[i, "gpu_s"], df.at[i, "gpu_s_estimated"] = float(same.median()), True
    return df.reset_index(drop=True)
