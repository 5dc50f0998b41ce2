"""Calibrating the one-step quality gate's lines (trial/quality.py, LINES) on real shapes, in one GPU call.

For each model (a Hub config.json of bench/models/hub, random weights from the gate's seed) the reference (bf16
autocast over fp32 weights) takes the gate's steps once; then each candidate takes its steps on the same batches and
the gate's own functions judge it (quality.statistics, quality.judge): what a trial's gate would say, with the
reference computed once per model. The candidates (DEFAULT; --only picks among CANDIDATES): FP8 tensorwise, rowwise,
rowwise with the weight gradients' products in high precision, tensorwise with the first and last decoder layers in
high precision, and precision=bf16 (rowwise with those layers in high precision besides).
Printed per candidate: the verdict and why; the worst layer group's noise ratio (deviation over the reference's
batch-to-batch spread) and rescale (its gain off 1 on every batch, at its least); the worst parameter's; the gate of
one batch's worst layer gain (the first batch: the line it judged was 1 +- OLD_LAYER_GAIN) and that verdict; the
op SQNR and the loss; then every layer group's noise ratio and gains, for choosing the lines. With --line NAME=VALUE
each candidate is judged again under those limits (a column of its own). Everything goes to OUT/gate_calibration.json
too ($OUT on the device machine, else the working folder), a model at a time.

Imports no Ray, Optuna or DeepSpeed (the device image lacks them unless carried): trainscout.trial and .spaces only.
--device cpu runs the same code on this machine's CPU with the plans an H100 would get (torchao's FP8 through
torch's CPU _scaled_mm; rowwise_with_gw_hp needs CUDA autocast and fails there): a smoke test on tiny shapes.

Usage: python bench/gate_calibration_gpu.py [--models qwen2.5-1.5b,olmoe-1b-7b-0924,mistral-7b-v0.3] [--seq 2048]
           [--layers N] [--only LABEL,LABEL] [--line layer_noise=1.5 ...] [--device cuda|cpu] [--budget SECONDS]
"""
import argparse
import dataclasses
import json
import math
import os
import time

import torch

from trainscout.spaces import ConfigError, Plan
from trainscout.trial import prepare, quality
from trainscout.trial.engines.base import autocast_dtype

HERE = os.path.dirname(os.path.abspath(__file__))

HUB = os.path.join(HERE, "models", "hub")
MODELS = ("qwen2.5-1.5b", "olmoe-1b-7b-0924", "mistral-7b-v0.3")  # 28 dense layers, 16 MoE layers, 32 dense layers
CANDIDATES = {
    "fp8 tensorwise": {"fp8": "tensorwise"},
    "fp8 rowwise": {"fp8": "rowwise"},
    "fp8 rowwise gw_hp": {"fp8": "rowwise", "fp8_weight_grad": "high"},
    "fp8 tensorwise ends": {"fp8": "tensorwise", "fp8_ends": "high"},
    "fp8 rowwise ends": {"fp8": "rowwise", "fp8_ends": "high"},
    "precision bf16": {"precision": "bf16"},
}
DEFAULT = ("fp8 tensorwise", "fp8 rowwise", "fp8 rowwise gw_hp", "fp8 tensorwise ends", "precision bf16")
# what every candidate and its reference share: the gate's step as a trial's would take it, one rank
COMMON = {"compile": False, "zero_stage": 0, "fsdp": "off", "activation_checkpointing": "none",
          "loss_kernel": "eager", "micro_batch_size": 1}
OLD_LAYER_GAIN = 0.1  # the gate of one batch: each decoder layer's gain within 1 +- this (its verdict beside)
H100 = {"device": "cuda", "gpu": "H100 plan (run on the CPU)", "capability": "9.0", "gpu_count": 1,
        "gpu_memory_gib": 79.0}  # --device cpu: the plans an H100 gets


def model_path(name: str, layers: int | None, out: str) -> str:
    """A Hub config.json of bench/models/hub (a name or a path), with num_hidden_layers cut to layers where given."""
    path = name if name.endswith(".json") else os.path.join(HUB, f"{name}.json")
    if not layers:
        return path
    cfg = json.load(open(path))
    cfg["num_hidden_layers"] = layers
    if isinstance(cfg.get("layer_types"), list):
        cfg["layer_types"] = cfg["layer_types"][:layers]
    cut = os.path.join(out, f"{os.path.basename(path)[:-5]}-{layers}l.json")
    json.dump(cfg, open(cut, "w"))
    return cut


