"""The seed paper's question for every Pythia size on this box (issue 18): can it be trained here, with which
settings, in how many days and dollars. One store for all models, smallest first, so each search starts from what
the smaller ones found (search.service.store_points), then `verify` of each best in full optimizer steps.

Per model: the memory model decides what fits (search.service.fits: the defaults, else the cheapest memory saver
of the space that fits the GPU and the host); where nothing fits on one GPU it says what would (the fewest GPUs
with FSDP full_shard + full checkpointing, the host memory ZeRO offload would need) and no GPU time is spent.
Otherwise a search of a fixed number of trials (--trials), then verify of its best: full optimizer steps (every
micro-batch), at a global batch cut so a step takes about --verify-step-s where the recipe's step is longer; the
ratio compares with the measurement's own projection at that batch (analysis.verify, --global-batch).

    python bench/seed_table.py --out runs/seed-table                        # every size, on this GPU
    python bench/seed_table.py --out runs/seed-table --models pythia-2.8b,pythia-6.9b   # more rows, same store
    python bench/seed_table.py --out /tmp/st --device cpu --models tiny --trials 3       # the CPU smoke run

Writes OUT/results.db (every trial), OUT/<model>/ (each search's folder), OUT/verify-*.json, OUT/seed_table.jsonl (one
row per model, appended as each finishes: a later call with the same --out skips the models it holds) and
OUT/seed_table.md (the table, rewritten from the jsonl after each model).
"""
from __future__ import annotations

import argparse
import io
import json
import math
import os
import sys
import time

from trainscout.cli.flags import EXIT_BAD_INPUT
from trainscout.spaces import ConfigError, all_knobs, fmt

SIZES = ("pythia-160m", "pythia-410m", "pythia-1b", "pythia-1.4b", "pythia-2.8b", "pythia-6.9b", "pythia-12b")
# trials of each model's search (a count, not a time budget: Tune's time budget kills the trial in flight, whose GPU
# time is then lost); larger models' trials cost more, and ASHA stops the slow ones early
TRIALS = {"pythia-160m": 6, "pythia-410m": 6, "pythia-1b": 5, "pythia-1.4b": 5, "pythia-2.8b": 4,
          "pythia-6.9b": 3, "pythia-12b": 3}
PAPER = {  # the seed paper's own claims (arXiv 2410.23261), where it makes one for a Pythia size
    "pythia-1b": {"claim": "4 x A100 in 18 days (abstract; 17.6 in its README's example)", "gpus": 4,
                  "tflops": 312.0, "days": 18.0},
}


def parse_trials(text: str | None) -> dict[str, int]:
    """'4' (every model) or 'pythia-160m=6,pythia-6.9b=3' -> {model: trials} over TRIALS ("*": any other model)."""
    out = dict(TRIALS, **{"*": 4})
    for part in (text or "").split(",") if text else ():
        name, _, val = part.rpartition("=")
        if not val.strip().isdigit() or int(val) < 1:
            raise ConfigError("--trials", f"--trials {part}: give a positive count, e.g. 4 or pythia-6.9b=3")
        if name:
            out[name.strip()] = int(val)
        else:
            out = {k: int(val) for k in out}
    return out


def not_fitting(model: str, hw: dict, host: float, calibration: dict | None) -> dict:
    """What the memory model says of a model that fits no single GPU here (GiB): the defaults and full checkpointing
    at micro-batch 1, ZeRO offload (GPU and host), and the fewest GPUs of this kind that would hold it with FSDP
    full_shard and full checkpointing."""
    from trainscout.search.service import FIT_SHARE
    from trainscout.predictor import memory
    from trainscout.trial import prepare

    def gib(x: float) -> float:
        return round(x / memory.GiB, 1)

    def at(settings: dict, k: int = 1):
        return prepare(model, dict(settings, micro_batch_size=1), workers=k, hw=dict(hw, gpu_count=max(k, 1)))
    out = {"host_gib": gib(host), "gpu_gib": hw["gpu_memory_gib"], "share": FIT_SHARE,
           "defaults_gib": gib(memory.predict(at({}), calibration)),
           "checkpointed_gib": gib(memory.predict(at({"activation_checkpointing": "full"}), calibration))}
    for name, settings in (("zero2_offload", {"zero_stage": 2, "offload_optimizer": True}),
                           ("zero3_offload", {"zero_stage": 3, "offload_optimizer": True, "offload_params": True})):
        spec = at(dict(settings, activation_checkpointing="full"))
        comp = memory.host_peak(spec)
        out[name] = {"gpu_gib": gib(memory.predict(spec, calibration)),
                     "host_gib": gib(memory.host_need(comp))}
    for k in (2, 4, 8, 16, 32):
        need = memory.predict(at({"fsdp": "full_shard", "activation_checkpointing": "full"}, k), calibration)
        if need <= FIT_SHARE * hw["gpu_memory_gib"] * memory.GiB:
            out.update(gpus=k, per_gpu_gib=gib(need))
            break
    return out


