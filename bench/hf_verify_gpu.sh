#!/usr/bin/env bash
# Issue 16 on a GPU, the user's path end to end: a one-trial search of a fixed configuration (the model as given,
# e.g. a relative config.json path), then `trainscout verify` of it in a stock HF Trainer with the runtime hook
# (--runner hf) and, for comparison, in trainscout's own workers over the same full steps.
#   bash bench/hf_verify_gpu.sh MODEL DIR STEPS "RUNNERS" [search flags: --set ..., --global-batch ...]
# Copies the store, the logs and the verify rows into $OUT when $OUT is set (device tool).
set -u
model=$1 dir=$2 steps=$3 runners=$4
shift 4
t0=$(date +%s)
trainscout search --model "$model" --trials 1 --steps 5 --warmup 2 --out "$dir" "$@" > "$dir.search.log" 2>&1
echo "search rc=$? wall $(( $(date +%s) - t0 )) s"; tail -8 "$dir.search.log"
ray stop --force > /dev/null 2>&1
for runner in $runners; do
    t1=$(date +%s)
    trainscout verify "$dir" --runner "$runner" --steps "$steps" --warmup 3 > "$dir.verify-$runner.log" 2>&1
    echo "verify --runner $runner rc=$? wall $(( $(date +%s) - t1 )) s"; tail -5 "$dir.verify-$runner.log"
    ray stop --force > /dev/null 2>&1
done
if [ -n "${OUT:-}" ]; then
    name=$(basename "$dir"); mkdir -p "$OUT/$name"
    python3 -c "import sqlite3,sys; c=sqlite3.connect(sys.argv[1]); c.execute('PRAGMA wal_checkpoint(TRUNCATE)'); c.close()" "$dir/results.db"
    cp "$dir/results.db" "$dir".*.log "$OUT/$name/"; cp "$dir"/verify-*.json "$OUT/$name/" 2>/dev/null
    for e in "$dir"/verify-*/; do [ -d "$e" ] && mkdir -p "$OUT/$name/$(basename "$e")" && cp "$e"*.json "$e"*.yaml "$OUT/$name/$(basename "$e")/" 2>/dev/null; done
fi
exit 0
