"""`trainscout lookup`: what the atlas knows about training a model on a GPU kind, without a GPU.

Measured first: the best measured configurations of the model (by name, or a config.json of the same shape) on that
GPU kind and count, at the recipe's global batch (the model's own unless --global-batch), repeats of one
configuration as their median, each with tokens/s, MFU (recomputed, trainscout.trial.mfu), peak memory, the days of
its recipe and the rent (analysis/prices.json), its labels and its provenance. Where nothing was measured there: a
prediction (atlas/predict.py), labelled as such, with its leave-one-out error over the shipped rows, and the
`trainscout search` command that would measure it. The shipped set is answered from its files alone (no torch, no
model built: well under a second); a model never measured builds its candidates (seconds).
"""
from __future__ import annotations

import json
import os
import re

from trainscout.spaces import ConfigError
from trainscout.trial.contention import contended
from trainscout.trial.gpus import gpu_kind
from trainscout.trial.quality import status as quality_status
from trainscout.trial.records import TOKENS_PER_S

from . import families, predict, samples
from .loo import loo_summary

TOP = 5  # measured configurations shown per GPU kind and count


def parse_budget(text: str | None) -> dict | None:
    """--budget: days (30d, 2w, 720h) or dollars ($5000, 5000$, $5k, 5000usd) -> {"days": x} or {"usd": x}."""
    if text is None:
        return None
    t = text.strip().lower().replace(",", "").replace(" ", "")
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(d|w|h)", t)
    if m:
        v = float(m[1]) * {"d": 1, "w": 7, "h": 1 / 24}[m[2]]
        if v > 0:
            return {"days": v}
    m = re.fullmatch(r"\$?(\d+(?:\.\d+)?)(k|m)?(\$|usd)?", t)
    if m and (t.startswith("$") or m[3]):
        v = float(m[1]) * {None: 1, "k": 1e3, "m": 1e6}[m[2]]
        if v > 0:
            return {"usd": v}
    raise ConfigError("--budget", f"--budget {text} is not a budget: give days (30d, 2w, 720h) or dollars "
                                  "($5000, $5k)")


# --- which rows are the model -------------------------------------------------------------------------------------
ESSENTIAL = ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")


def target_of(model: str) -> dict:
    """The model asked about: {"name", "config" (the transformers config dict, or the config.json as written),
    "path"}. A built-in name's config comes from code, a config.json is read as JSON (no transformers needed)."""
    import json

    from trainscout.store.row_format import model_name
    from trainscout.trial.models import PYTHIA, gpt_neox, model_names
    if model in PYTHIA:
        return {"name": model, "config": gpt_neox(*PYTHIA[model]), "path": None}
    if model in model_names():
        return {"name": model, "config": None, "path": None}
    if not (model.endswith(".json") or os.sep in model):
        raise ConfigError("--model", f"unknown model {model!r}: use one of {', '.join(model_names())} or the path "
                                     "of a config.json")
    try:
        with open(model, encoding="utf-8") as f:
            cfg = json.load(f)
    except (OSError, ValueError) as e:
        raise ConfigError("--model", f"cannot read {model}: {type(e).__name__}: {str(e).splitlines()[0][:120]}; "
                                     "give a readable config.json")
    if not isinstance(cfg, dict) or "model_type" not in cfg:
        raise ConfigError("--model", f"{model} has no \"model_type\": give a transformers config.json")
    return {"name": model_name(model), "config": cfg, "path": model}


def same_model(target: dict, record: dict) -> bool:
    """Whether a row's model is the target: the same built-in name, or the same shape (every size the target's
    config gives equals the row's; a key it leaves out is the row's default, key/value heads = heads)."""
    cfg, mc = target["config"], record.get("model_config") or {}
    if target["path"] is None:
        return record.get("model") == target["name"]
    if not mc or any(k not in cfg or cfg[k] != mc.get(k) for k in ESSENTIAL):
        return False
    for k, v in cfg.items():
        if k in samples.SHAPE_KEYS and k in mc and mc[k] != v:
            return False
    kv = cfg.get("num_key_value_heads", cfg.get("num_attention_heads"))
    return mc.get("num_key_value_heads", mc.get("num_attention_heads")) == kv