def short_why(w: dict, gpu: str) -> str:
    """not_fitting's verdict in one table cell."""
    z2, z3 = w["zero2_offload"], w["zero3_offload"]
    return (f"no: {w['defaults_gib']:.0f} GiB at micro-batch 1, {w['checkpointed_gib']:.0f} with full checkpointing "
            f"(> {w['share']:.0%} of {w['gpu_gib']:.0f}); ZeRO-2 / ZeRO-3 offload would fit the GPU "
            f"({z2['gpu_gib']:.0f} / {z3['gpu_gib']:.0f} GiB) but need {z2['host_gib']:.0f} / {z3['host_gib']:.0f} GiB "
            f"of host memory ({w['host_gib']:.0f} here). Fits {w.get('gpus', '> 32')} x {gpu} with fsdp=full_shard + "
            f"full checkpointing ({w.get('per_gpu_gib', '?')} GiB per GPU predicted)")


def verify_batch(rec, step_s: float) -> int | None:
    """The global batch whose full step takes about step_s at the measured micro-batch time (None: the recipe's)."""
    per_step = rec.recipe["global_batch"] // rec.grad_accum
    accum = max(2, math.ceil(step_s / max(rec.m["micro_batch_s"], 1e-9)))
    return None if accum >= rec.grad_accum else per_step * accum


def non_default(config: dict) -> str:
    """The knobs a best configuration sets away from their defaults, as the user writes them."""
    defaults = {k.name: k.default for k in all_knobs()}
    return " ".join(f"{k}={fmt(v)}" for k, v in sorted(config.items())
                    if k in defaults and v != defaults[k] and k != "micro_batch_size") or "defaults"


def row_of(model: str, store, search_log: str, wall: float, verify_out: dict | None) -> dict:
    """One table row from the store: the search's best, its costs, the memory model's error on its trials."""
    from trainscout.analysis.cost import load_prices, price_for
    from trainscout.predictor import memory
    trials = store.trials(model)
    recs = [r for r in store.measurements() if r.model == model]
    ok = [r for r in recs if r.ok]
    counts: dict[str, int] = {}
    for t in trials:
        counts[str(t["status"])] = counts.get(str(t["status"]), 0) + 1
    row = {"model": model, "search_wall_s": round(wall, 1), "trials": counts,
           "gpu_s": round(sum((r.wall_s or 0) * r.world_size for r in recs if r.device == "cuda"), 1),
           "notes": [ln.strip() for ln in search_log.splitlines() if "start point" in ln or "do not fit" in ln]}
    if not ok:
        why = sorted({f"{t['status']}: {(t['error'] or '')[:160]}" for t in trials})
        return row | {"fits": False, "why": "no trial succeeded: " + "; ".join(why)}
    best = max(ok, key=lambda r: r.m["tokens_per_s"])
    m = best.m
    price = price_for(m.get("gpu"), load_prices())
    errs = [memory.predict(r) / peak - 1 for r, peak in memory.calibration_pairs(ok, None)]
    row |= {"fits": True, "key": best.key, "n_params": m["n_params"], "config": best.config,
            "knobs": non_default(best.config), "micro_batch_size": best.plan.micro_batch_size,
            "grad_accum": best.grad_accum, "tokens_per_s": round(m["tokens_per_s"]), "mfu": round(m["mfu"] or 0.0, 4),
            "projected_days": round(m["projected_days"], 2), "peak_gib": m.get("peak_memory_gib") or 0.0,
            "predicted_gib": round(memory.predict(best) / memory.GiB, 1),
            "memory_errors": [round(e, 4) for e in errs], "gpu": m.get("gpu"),
            "rent_usd": round(price.rent_usd(m["projected_days"], best.world_size)) if price else None,
            "box_usd": round(price.box_usd(best.world_size)) if price else None,
            "seed_method_step_ratio": (round(m["seed_method_step_s"] / m["step_s"], 3)
                                       if m.get("seed_method_step_s") else None)}
    if verify_out:
        row["verify"] = {k: verify_out.get(k) for k in ("status", "error", "steps", "global_batch",
                                                        "recipe_global_batch", "projected_step_s", "measured_step_s",
                                                        "ratio", "spread")}
    paper = PAPER.get(model)
    if paper:
        fpt = m["flops_per_token"]
        tokens = best.recipe["global_batch"] * best.recipe["seq_len"] * best.recipe["total_steps"]
        row["paper"] = dict(paper, implied_mfu=round(tokens * fpt / (paper["days"] * 86400) /
                                                     (paper["gpus"] * paper["tflops"] * 1e12), 3))
    return row