def reference_steps(spec, batches, device) -> dict:
    """The reference's steps on the gate's batches, as one_step takes them: gradients, losses, the spread."""
    refs, losses = [], []
    plan = Plan.from_dict(spec.quality["reference_plan"])
    for loss, grads, _, layers in quality.gate_steps(spec, plan, batches, device, reference_dtype=False,
                                                      changed=tuple(spec.quality["changes"]), host_grads=True):
        losses.append(loss)
        refs.append(grads)
        quality.park_gradients(refs, device, room=1.5)
    spread = quality.reference_spread(refs, device)
    if device.type == "cuda":
        torch.cuda.empty_cache()
    quality.park_gradients(refs, device, room=2.5)
    return {"refs": refs, "losses": losses, "layers": layers, "spread": spread}


def candidate(spec, batches, device, ref: dict) -> dict:
    """A candidate's steps against the reference's, judged as one_step judges them."""
    per_batch, losses, op = [], [], None
    ref_dtype = autocast_dtype(spec.quality["reference_plan"]["precision"])
    for b, (loss, grads, got, _) in enumerate(quality.gate_steps(spec, spec.plan, batches, device,
                                                                  reference_dtype=ref_dtype,
                                                                  changed=tuple(spec.quality["changes"]))):
        losses.append(loss)
        op = got if b == 0 else op
        per_batch.append(quality.gradient_sums(ref["refs"][b], grads))
        del grads
    stats = quality.statistics(per_batch, ref["spread"], ref["layers"], losses, ref["losses"], op)
    return {"stats": stats, "first": quality.first_batch_statistics(per_batch[0], ref["layers"])}


def row(label: str, got: dict, lines: dict | None) -> dict:
    stats, first = got["stats"], got["first"]
    word, why, worst = quality.judge(stats)
    old_gain = first["layer_grad_gain"]
    out = {"candidate": label, "verdict": word, "why": why, **worst, "old_layer_gain": old_gain,
           "old_layer_gain_at": first["layer_grad_gain_at"],
           "old_verdict": "passed" if old_gain is not None and abs(old_gain - 1) <= OLD_LAYER_GAIN else "failed",
           "op_sqnr_db": stats["op_sqnr_db"], "loss_rel_diff": stats["loss_rel_diff"],
           "groups": {n: {"ratio": s["ratio"], "gains": s["gains"], "reference_cosine": s["reference_cosine"]}
                      for n, s in stats["layers"].items()}}
    if lines:
        out["verdict_under_lines"] = quality.judge(stats, lines)[:2]
    return out


def short(name: str | None) -> str:
    """A group's name without the model's prefix: layers.3, embed_tokens.weight."""
    if not name:
        return "-"
    parts = name.split(".")
    if "layers" in parts:
        i = parts.index("layers")
        return ".".join(parts[i:i + 2])
    return ".".join(parts[-2:])


