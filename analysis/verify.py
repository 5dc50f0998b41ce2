"""Check a projection: train a stored configuration for N real optimizer steps (every micro-batch of the global
batch, each step synchronised) and compare the measured step time with the step time the search projected."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

from trainscout.spaces import ConfigError
from trainscout.trial.records import TOKENS_PER_S

from .table import measurement, ran_config, store_of

RUNNERS = ("trainscout", "hf", "accelerate")


def verify(source: str, *, key: str | None = None, steps: int = 200, warmup: int = 2, timeout: float | None = None,
           address: str | None = None, runner: str = "trainscout", global_batch: int | None = None) -> dict:
    """Measure the best (or the keyed) configuration for `steps` full optimizer steps; the comparison as a dict.

    runner "trainscout": fresh worker processes like a trial, but with the full accumulation in every timed step
    (measure_accum=0), so nothing is extrapolated. "hf": the export in a stock HF Trainer with the runtime hook (one
    rank: a plain process; several: accelerate launch), "accelerate": always through `accelerate launch` with the
    exported accelerate.yaml. Stored with the search as `verify-KEY.json` (`verify-RUNNER-KEY.json`).

    global_batch (runner "trainscout"): full steps of this many sequences instead of the recipe's, where a step of
    the recipe takes too long to verify (minutes at a large model: docs/analysis.md). The projection compared is the
    measurement's own at A' micro-batches, derived from its per-step phases as its step was at A (step_at); the
    output carries both batches and the recipe's projection."""
    if runner not in RUNNERS:
        raise ConfigError("--runner", f"--runner {runner}: use one of {', '.join(RUNNERS)}")
    if global_batch is not None and runner != "trainscout":
        raise ConfigError("--global-batch", f"--global-batch with --runner {runner}: the export trains the recipe's "
                                            "batch; use --runner trainscout or leave --global-batch out")
    from trainscout.trial import hardware
    store = store_of(source)
    rec = measurement(store, key, best=key is None)
    if rec.device == "cuda":
        hw = hardware.fingerprint("cuda", rec.world_size)
        if hw.get("gpu") != rec.hardware.get("gpu"):
            raise ConfigError("--trial", f"the measurement was taken on {rec.hardware.get('gpu')} but this box has "
                                         f"{hw.get('gpu') or 'no GPU'}: verify on the same hardware")
    out = _in_trainer(source, rec, runner, steps, warmup, timeout) if runner != "trainscout" else \
        _in_trainscout(rec, steps, warmup, timeout, address, global_batch)
    path = source if os.path.isdir(source) else None
    if path:
        name = f"verify-{rec.key[:12]}.json" if runner == "trainscout" else f"verify-{runner}-{rec.key[:12]}.json"
        if global_batch is not None:
            name = name.replace(".json", f"-gb{global_batch}.json")
        with open(os.path.join(path, name), "w") as f:
            json.dump(out, f, indent=1)
    return out


def _in_trainer(source: str, rec, runner: str, steps: int, warmup: int, timeout: float | None) -> dict:
    """The export of `rec` run by analysis/hf_run.py in a stock HF Trainer, in its own process(es)."""
    from .export import export
    folder = os.path.abspath(os.path.join(source if os.path.isdir(source) else tempfile.mkdtemp(),
                                          f"verify-{runner}-{rec.key[:12]}"))
    try:
        export(rec, folder, ("hf", "accelerate"))
    except ConfigError as e:
        raise ConfigError("--runner", f"--runner {runner}: {e}; use --runner trainscout") from None
    row = os.path.join(folder, "row.json")
    cmd = ["-m", "trainscout.analysis.hf_run", folder, "--steps", str(steps), "--warmup", str(warmup), "--out", row]
    if runner == "accelerate" or rec.world_size > 1:
        cmd = ["-m", "accelerate.commands.launch", "--config_file", os.path.join(folder, "accelerate.yaml"), *cmd]
    projected = rec.metrics
    out = {"key": rec.key, "model": rec.model, "config": rec.config, "steps": steps, "runner": runner,
           "projected_step_s": projected["step_s"], "export": folder, "command": " ".join([sys.executable, *cmd])}
    limit = timeout or max(900.0, 30 * steps * projected["step_s"])
    try:
        # from the export folder, as its launch line says (accelerate.yaml names deepspeed.json relative to it)
        done = subprocess.run([sys.executable, *cmd], capture_output=True, text=True, timeout=limit, cwd=folder)
    except subprocess.TimeoutExpired:
        return out | {"status": "timeout", "error": f"the Trainer did not finish in {limit:.0f} s"}
    if done.returncode != 0 or not os.path.exists(row):
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        return out | {"status": "crash", "error": f"exit {done.returncode}: {tail[0]}"}
    with open(row, encoding="utf-8") as f:
        r = json.load(f)
    if r["world_size"] != rec.world_size:  # another global batch: the step times do not compare
        return out | {"status": "invalid", "world_size": r["world_size"],
                      "error": f"the Trainer ran on {r['world_size']} rank(s), the measurement on {rec.world_size}: "
                               "verify on the measured ranks, or --runner trainscout"}
    return out | {"status": "ok", "error": None, "measured_step_s": r["step_s"], "mean_step_s": r["mean_step_s"],
                  "ratio": r["step_s"] / projected["step_s"], "projected_tokens_per_s": projected[TOKENS_PER_S],
                  "measured_tokens_per_s": r[TOKENS_PER_S], "loss": r["loss"], "world_size": r["world_size"],
                  "gpu": rec.hardware.get("gpu") if rec.device == "cuda" else None, "wall_s": r["wall_s"]}