# --- the answer -------------------------------------------------------------------------------------------------
def price_table():
    """The rental and purchase prices (analysis/prices.json) the answer's costs are computed with."""
    from trainscout.analysis.cost import load_prices
    return load_prices()


def _money(days: float | None, gpus: int, gpu: str | None, prices) -> dict:
    from trainscout.analysis.cost import price_for
    p = price_for(gpu, prices)
    if p is None or days is None:
        return {"rent_usd": None, "box_usd": None, "price": None}
    return {"rent_usd": p.rent_usd(days, gpus), "box_usd": p.box_usd(gpus), "price": p.name}


def measured(atlas, target: dict, gpu: str | None, gpus: int | None, global_batch: int | None, prices,
             top: int = TOP) -> dict:
    """The measured answer: {"groups": [{"gpu", "gpus", "global_batch", "rows": [...], "oom": [...]}],
    "notes": [...]}."""
    from trainscout.trial.models import PYTHIA_RECIPE
    mine = [r for r in atlas.rows if same_model(target, r["record"])]
    if gpu:  # a kind's rows, or a GPU that is no kind by its exact name (asked_gpu): never another GPU's
        want = (gpu_kind(gpu) or gpu).lower()
        mine = [r for r in mine if str(_row_kind(r)).lower() == want]
    if gpus:
        mine = [r for r in mine if (r["record"].get("world_size") or 1) == gpus]
    notes = []
    want = global_batch or PYTHIA_RECIPE.global_batch
    at = [r for r in mine if r["record"]["recipe"]["global_batch"] == want]
    if not at and mine and not global_batch:
        batches = sorted({r["record"]["recipe"]["global_batch"] for r in mine})
        notes.append(f"nothing measured at the recipe's global batch {want:,}: the rows below ran at "
                     f"{', '.join(f'{b:,}' for b in batches)} sequences per step (tokens/s depends on it)")
        at = mine
    groups = {}
    for r in at:
        rec = r["record"]
        g = (_row_kind(r), rec.get("world_size") or 1, rec["recipe"]["global_batch"])
        groups.setdefault(g, []).append(r)
    out = []
    for (kind_, n, batch), rows in sorted(groups.items(), key=lambda kv: (str(kv[0][0]), kv[0][1], kv[0][2])):
        ok, oom = _group_rows(rows, kind_, n, batch, want, prices)
        ok, tie = _ranked(ok)
        if tie:
            notes.append(f"{kind_} x {n}: {tie}")
        mine_first = next((i for i, r in enumerate(ok) if "contributed" not in r["origins"]), None)
        if mine_first:  # contributed rows above the first measured here or shipped: said, never silent
            notes.append(f"{kind_} x {n}: {mine_first} contributed row(s) rank above the best measured here or "
                         "shipped: their provenance names who measured them ([contributed])")
        out.append({"gpu": kind_, "gpus": n, "global_batch": batch, "rows": ok[:top], "more": max(0, len(ok) - top),
                    "oom": oom})
    return {"groups": out, "notes": notes}


def _group_rows(rows: list[dict], kind_: str | None, n: int, batch: int, want: int, prices) -> tuple[list, list]:
    """(ok, oom) of one GPU kind, count and batch: one row per configuration, its repeats (several boxes or leases)
    as their median; a configuration never ok, out of memory."""
    by_key: dict[str, list[dict]] = {}  # one configuration, measured on several boxes or leases: its repeats
    for r in rows:
        rec = r["record"]
        same = json.dumps([rec["config"], rec["recipe"].get("seq_len"), rec["recipe"].get("total_steps")],
                          sort_keys=True)
        by_key.setdefault(same, []).append(r)
    ok, oom = [], []
    for reps in by_key.values():
        oks = [r for r in reps if r["record"]["status"] == "ok"]
        if not oks:
            oom.append({"key": reps[0]["key"], "describe": families.describe(reps[0]["record"]["config"],
                                                                             families.plan_of(reps[0]["record"])),
                        "provenance": reps[0]["provenance"]})
            continue
        ok.append(_measured_row(oks, kind_, n, batch, want, prices))
    return ok, oom


