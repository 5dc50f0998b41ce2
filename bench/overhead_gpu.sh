#!/usr/bin/env bash
# Issue 17 on one GPU: what a search's trials cost outside their timed steps, per model (the search's own
# overhead line: wall - timed steps, median after the first trial), each model a cold search of a few trials.
#   bash bench/overhead_gpu.sh DIR "pythia-160m:5 pythia-1b:4 bench/models/llama-1b.json:3"
# Copies each search's log and store into $OUT when $OUT is set (device tool).
set -u
dir=${1:-/tmp/ov} runs=${2:-"pythia-160m:5 pythia-1b:4"}
mkdir -p "$dir"
for run in $runs; do
    model=${run%:*} n=${run##*:} name=$(basename "$model" .json)
    t0=$(date +%s)
    timeout "${SEARCH_TIMEOUT:-240}" trainscout search --model "$model" --trials "$n" --steps 3 --warmup 2 \
        --out "$dir/$name" > "$dir/$name.log" 2>&1
    echo "== $name: rc=$? wall $(( $(date +%s) - t0 )) s"
    grep -E "^ +[0-9]+ [0-9a-f]{8} |overhead|best #1" "$dir/$name.log" | cut -c1-160
done
ray stop --force > /dev/null 2>&1
if [ -n "${OUT:-}" ]; then
    mkdir -p "$OUT/ov"; cp "$dir"/*.log "$OUT/ov/"
    for db in "$dir"/*/results.db; do
        python3 -c "import sqlite3,sys; c=sqlite3.connect(sys.argv[1]); c.execute('PRAGMA wal_checkpoint(TRUNCATE)'); c.close()" "$db"
        cp "$db" "$OUT/ov/$(basename "$(dirname "$db")").db"
    done
fi
exit 0