def _at_batch(rec, global_batch: int | None) -> tuple[dict, float]:
    """(recipe overrides, projected step s) of the measurement at another global batch (None: the recipe's)."""
    from trainscout.trial.models import overrides_of
    over, m = overrides_of(rec.recipe), rec.metrics
    if global_batch is None or global_batch == rec.recipe["global_batch"]:
        return over, m["step_s"]
    if rec.plan.engine == "pipeline":
        raise ConfigError("--global-batch", "--global-batch: a pipeline measurement's step is not a sum of "
                                            "micro-batches; leave --global-batch out")
    per_step = rec.recipe["global_batch"] // rec.grad_accum  # sequences per micro-batch over all data ranks
    if global_batch % per_step:
        raise ConfigError("--global-batch", f"--global-batch {global_batch}: give a multiple of {per_step} "
                                            f"(micro-batch {rec.micro_batch} x the data-parallel ranks)")
    accum = global_batch // per_step
    return dict(over, global_batch=global_batch), step_at(m, accum)


def step_at(m: dict, accum: int) -> float:
    """A measurement's projected step at `accum` micro-batches, derived as its step_s was (metrics.project_at on its
    per-step phases), else from its median phases: (A'-1) x micro-batch + last + optimizer.

    Not step_s + (A' - A) x micro_batch_s: step_s is the median over steps of each step's own projection, the
    micro-batch the median over every step's, and their difference is multiplied by A - A', a large error at a far
    smaller batch (a worked example: docs/analysis.md)."""
    from trainscout.trial import metrics
    if m.get("phases"):
        return metrics.project_at(m["phases"], accum)
    return (accum - 1) * m["micro_batch_s"] + m["last_micro_batch_s"] + m["optimizer_s"]


def _in_trainscout(rec, steps: int, warmup: int, timeout: float | None, address: str | None,
                   global_batch: int | None = None) -> dict:
    from trainscout.trial import execute, prepare
    from trainscout.trial.models import stored_model
    device = rec.device
    over, projected_step = _at_batch(rec, global_batch)
    config = ran_config(rec)
    spec = prepare(stored_model(rec.model, rec.model_config), config, device=device, workers=rec.world_size,
                   steps=steps, warmup=warmup, measure_accum=0, **over)
    projected = rec.metrics
    run = execute(spec, timeout=timeout or max(900.0, 30 * steps * projected_step), address=address)
    out = {"key": rec.key, "model": rec.model, "config": rec.config, "steps": steps, "runner": "trainscout",
           "projected_step_s": projected_step, "status": str(run.status), "error": run.error,
           "global_batch": spec.recipe["global_batch"], "recipe_global_batch": rec.recipe["global_batch"],
           "recipe_projected_step_s": projected["step_s"]}
    if run.ok:
        m = run.metrics
        out.update(measured_step_s=m["measured_step_s"],  # median of the full steps, as run
                   mean_step_s=m["timed_s"] / steps,        # wall time of all timed steps / steps (stalls included)
                   ratio=m["measured_step_s"] / projected_step,
                   projected_tokens_per_s=spec.tokens_per_step / projected_step,
                   measured_tokens_per_s=spec.tokens_per_step / m["measured_step_s"],
                   spread=m["step_spread"], loss=m["loss"], gpu=m.get("gpu"), wall_s=run.wall_s,
                   seed_method_step_s=m.get("seed_method_step_s"),  # unsynchronised, one micro-batch x A
                   seed_method_ratio=(m.get("seed_method_step_s") or 0) / m["measured_step_s"])
    return out