def markdown(rows: list[dict]) -> str:
    """The table (and the rows that do not fit, with what would make them fit) as markdown."""
    head = ("| model | fits one GPU | best configuration (non-default knobs) | mbs x accum | tokens/s | MFU | days | "
            "rent | buy | verify measured/projected (global batch) | peak GiB (predicted) | trials | search s |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]

    def money(x):
        return f"${x:,.0f}" if x is not None else "?"
    for r in rows:
        t = ", ".join(f"{n} {k}" for k, n in sorted(r.get("trials", {}).items()))
        if not r.get("fits"):
            why = short_why(r["would_fit"], r.get("gpu", "GPU")) if r.get("would_fit") else r.get("why") or ""
            lines.append(f"| {r['model']} | no | {why} | | | | | | | | | {t} | {r.get('search_wall_s', 0):.0f} |")
            continue
        v = r.get("verify") or {}
        ver = (f"{v['ratio']:.3f} ({v.get('global_batch')} of {v.get('recipe_global_batch')})" if v.get("ratio")
               else (v.get("status") or "not run"))
        lines.append(f"| {r['model']} | yes | {r['knobs']} | {r['micro_batch_size']} x {r['grad_accum']} | "
                     f"{r['tokens_per_s']:,} | {r['mfu']:.3f} | {r['projected_days']:.1f} | {money(r['rent_usd'])} | "
                     f"{money(r['box_usd'])} | {ver} | {r['peak_gib']:.1f} ({r['predicted_gib']:.1f}) | {t} | "
                     f"{r['search_wall_s']:.0f} |")
    for r in rows:
        if r.get("paper"):
            p = r["paper"]
            lines.append(f"\nThe seed paper on {r['model']}: {p['claim']}, which implies an MFU of "
                         f"{p['implied_mfu']:.2f} (FLOPs/token as ours, {p['gpus']} x {p['tflops']:.0f} TFLOP/s bf16 "
                         f"dense); measured here on one {r['gpu']}: MFU {r['mfu']:.3f}, {r['projected_days']:.1f} "
                         "days.")
    errs = sorted(abs(e) for r in rows for e in r.get("memory_errors", []))
    if errs:
        med = errs[len(errs) // 2] if len(errs) % 2 else 0.5 * (errs[len(errs) // 2 - 1] + errs[len(errs) // 2])
        lines.append("\nMemory model on these rows' successful trials (uncalibrated, no allowance but predict's 1 "
                     f"GiB): n={len(errs)}, median |error| {100 * med:.1f} %, worst {100 * errs[-1]:.1f} %.")
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="folder of the table and its store (a later call adds rows)")
    p.add_argument("--models", default=",".join(SIZES), help="comma-separated, smallest first (default: %(default)s)")
    p.add_argument("--device", default="auto", help="auto, cuda or cpu (cpu: a smoke run)")
    p.add_argument("--trials", default=None, help="trials per search: '4' for every model, or "
                                                  "'pythia-160m=6,pythia-6.9b=3' (defaults in TRIALS)")
    p.add_argument("--steps", type=int, default=4, help="timed steps per trial (default: %(default)s)")
    p.add_argument("--verify-steps", type=int, default=2, help="full optimizer steps of verify (default: %(default)s)")
    p.add_argument("--verify-step-s", type=float, default=12.0,
                   help="cut verify's global batch so a full step takes about this long (default: %(default)s)")
    a = p.parse_args()
    try:
        return run(a, parse_trials(a.trials))
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT


def run(a, trials: dict[str, int]) -> int:
    import psutil

    from trainscout.analysis.verify import verify
    from trainscout.search.service import SearchArgs, fits, run_search, space_defaults, validate
    from trainscout.store import default_url, open_store, storage_url
    os.makedirs(a.out, exist_ok=True)
    url = storage_url(default_url(os.path.abspath(a.out)))
    table = os.path.join(a.out, "seed_table.jsonl")
    rows = []
    if os.path.exists(table):
        with open(table, encoding="utf-8") as f:
            rows = [json.loads(ln) for ln in f if ln.strip()]
    have = {r["model"] for r in rows}
    host = psutil.virtual_memory().total
    for model in [m.strip() for m in a.models.split(",") if m.strip()]:
        if model in have:
            print(f"{model}: in {table} already", flush=True)
            continue
        n = trials.get(model, trials["*"])
        args = SearchArgs(model=model, out=os.path.join(a.out, model), device=a.device, trials=n,
                          storage=url, name=model, steps=a.steps)
        space, _, hw = validate(args)
        t0 = time.time()
        if hw["device"] == "cuda":
            defaults = space_defaults(space)
            notes: list[str] = []
            from trainscout.predictor import memory  # calibrated on the store's peaks of this GPU, as the search is
            calibration = memory.fit(memory.calibration_pairs(open_store(url).measurements(), hw.get("gpu")))
            if fits(args, space, hw, calibration, defaults, notes, host=host) is None:
                need = not_fitting(model, hw, host, calibration)
                row = {"model": model, "fits": False, "why": notes[0], "would_fit": need, "gpu": hw["gpu"],
                       "calibrated": calibration is not None, "search_wall_s": 0.0, "trials": {}}
                print(f"{model}: does not fit: {short_why(need, hw['gpu'])}", flush=True)
                _append(a.out, table, rows, row)
                continue
        log = io.StringIO()

        class Tee(io.TextIOBase):
            def write(self, s):
                sys.stdout.write(s)
                sys.stdout.flush()
                return log.write(s)
        resume = open_store(url).search_args(model) is not None  # a call that ended inside this model's search
        print(f"{model}: search, {n} trials{' (resumed)' if resume else ''}", flush=True)
        run_search(args, stream=Tee(), resume=resume)
        wall = time.time() - t0
        store = open_store(url)
        ok = [r for r in store.measurements() if r.model == model and r.ok]
        ver = None
        if ok:
            best = max(ok, key=lambda r: r.m["tokens_per_s"])
            gb = verify_batch(best, a.verify_step_s)
            print(f"{model}: verify {best.key[:12]} ({a.verify_steps} full steps at global batch "
                  f"{gb or best.recipe['global_batch']})", flush=True)
            ver = verify(a.out, key=best.key, steps=a.verify_steps, warmup=1, global_batch=gb)
            print(f"{model}: verify {ver['status']} ratio {ver.get('ratio')}", flush=True)
        row = row_of(model, store, log.getvalue(), wall, ver)
        _append(a.out, table, rows, row)
        print(f"{model}: {json.dumps({k: row.get(k) for k in ('knobs', 'tokens_per_s', 'mfu', 'projected_days')})}",
              flush=True)
    print(markdown(rows))
    return 0


def _append(out: str, table: str, rows: list[dict], row: dict) -> None:
    rows.append(row)
    with open(table, "a", encoding="utf-8") as f:
        f.write(json.dumps(row, default=str) + "\n")
    with open(os.path.join(out, "seed_table.md"), "w", encoding="utf-8") as f:
        f.write(markdown(rows))


if __name__ == "__main__":
    sys.exit(main())
