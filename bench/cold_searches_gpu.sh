#!/usr/bin/env bash
# Issue 60: cold searches of config.json files the atlas never measured, as published, on one GPU: each search's
# trials in order (status, tokens/s, seconds from the command's start to each trial's row), the time to the first
# measurement, the trials measured, and the start point that was lookup's first answer against the search's best.
#   bash bench/cold_searches_gpu.sh CONFIG_JSON:BUDGET [CONFIG_JSON:BUDGET ...]
#   e.g. bash bench/cold_searches_gpu.sh bench/models/hub/gemma-3-1b-pt.json:5m bench/models/hub/qwen2.5-7b.json:8m
# On the device machine: unpack the carried wheels first (docs/BENCHMARKS.md says how). Copies each results.db and
# log into $OUT/NAME when $OUT is set.
set -u
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null
for item in "$@"; do
    model=${item%%:*} budget=${item##*:}
    name=$(basename "$model" .json) dir=/tmp/cold/$(basename "$model" .json)
    mkdir -p /tmp/cold
    t0=$(date +%s.%N)
    trainscout search --model "$model" --time-budget "$budget" --out "$dir" --json > "$dir.search.json" \
        2> "$dir.search.log"
    echo "== $name: search rc=$? wall $(python3 -c "import time;print(round(time.time()-$t0))") s (budget $budget)"
    grep -E "start point|defaults do not fit|stopped drawing" "$dir.search.log" | cut -c1-300
    python3 - "$dir" "$t0" <<'PY'
import datetime, json, sqlite3, sys
d, t0 = sys.argv[1], float(sys.argv[2])
db = sqlite3.connect(f"{d}/results.db")
rows = db.execute("select status, tokens_per_s, created_at, config, error from trainscout_search_trials order by created_at").fetchall()
first = None
for status, tps, at, config, error in rows:
    s = datetime.datetime.fromisoformat(at).timestamp() - t0
    if status in ("ok", "stopped") and first is None:
        first = s
    c = json.loads(config)
    short = {k: c.get(k) for k in ("micro_batch_size", "precision", "fp8", "compile", "activation_checkpointing",
                                   "zero_stage", "fsdp", "optimizer_state", "loss_kernel")}
    print(f"  {s:6.0f} s {status:8} {tps or 0:>10,.0f} {short} {(error or '')[:120]}")
measured = sum(r[0] in ("ok", "stopped") for r in rows)
print(f"  first measurement at {first if first is None else round(first)} s; measured {measured}; "
      f"invalid {sum(r[0] == 'invalid' for r in rows)}; pruned {sum(r[0] == 'pruned' for r in rows)}")
try:
    s = json.load(open(f"{d}.search.json"))
    best = (s.get("best") or [None])[0]
    if best:
        print(f"  best {best['tokens_per_s']:,.0f} tokens/s quality {best.get('quality')} "
              f"mfu {best.get('mfu')}: {best.get('config')}")
except Exception as e:
    print("  summary unreadable:", e)
PY
    tail -4 "$dir.search.log" | cut -c1-300
    if [ -n "${OUT:-}" ]; then
        mkdir -p "$OUT/$name"
        python3 -c "import sqlite3,sys; c=sqlite3.connect(sys.argv[1]); c.execute('PRAGMA wal_checkpoint(TRUNCATE)'); c.close()" "$dir/results.db" 2>/dev/null
        cp "$dir/results.db" "$dir.search.json" "$dir.search.log" "$OUT/$name/" 2>/dev/null
    fi
done
exit 0
