#!/usr/bin/env bash
# Issue 46/47: what lookup predicts for a model the atlas never measured, then a cold search of it (empty store,
# every knob's choices, the start points from the memory model and the atlas), and the prediction's error against the
# search's best. One GPU.
#   bash bench/cold_search_gpu.sh CONFIG_JSON BUDGET DIR [extra search flags...]
#   e.g. bash bench/cold_search_gpu.sh bench/models/hub/mistral-7b-v0.3.json 8m30s /tmp/m7
# Prints the GPU, lookup's first answer (JSON in DIR.lookup.json), the search's summary, and one line:
# "predicted P tokens/s (CONFIG), measured best B (CONFIG): error (P-B)/B". Copies results.db and the logs into
# $OUT/NAME when $OUT is set (device tool).
set -u
model=$1 budget=$2 dir=$3
shift 3
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null
free -g | sed -n 2p
trainscout lookup --model "$model" --json > "$dir.lookup.json" 2> "$dir.lookup.err"
echo "lookup rc=$?"
t0=$(date +%s)
trainscout search --model "$model" --time-budget "$budget" --out "$dir" --json "$@" > "$dir.search.json" \
    2> "$dir.search.log"
echo "search rc=$? wall $(( $(date +%s) - t0 )) s"
tail -30 "$dir.search.log"
python3 - "$dir" <<'EOF'
import json, sys
d = sys.argv[1]
try:
    look = json.load(open(d + ".lookup.json"))
except Exception as e:
    look = None
    print("lookup output unreadable:", e, open(d + ".lookup.err").read()[-600:])
try:
    s = json.load(open(d + ".search.json"))
except Exception as e:
    s = None
    print("search output unreadable:", e)
rows = (look or {}).get("measured") or ((look or {}).get("predicted") or {}).get("rows") or []
first = rows[0] if rows else None
best = ((s or {}).get("best") or [None])[0]
print("lookup first:", json.dumps(first)[:600] if first else None)
print("search by status:", (s or {}).get("by_status"))
if first and best:
    p, b = first.get("tokens_per_s"), best["tokens_per_s"]
    print(f"predicted {p:,.0f} tokens/s, measured best {b:,.0f} (mfu {best.get('mfu')}, peak "
          f"{best.get('peak_memory_gib')} GiB, quality {best.get('quality')}): error {(p - b) / b:+.1%}")
    print("best config:", {k: v for k, v in best["config"].items()})
EOF
if [ -n "${OUT:-}" ]; then
    name=$(basename "$dir"); mkdir -p "$OUT/$name"
    python3 -c "import sqlite3,sys; c=sqlite3.connect(sys.argv[1]); c.execute('PRAGMA wal_checkpoint(TRUNCATE)'); c.close()" "$dir/results.db" 2>/dev/null
    cp "$dir/results.db" "$dir.lookup.json" "$dir.lookup.err" "$dir.search.json" "$dir.search.log" "$OUT/$name/" 2>/dev/null
fi
exit 0
