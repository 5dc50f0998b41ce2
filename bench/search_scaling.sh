#!/usr/bin/env bash
# Issue 8 on a multi-GPU box: the same trainscout search (same seed, space and number of trials, one GPU per trial)
# on one GPU and on all GPUs of the box. Each run gets its own empty inductor cache, so neither finds the other's
# compiled kernels (a warm cache hid a third of a compiled trial's wall in session 3).
#   bash bench/search_scaling.sh MODEL TRIALS DIR [extra search flags...]
#   e.g. bash bench/search_scaling.sh pythia-410m 4 /tmp/scale --space bench/spaces/h200-small.yaml
# GPUS="1" or GPUS="2" runs only that count (the device tool caps one call at 10 minutes).
# Prints each run's wall and outcome, and a table last; copies the stores (checkpointed) and logs to $OUT when set.
set -u
model=$1 trials=$2 dir=$3
shift 3
n=$(python3 -c "import torch; print(torch.cuda.device_count())")
mkdir -p "$dir"
declare -A wall
for g in ${GPUS:-1 $n}; do
    out=$dir/gpus$g
    t0=$(date +%s)
    CUDA_VISIBLE_DEVICES=$(seq -s, 0 $((g - 1))) TORCHINDUCTOR_CACHE_DIR=$dir/inductor$g \
        timeout "${SEARCH_TIMEOUT:-420}" trainscout search --model "$model" --trials "$trials" --steps 3 --warmup 2 \
        --out "$out" "$@" > "$out.log" 2>&1
    rc=$?
    wall[$g]=$(( $(date +%s) - t0 ))
    echo "== $g GPU(s): rc=$rc wall ${wall[$g]} s"; grep -E "^ *[0-9]+ [0-9a-f]{8} |trials:|overhead|^best #1" "$out.log"
    ray stop --force > /dev/null 2>&1
    python3 -c "import sqlite3,sys; c=sqlite3.connect(sys.argv[1]); c.execute('PRAGMA wal_checkpoint(TRUNCATE)'); c.close()" \
        "$out/results.db" 2>/dev/null
    if [ -n "${OUT:-}" ]; then mkdir -p "$OUT/gpus$g"; cp "$out.log" "$out/results.db" "$OUT/gpus$g/" 2>/dev/null; fi
    [ "$n" = 1 ] && break
done
[ ${#wall[@]} -lt 2 ] && exit 0
echo
printf '%-8s %8s %8s\n' GPUs "wall s" speedup
for g in 1 "$n"; do printf '%-8s %8s %8s\n' "$g" "${wall[$g]}" "$(python3 -c "print(f'{${wall[1]}/${wall[$g]}:.2f}x')")"; done