def _measured_row(oks: list[dict], kind_: str | None, n: int, batch: int, want: int, prices) -> dict:
    """A configuration's measured row from its ok repeats: the median tokens/s and the repeat nearest it, the days and
    rent of the recipe asked for (want sequences a step), its labels, quality and provenance."""
    from trainscout.trial.metrics import median
    from trainscout.trial.models import PYTHIA_RECIPE
    # measurements other trials shared the CPU or GPU of (trial.contention): only where no clean one is
    clean = [r for r in oks if not contended(r["record"])]
    shared, oks = not clean, clean or oks
    tps = median([r["record"]["metrics"][TOKENS_PER_S] for r in oks])
    best = min(oks, key=lambda r: abs(r["record"]["metrics"][TOKENS_PER_S] - tps))
    rec, m = best["record"], best["record"]["metrics"]
    step = rec["recipe"]["global_batch"] * rec["recipe"]["seq_len"] / tps
    tokens = rec["recipe"]["total_steps"] * rec["recipe"]["global_batch"] * rec["recipe"]["seq_len"]
    describe = families.describe(rec["config"], families.plan_of(rec))
    if batch != want:  # measured at another batch (a bench's): the days of the recipe asked for, said so
        tokens = PYTHIA_RECIPE.total_steps * want * rec["recipe"]["seq_len"]
        describe += f" [measured at {batch:,} sequences per step]"
    days = tokens / tps / 86400
    mfus = [samples.row_mfu(r) for r in oks]
    mfus = [x for x in mfus if x is not None]
    row = {"status": "measured", "key": best["key"], "gpu": kind_, "gpu_name": best["provenance"].get("gpu"),
           "gpus": n,
           "global_batch": batch, TOKENS_PER_S: tps, "repeats": [r["record"]["metrics"][TOKENS_PER_S]
                                                                  for r in oks],
           "mfu": median(mfus) if mfus else None,
           "mfu_convention": (best.get("derived") or {}).get("mfu_convention"),
           "peak_memory_gib": m.get("peak_memory_gib"), "step_s": step, "projected_days": days,
           "train_tokens": tokens, "config": rec["config"], "describe": describe,
           "labels": sorted({lb["name"] for r in oks for lb in r.get("labels") or []}),
           "label_why": sorted({lb["why"] for r in oks for lb in r.get("labels") or []}),
           "verified": best.get("verified"), "provenance": best["provenance"],
           "quality": quality_status(m, None, rec["config"], rec.get("device")),
           "failed_settings": gate_failed_settings(m, rec["config"]),
           "origins": sorted({r["provenance"].get("origin") for r in oks}), "shared": shared}
    row.update(_money(days, n, row["gpu"], prices))
    row["_record"] = dict(rec, key=best["key"], metrics=dict(m, tokens_per_s=tps))
    return row


def _ranked(rows: list[dict]) -> tuple[list[dict], str]:
    """The group's rows in the order a user acts on: first the best `trainscout export --best` would write
    (analysis.ties.choose: the fastest, or the simplest within its measured noise), over the rows whose quality
    verdict did not fail; then the others by tokens/s. (rows, the tie's sentence or "")."""
    from trainscout.analysis.ties import choose
    from trainscout.trial.quality import FAILED
    from trainscout.trial.records import Record
    rows = sorted(rows, key=lambda r: -r[TOKENS_PER_S])
    for r in rows:
        r["best"] = False
    fit = [r for r in rows if r["quality"][0] != FAILED]
    try:
        recs = {id(r): Record.from_dict({k: v for k, v in r["_record"].items() if k != "source"}) for r in fit}
        choice = choose(list(recs.values()))
    except Exception:  # noqa: BLE001 - a record the rule cannot judge: the fastest that did not fail
        choice = None
    for r in rows:
        r.pop("_record", None)
    if choice is None:
        if fit:
            fit[0]["best"] = True
            rows.remove(fit[0])
            rows.insert(0, fit[0])
        return rows, ""
    best = next(r for r in fit if recs[id(r)] is choice.best)
    best["best"] = True
    rows.remove(best)
    failed_first = bool(rows) and rows[0]["quality"][0] == FAILED and rows[0][TOKENS_PER_S] > best[TOKENS_PER_S]
    tie = choice.line() if choice.is_tie else ""
    if failed_first:
        tie = (tie + "; " if tie else "") + "a faster configuration failed its quality verdict and is not the best"
    return [best, *rows], tie


