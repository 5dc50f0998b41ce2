"""`trainscout train`: train with an exported configuration, on synthetic tokens or a tokenized memmap file, in
the same fresh worker processes and engines a trial uses, with a progress bar and a transformers checkpoint
(config.json + safetensors) at the end."""
from __future__ import annotations

import json
import os
import sys

from trainscout.spaces import ConfigError
from .records import TOKENS_PER_S

DTYPES = ("uint16", "uint32", "int32", "int64")


def load_exported(path: str) -> dict:
    """The provenance file `trainscout export` writes (trainscout.json), given it or its folder."""
    f = os.path.join(path, "trainscout.json") if os.path.isdir(path) else path
    try:
        with open(f, encoding="utf-8") as fh:
            exp = json.load(fh)
    except (OSError, ValueError) as e:
        raise ConfigError("--config", f"--config {path}: cannot read an exported trainscout.json "
                                      f"({e.__class__.__name__}): give the folder `trainscout export` wrote")
    if not isinstance(exp, dict) or not isinstance(exp.get("config"), dict) or not exp.get("model"):
        raise ConfigError("--config", f"--config {path}: not a trainscout export (no model/config): "
                                      "give the folder `trainscout export` wrote")
    return exp


CHUNK = 1 << 26  # token ids read at a time when checking a file


def check_data(path: str | None, dtype: str, seq_len: int, vocab: int | None = None) -> None:
    """Check a --data token file before training (None: synthetic tokens, nothing to check): a known dtype, an
    existing file whose size is a whole number of token ids, at least seq_len tokens, and every id within the model's
    vocabulary (otherwise the trial would crash inside, or after it started); ConfigError otherwise."""
    if path is None:
        return
    if dtype not in DTYPES:
        raise ConfigError("--data-dtype", f"--data-dtype {dtype} is not allowed: choose one of {'|'.join(DTYPES)}")
    if not os.path.isfile(path):
        raise ConfigError("--data", f"--data {path}: no such file: give a flat binary file of token ids")
    import numpy as np
    size, width = os.path.getsize(path), np.dtype(dtype).itemsize
    if size % width:
        fits = [d for d in DTYPES if size % np.dtype(d).itemsize == 0]
        raise ConfigError("--data", f"--data {path} is {size:,} bytes, not a whole number of {dtype} token ids "
                                    f"({width} bytes each): give the --data-dtype it was written with"
                                    + (f" ({'|'.join(fits)} fit its size)" if fits else "") + ", or a complete file")
    n = size // width
    if n < seq_len:
        raise ConfigError("--data", f"--data {path} holds {n} tokens, fewer than one sequence of {seq_len}: "
                                    "give more data or a smaller --seq-len")
    if vocab is None:
        return
    ids = np.memmap(path, dtype=dtype, mode="r")
    lo, hi = 0, 0
    for i in range(0, n, CHUNK):
        part = ids[i:i + CHUNK]
        lo, hi = min(lo, int(part.min())), max(hi, int(part.max()))
    if hi >= vocab or lo < 0:
        bad = hi if hi >= vocab else lo
        raise ConfigError("--data", f"--data {path} holds token id {bad}, outside the model's vocabulary of {vocab} "
                                    f"(ids 0..{vocab - 1}): give data tokenized for this model, the right "
                                    "--data-dtype, or a model whose vocab_size covers it")


def train(config: str, *, model: str | None = None, steps: int = 100, data: str | None = None,
          data_dtype: str = "uint16", out: str = "runs/train", workers: int | None = None, device: str = "auto",
          timeout: float | None = None, address: str | None = None, on_step=None, save_dtype: str | None = None,
          **recipe) -> dict:
    """Train an exported configuration for `steps` optimizer steps in fresh workers, checkpointing into out; returns
    the summary (status, metrics, checkpoint folder) it also writes to out/train.json. The checkpoint keeps the master
    weights' dtype (what trained: fp32 under the mixed precisions) unless save_dtype casts it."""
    from trainscout.trial import execute, prepare
    from trainscout.trial.models import overrides_of
    exp = load_exported(config)
    kw = overrides_of(exp.get("recipe") or {})
    kw.update({k: v for k, v in recipe.items() if v is not None})
    workers = workers or (exp.get("hardware") or {}).get("world_size") or 1
    from trainscout.trial.models import stored_model
    from trainscout.spaces import current
    config, retired = current(exp["config"])  # an older export may hold a retired setting
    for note in retired:
        print(f"trainscout: note: {note}", file=sys.stderr)
    spec = prepare(model or stored_model(exp["model"], exp.get("model_config")), config, device=device,
                   workers=workers, steps=steps, warmup=0, measure_accum=0, **kw)
    from trainscout.trial.models import sizes
    check_data(data, data_dtype, spec.recipe["seq_len"], sizes(spec.model_config).vocab)
    from trainscout.trial.ray_cluster import ensure_ray
    ensure_ray(address)  # reached before the checkpoint folder is made: an unreachable address writes nothing
    out = os.path.abspath(out)
    os.makedirs(out, exist_ok=True)
    spec = spec.replace(data=os.path.abspath(data) if data else None, data_dtype=data_dtype, save_dir=out,
                        save_dtype=save_dtype)
    record = execute(spec, timeout=timeout or 10**7, address=address, on_step=on_step or (lambda m: None))
    summary = {"status": str(record.status), "error": record.error, "model": record.model, "config": record.config,
               "recipe": record.recipe, "world_size": record.world_size, "wall_s": record.wall_s}
    summary.update(steps=steps, data=spec.data, checkpoint=out if record.ok else None,
                   metrics={k: record.m.get(k) for k in (TOKENS_PER_S, "measured_step_s", "loss", "mfu", "dtypes")},
                   saved_dtype=save_dtype or spec.plan.master_dtype if record.ok else None)
    with open(os.path.join(out, "train.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=1)
    return summary