def fmt(x, spec=".3f") -> str:
    return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, spec)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--seq", type=int, default=2048, help="the gate's sequence length (its batches: 2 sequences)")
    ap.add_argument("--layers", type=int, default=None, help="cut every model to this many decoder layers")
    ap.add_argument("--only", default=",".join(DEFAULT), help="candidates to run, by label, comma-separated "
                    f"(of: {', '.join(CANDIDATES)})")
    ap.add_argument("--line", action="append", default=[], help="NAME=LIMIT: judge again under this limit")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--budget", type=float, default=330.0, help="seconds: no model is started past them (a 7B "
                    "takes minutes: the call's limit is 600 s)")
    a = ap.parse_args()
    t_start = time.perf_counter()
    out_dir = os.environ.get("OUT") or "."
    lines = None
    if a.line:
        lines = dict(quality.LINES)
        for item in a.line:
            name, _, value = item.partition("=")
            lines[name] = dataclasses.replace(quality.LINES[name], limit=float(value))
    only = a.only.split(",")
    if unknown := [c for c in only if c not in CANDIDATES]:
        ap.error(f"--only: no candidate {', '.join(unknown)}: choose of {', '.join(CANDIDATES)}")
    device = torch.device(a.device)
    hw = None if a.device == "cuda" else H100
    where = torch.cuda.get_device_name(device) if a.device == "cuda" else "CPU (H100 plans)"
    print(f"gate calibration on {where}; torch {torch.__version__}; lines "
          + ", ".join(f"{k} {v.limit:g}" + (f" (marginal from {v.band * v.limit:g})" if v.band else "")
                      for k, v in quality.LINES.items()), flush=True)
    report = {"device": where, "seq": a.seq, "batches": [quality.GATE_BATCHES, quality.GATE_BATCH],
              "lines": {k: dataclasses.asdict(v) for k, v in quality.LINES.items()},
              "other_lines": {k: v.limit for k, v in (lines or {}).items()}, "models": {}}
    for name in a.models.split(","):
        if time.perf_counter() - t_start > a.budget:
            print(f"{name}: not started (past --budget {a.budget:g} s)", flush=True)
            continue
        t0 = time.perf_counter()
        path = model_path(name, a.layers, out_dir)
        rows, refs = [], {}
        try:
            specs = {}
            for label in only:
                try:
                    specs[label] = prepare(path, dict(COMMON, **CANDIDATES[label]), device=a.device, steps=1,
                                           warmup=0, seq_len=a.seq, hw=hw,
                                           installed=frozenset({"torchao"}) if hw else None)
                except ConfigError as e:
                    rows.append({"candidate": label, "error": f"refused: {e}"})
            batches = None
            for label, spec in specs.items():
                tc = time.perf_counter()
                try:
                    if "reference_plan" not in (spec.quality or {}):
                        raise ConfigError("reference", (spec.quality or {}).get("why") or "changes nothing")
                    if batches is None:
                        batches = quality.gate_batches(spec, device)
                    key = json.dumps(spec.quality["reference_plan"], sort_keys=True)
                    with torch.compiler.set_stance("force_eager"):
                        if key not in refs:
                            refs.clear()  # one reference's gradients held at a time
                            tr = time.perf_counter()
                            refs[key] = reference_steps(spec, batches, device)
                            print(f"{name}: reference steps {time.perf_counter() - tr:.1f} s, losses "
                                  + ", ".join(f"{v:.4f}" for v in refs[key]["losses"]), flush=True)
                        got = candidate(spec, batches, device, refs[key])
                    r = row(label, got, lines)
                except Exception as e:  # noqa: BLE001 - one candidate's failure (out of memory included)
                    said = str(e).splitlines()[0][:300] if str(e) else ""
                    r = {"candidate": label, "error": f"{type(e).__name__}: {said}"}
                r["seconds"] = round(time.perf_counter() - tc, 1)
                rows.append(r)
                _print(name, r, lines)
                if device.type == "cuda":
                    torch.cuda.empty_cache()
        finally:
            refs.clear()
        report["models"][name] = {"rows": rows, "seconds": round(time.perf_counter() - t0, 1)}
        with open(os.path.join(out_dir, "gate_calibration.json"), "w") as f:
            json.dump(report, f, indent=1, default=str)
        print(f"{name}: {time.perf_counter() - t0:.0f} s", flush=True)
    print(f"total {time.perf_counter() - t_start:.0f} s; written {os.path.join(out_dir, 'gate_calibration.json')}")


def _print(model: str, r: dict, lines: dict | None) -> None:
    if "error" in r:
        print(f"{model:18} {r['candidate']:20} {r['error']} ({r.get('seconds', 0)} s)", flush=True)
        return
    again = f" | under --line: {r['verdict_under_lines'][0]}" if lines else ""
    print(f"{model:18} {r['candidate']:20} {r['verdict']:8} noise {fmt(r['noise_ratio'])} @{short(r['noise_ratio_at'])}"
          f"  rescale {fmt(r['rescale'])} @{short(r['rescale_at'])}  param noise {fmt(r['param_noise_ratio'])}"
          f" @{short(r['param_noise_ratio_at'])}  param rescale {fmt(r['param_rescale'])}"
          f"  | old gain {fmt(r['old_layer_gain'])} @{short(r['old_layer_gain_at'])} -> {r['old_verdict']}"
          f"  | op {fmt(r['op_sqnr_db'], '.1f')} dB  loss {r['loss_rel_diff']:+.3%}  {r['seconds']} s{again}",
          flush=True)
    if r["why"]:
        print(f"{'':39} why: {r['why']}", flush=True)
    print(f"{'':39} groups (noise ratio [gains]): " + "; ".join(
        f"{short(n)} {fmt(g['ratio'], '.2f')} [{' '.join(fmt(x, '.2f') for x in g['gains'])}]"
        for n, g in r["groups"].items()), flush=True)


if __name__ == "__main__":
    main()
