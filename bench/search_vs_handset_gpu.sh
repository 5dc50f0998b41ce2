#!/usr/bin/env bash
# Issues 17 and 27 on one GPU lease: a cold search of a config.json never tuned on (default the Llama-1B shape),
# then the hand-set best configurations in fresh trials on the same machine, so the two are compared on one lease.
#   [MODEL=bench/models/X.json GROUP=handset_X CASE=text] bash bench/search_vs_handset_gpu.sh [BUDGET] [DIR]  (default 6m, /tmp/sl)
# The search runs first, so its compiles are cold; the hand-set trials then find those graphs in inductor's cache.
# Copies results.db, the search log and handset.jsonl into $OUT when $OUT is set (device tool).
set -u
budget=${1:-6m} dir=${2:-/tmp/sl}
model=${MODEL:-bench/models/llama-1b.json} group=${GROUP:-handset_llama}
t0=$(date +%s)
timeout "${SEARCH_TIMEOUT:-450}" trainscout search --model "$model" --time-budget "$budget" --steps 3 --warmup 2 \
    --global-batch 256 --out "$dir" > "$dir.search.log" 2>&1
echo "search rc=$? wall $(( $(date +%s) - t0 )) s"; grep -v Warning "$dir.search.log" | cut -c1-220 | tail -30
ray stop --force > /dev/null 2>&1  # a search cut at its timeout leaves its Ray (and a trial's GPU memory) behind
t1=$(date +%s)
timeout "${HANDSET_TIMEOUT:-200}" python3 bench/trial_gpu.py --group "$group" ${CASE:+--case "$CASE"} --steps 3 --warmup 2 \
    --store "$dir-handset" --out "$dir-handset.jsonl" 2>&1 | grep -v Warning | tail -6
echo "hand-set wall $(( $(date +%s) - t1 )) s"
ray stop --force > /dev/null 2>&1
if [ -n "${OUT:-}" ]; then
    name=$(basename "$dir"); mkdir -p "$OUT/$name"
    python3 -c "import sqlite3,sys; c=sqlite3.connect(sys.argv[1]); c.execute('PRAGMA wal_checkpoint(TRUNCATE)'); c.close()" "$dir/results.db"
    cp "$dir/results.db" "$dir.search.log" "$OUT/$name/"; cp "$dir-handset.jsonl" "$OUT/$name/handset.jsonl" 2>/dev/null
fi
exit 0