def search_command(target: dict, gpus: int, global_batch: int | None) -> str:
    """The search that would measure it (its time budget: what the shipped searches took at most, docs/atlas.md)."""
    model = target["path"] or target["name"]
    model = f"'{model}'" if re.search(r"[^\w./-]", model) else model
    parts = [f"trainscout search --model {model}"]
    if gpus != 1:
        parts.append(f"--gpus-per-trial {gpus}")
    if global_batch:
        parts.append(f"--global-batch {global_batch}")
    parts.append(f"--time-budget 30m --out runs/{target['name']}")
    return " ".join(parts)


def predicted(atlas, target: dict, gpu: str, gpus: int, global_batch: int | None, prices,
              gpu_memory_gib: float | None = None, host_memory_gib: float | None = None,
              avoid: list[dict] | None = None) -> dict:
    """The predicted answer for a model or GPU kind not measured: rows labelled predicted, their leave-one-out
    error (the shipped rows, each predicted with its own model held out), the search command. Every row is one
    `trainscout search` would run on that box: it fits the GPU by the memory model and the host (host_memory_gib,
    default predict.HOST_GIB_PER_GPU per GPU) by the rule the search prunes its trials by. avoid: settings whose
    quality gate failed on this model (measured), which no row holds all of (said in its notes)."""
    kind = gpu_kind(gpu) or gpu
    model = atlas.model
    cached = model.get("predictions", {}).get(f"{target['name']}|{kind}|{gpus}")
    if cached and not atlas.extra and target["path"] is None and not global_batch and gpu_memory_gib is None \
            and host_memory_gib is None and not avoid:
        got = dict(cached, source="precomputed from the shipped rows by bench/build_atlas.py (atlas/model.json)")
    else:
        pool = samples.samples(atlas.rows, row_features(atlas))
        got = dict(predict.predict_model(target["path"] or target["name"], gpu, gpus, pool, global_batch,
                                         gpu_memory_gib, host_memory_gib, avoid),
                   source="computed now from the atlas's rows")
    loo = model["loo"]["model"]
    fam = families.arch_family(target["config"]) if target["config"] else None
    rows = []
    for r in got["rows"]:
        # the error quoted is the calibrating rows' own: each of them predicted with its model held out
        err = loo_summary(loo, ids=r.get("calibrated_ids") or ())
        gpu_of = (r.get("calibrated_gpus") or [kind])[0]
        fams = r.get("calibrated_families") or [fam]
        over = loo_summary(loo, gpu=gpu_of, family=fams[0] if len(fams) == 1 else None)
        if not err[TOKENS_PER_S]["n"]:
            err = over
        row = dict(r, status="predicted", error=err, error_all=over, error_scope=f"{gpu_of} "
                   f"{' and '.join(fams)}", gpu=f"{kind}", train_tokens=r["total_steps"] * r["tokens_per_step"])
        row.update(_money(r["projected_days"], r["gpus"], kind, prices))
        rows.append(row)
    measured_kinds = {s_kind for s_kind in (gpu_kind(x["provenance"].get("gpu")) for x in atlas.rows)}
    notes = list(got["notes"])
    if avoid:
        what = "; ".join(sorted({" ".join(f"{k}={v}" for k, v in sorted(f.items())) for f in avoid}))
        notes.append(f"no predicted row holds {what}: its quality gate failed on this model (measured above)")
    if kind not in measured_kinds:
        notes.append(f"no {kind} row in the atlas: the error below is the {', '.join(sorted(map(str, measured_kinds)))}"
                     " rows' and does not cover a GPU kind never measured")
    return {"rows": rows, "notes": notes, "n_params": got.get("n_params"), "source": got["source"],
            "search_command": search_command(target, got.get("gpus") or gpus, global_batch)}


