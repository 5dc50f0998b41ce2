#!/usr/bin/env bash
# Issue 7, item 2 on a GPU box: record the grid of a space with one bench/grid.py shard per GPU (each its own
# local Ray, one trial at a time), all writing one results store, then the whole CSV from that store.
#   bash bench/grid_gpu.sh MODEL SPACE STORE CSV [extra grid.py flags...]
#   e.g. bash bench/grid_gpu.sh pythia-160m bench/spaces/h200-small.yaml bench/data/grid-h200 bench/data/grid-h200-160m.csv
# Resumable: a rerun measures only what the store lacks (the device tool caps a call at 10 minutes: GRID_TIMEOUT
# seconds of shards, default 480, then the merge). Copies the store (checkpointed), CSV and logs to $OUT when set.
set -u
model=$1 space=$2 store=$3 csv=$4
shift 4
n=$(python3 -c "import torch; print(torch.cuda.device_count())")
mkdir -p "$store"
t0=$(date +%s)
for ((k = 0; k < n; k++)); do
    CUDA_VISIBLE_DEVICES=$k timeout "${GRID_TIMEOUT:-480}" python3 bench/grid.py --model "$model" --space "$space" \
        --store "$store" --csv "$store/shard$k.csv" --steps 3 --warmup 2 --shard "$k/$n" "$@" > "$store/shard$k.log" 2>&1 &
done
wait
echo "shards: wall $(( $(date +%s) - t0 )) s"; grep -h "^\[" "$store"/shard*.log | grep -v " stored " | cut -c1-160
ray stop --force > /dev/null 2>&1
python3 - "$store/results.db" <<'PY'
import sqlite3, sys
c = sqlite3.connect(sys.argv[1]); c.execute("PRAGMA wal_checkpoint(TRUNCATE)"); c.close()
PY
# the merge answers every row from the store; a row no shard finished stays "valid" (not measured)
python3 bench/grid.py --model "$model" --space "$space" --store "$store" --csv "$csv" --steps 3 --warmup 2 \
    --stored-only "$@" | tail -45
if [ -n "${OUT:-}" ]; then
    mkdir -p "$OUT/grid"; cp "$store/results.db" "$csv" "$store"/shard*.log "$OUT/grid/"
fi
