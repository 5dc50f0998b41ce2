"""Check a projection: train a stored configuration for N real optimizer steps (every micro-batch of the global
batch, each step synchronised) and compare the measured step time with the step time the search projected."""
from __future__ import annotations

import json
import os

from trainscout.spaces import ConfigError

from .table import measurement, store_of


def verify(source: str, *, key: str | None = None, steps: int = 200, warmup: int = 2, timeout: float | None = None,
           address: str | None = None) -> dict:
    """Measure the best (or the keyed) configuration for `steps` full optimizer steps; the comparison as a dict.

    The verification runs in fresh worker processes like a trial, but with the full accumulation in every timed
    step (measure_accum=0), so nothing is extrapolated; it is stored with the search as `verify-KEY.json`."""
    from trainscout.trial import execute, hardware, prepare
    from trainscout.trial.models import overrides_of
    store = store_of(source)
    rec = measurement(store, key, best=key is None)
    device = rec.device
    if device == "cuda":
        hw = hardware.fingerprint("cuda", rec.world_size)
        if hw.get("gpu") != rec.hardware.get("gpu"):
            raise ConfigError("--trial", f"the measurement was taken on {rec.hardware.get('gpu')} but this box has "
                                         f"{hw.get('gpu') or 'no GPU'}: verify on the same hardware")
    from trainscout.trial.models import stored_model
    spec = prepare(stored_model(rec.model, rec.model_config), rec.config, device=device, workers=rec.world_size, steps=steps, warmup=warmup,
                   measure_accum=0, **overrides_of(rec.recipe))
    projected = rec.metrics
    run = execute(spec, timeout=timeout or max(900.0, 30 * steps * projected["step_s"]), address=address)
    out = {"key": rec.key, "model": rec.model, "config": rec.config, "steps": steps,
           "projected_step_s": projected["step_s"], "status": str(run.status), "error": run.error}
    if run.ok:
        m = run.metrics
        out.update(measured_step_s=m["measured_step_s"],  # median of the full steps, as run
                   mean_step_s=m["timed_s"] / steps,        # wall time of all timed steps / steps (stalls included)
                   ratio=m["measured_step_s"] / projected["step_s"],
                   projected_tokens_per_s=projected["tokens_per_s"],
                   measured_tokens_per_s=rec.recipe["global_batch"] * rec.recipe["seq_len"] / m["measured_step_s"],
                   spread=m["step_spread"], loss=m["loss"], gpu=m.get("gpu"), wall_s=run.wall_s,
                   seed_method_step_s=m.get("seed_method_step_s"),  # unsynchronised, one micro-batch x A
                   seed_method_ratio=(m.get("seed_method_step_s") or 0) / m["measured_step_s"])
    path = source if os.path.isdir(source) else None
    if path:
        with open(os.path.join(path, f"verify-{rec.key[:12]}.json"), "w") as f:
            json.dump(out, f, indent=1)
    return out