def row_features(atlas) -> dict:
    """Features of every ok row: the shipped ones from model.json, a user layer's computed here (the model on the
    meta device, once per model config)."""
    from trainscout.trial.records import Record
    feats = dict(atlas.model.get("features", {}))
    for r in atlas.rows:
        rid = samples.row_id(r)
        if rid not in feats and r["record"].get("status") == "ok" and r["record"].get("device") == "cuda":
            try:
                feats[rid] = samples.features(Record.from_dict(r["record"]))
            except (ConfigError, ValueError, KeyError, TypeError):
                continue  # a model this trainscout cannot build: its row stays measured-only
    return feats


def _row_kind(row: dict) -> str | None:
    """The GPU kind a row was measured on (trial.gpus: exact identity), or its GPU's own name where that is no kind."""
    return gpu_kind(row["provenance"].get("gpu")) or row["provenance"].get("gpu")


def asked_gpu(atlas, gpu: str) -> str:
    """--gpu as the kind it names (trial.gpus.asked_kind), or the exact name of a GPU measured in the atlas that is
    no kind; ConfigError naming --gpu and the known kinds for anything else."""
    from trainscout.trial import gpus
    others = tuple(sorted({str(_row_kind(r)) for r in atlas.rows if not gpu_kind(r["provenance"].get("gpu"))
                           and r["provenance"].get("gpu")}))
    return gpus.asked_kind(gpu, "--gpu", others)


def _known_gpu(gpu: str) -> None:
    """Refuse (ConfigError on --gpu) a prediction for a GPU that is no kind with datasheet figures here (a GPU
    measured in a --db store by its own name): the roofline would take another GPU's peak and bandwidth for it."""
    from trainscout.trial import gpus
    if gpus.kind_of(gpu) is None:
        raise ConfigError("--gpu", f"--gpu {gpu}: its measurements do not answer this, and its peak TFLOP/s and memory "
                                   "bandwidth are not known here (a prediction would use another GPU's): give a known "
                                   f"kind ({gpus.known_kinds()}) or --db with its measurements")


def lookup(atlas, model: str, gpu: str | None = None, gpus: int | None = None, global_batch: int | None = None,
           budget: str | None = None, gpu_memory_gib: float | None = None, top: int = TOP,
           host_memory_gib: float | None = None) -> dict:
    """The whole answer for one model (JSON-ready): measured groups, else (for the asked GPU kind and count) the
    prediction (on a box of host_memory_gib, default predict.HOST_GIB_PER_GPU per GPU), the budget's verdict,
    notes."""
    target = target_of(model)
    prices = price_table()
    want = parse_budget(budget)
    asked = gpu
    gpu = asked_gpu(atlas, gpu) if gpu else None
    got = measured(atlas, target, gpu, gpus, global_batch, prices, top)
    out = {"model": target["name"], "path": target["path"], "gpu": asked, "gpus": gpus, "global_batch": global_batch,
           "measured": got["groups"], "notes": got["notes"], "predicted": None,
           "atlas": {"layers": [{"name": layer.name, "kind": layer.kind, "rows": len(layer.rows),
                                 "refused": len(layer.refused)} for layer in atlas.layers]}}
    # a measured row is an answer where one is the best (a failed quality verdict never is) at the global batch
    # asked (a bench's few sequences per step do not answer the recipe's batch): else a prediction too, without the
    # settings that failed on this model
    from trainscout.trial.models import PYTHIA_RECIPE
    batch = global_batch or PYTHIA_RECIPE.global_batch
    if not any(r.get("best") and g["global_batch"] == batch for g in got["groups"] for r in g["rows"]):
        kind = gpu or _default_kind(atlas, out["notes"])
        _known_gpu(kind)
        # a quality verdict is the model's numerics, on any GPU kind: what failed on one is avoided on all
        anywhere = got if gpu is None else measured(atlas, target, None, gpus, global_batch, prices, top)
        failed = [r["failed_settings"] for g in anywhere["groups"] for r in g["rows"] if r.get("failed_settings")]
        out["predicted"] = predicted(atlas, target, kind, gpus or 1, global_batch, prices, gpu_memory_gib,
                                     host_memory_gib, avoid=failed)
    if want:
        out["budget"] = verdict(out, want)
    return out


