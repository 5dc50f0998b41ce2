"""Measure one configuration with trainscout (a real trial) and export it (--format all) into OUT_DIR."""
import json
import sys
from trainscout.analysis.export import export
from trainscout.trial import execute, prepare
from trainscout.trial.ray_cluster import ensure_ray
model, out, settings = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
kw = json.loads(sys.argv[4] if len(sys.argv) > 4 else "{}")
ensure_ray()
rec = execute(prepare(model, settings, device="cuda", steps=5, warmup=2, **kw), timeout=600)
rec.key = rec.trial_id
m = rec.metrics or {}
print(json.dumps({"model": model, "status": rec.status, "error": rec.error, "tokens_per_s": m.get("tokens_per_s"),
                  "mfu": m.get("mfu"), "wall_s": rec.wall_s, "config": rec.config}), flush=True)
if rec.status == "ok":
    export(rec, out)
