#!/usr/bin/env bash
# Issue 3/7 benchmark on a GPU box: a fixed-budget trainscout search for one model, then `trainscout verify` of the
# best configuration it found (full optimizer steps in fresh workers, with the seed paper's timer beside them).
#   bash bench/search_gpu.sh MODEL BUDGET RESULTS_DIR [VERIFY_STEPS] [extra search flags...]
#   e.g. bash bench/search_gpu.sh pythia-160m 330s /tmp/s160 3 --space bench/spaces/h200-small.yaml
# Copies results.db (checkpointed), the search log and verify-*.json into $OUT when $OUT is set (device tool).
set -u
model=$1 budget=$2 dir=$3 vsteps=${4:-3}
shift 4 2>/dev/null || shift $#
t0=$(date +%s)
timeout "${SEARCH_TIMEOUT:-450}" trainscout search --model "$model" --time-budget "$budget" --steps 3 --warmup 2 \
    --out "$dir" "$@" > "$dir.search.log" 2>&1
echo "search rc=$? wall $(( $(date +%s) - t0 )) s"; tail -25 "$dir.search.log"
ray stop --force > /dev/null 2>&1
t1=$(date +%s)
timeout "${VERIFY_TIMEOUT:-150}" trainscout verify "$dir" --steps "$vsteps" --warmup 1 > "$dir.verify.log" 2>&1
echo "verify rc=$? wall $(( $(date +%s) - t1 )) s"; tail -6 "$dir.verify.log"
ray stop --force > /dev/null 2>&1
if [ -n "${OUT:-}" ]; then
    name=$(basename "$dir"); mkdir -p "$OUT/$name"
    python3 -c "import sqlite3,sys; c=sqlite3.connect(sys.argv[1]); c.execute('PRAGMA wal_checkpoint(TRUNCATE)'); c.close()" "$dir/results.db"
    cp "$dir/results.db" "$OUT/$name/"; cp "$dir.search.log" "$dir.verify.log" "$OUT/$name/"
    cp "$dir"/verify-*.json "$OUT/$name/" 2>/dev/null
fi
exit 0