def gate_failed_settings(m: dict, config: dict) -> dict | None:
    """The settings whose numerics change failed this measurement's quality gate ({knob: value}), None where it
    did not fail."""
    from trainscout.trial.quality import failed_settings
    return failed_settings(m.get("quality"), config)


def _default_kind(atlas, notes: list) -> str:
    """The GPU kind a prediction is for without --gpu: this machine's GPU where it has one (a user on an H100 asked
    about it: the answer was an H200's), else the kind the atlas measured most; notes says which and why."""
    kinds = [gpu_kind(r["provenance"].get("gpu")) for r in atlas.rows]
    most = max(set(kinds) - {None}, key=kinds.count) if set(kinds) - {None} else "H200"
    local = _local_gpu()
    if local and gpu_kind(local):
        notes.append(f"predicted for this machine's GPU ({local}): --gpu KIND for another")
        return gpu_kind(local)
    notes.append(f"predicted for the {most}, the GPU kind the atlas measured most"
                 + (f" (this machine's {local} is not a kind it knows)" if local else "") + ": --gpu KIND for another")
    return most


def _local_gpu() -> str | None:
    """The name of this machine's first CUDA GPU (None: none)."""
    import torch
    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None


def verdict(answer: dict, want: dict) -> dict:
    """What a budget buys: the fastest row within it, or the share of the run the fastest row's pace gets done."""
    rows = [r for g in answer["measured"] for r in g["rows"]] + ((answer["predicted"] or {}).get("rows") or [])
    if not rows:
        return {"budget": want, "within": None, "text": "nothing to price: no measured or predicted row"}
    what = "days" if "days" in want else "usd"

    def cost(r):
        return r["projected_days"] if what == "days" else r.get("rent_usd")
    priced = [r for r in rows if cost(r) is not None]
    within = [r for r in priced if cost(r) <= want[what]]
    limit = f"{want['days']:g} days" if what == "days" else f"${want['usd']:,.0f}"
    if within:
        best = max(within, key=lambda r: r[TOKENS_PER_S])
        text = (f"within {limit}: {best['describe']} on {best['gpus']} x {best['gpu']} ({best['status']}), "
                f"{best['projected_days']:.1f} days"
                + (f", ${best['rent_usd']:,.0f} rent" if best.get("rent_usd") is not None else ""))
        return {"budget": want, "within": best.get("key") or best["describe"], "text": text}
    if not priced:
        return {"budget": want, "within": None, "text": f"no price known for this GPU: {limit} cannot be judged"}
    best = min(priced, key=cost)
    share = want[what] / cost(best)
    tokens = share * best["train_tokens"]
    return {"budget": want, "within": None, "share_of_run": share,
            "text": f"no configuration finishes within {limit}: the cheapest ({best['describe']} on {best['gpus']} x "
                    f"{best['gpu']}, {best['status']}) "
                    f"needs {best['projected_days']:.1f} days" + (f", ${best['rent_usd']:,.0f}" if best.get(
                        "rent_usd") is not None else "") + f"; {limit} buys {tokens / 1e9:,.1f} B of its "
                    f"{best['train_tokens'] / 1e9:,.1f} B tokens ({share:.0%})"}
