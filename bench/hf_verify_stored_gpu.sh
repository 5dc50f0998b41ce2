#!/usr/bin/env bash
# Issue 16, session 8: verify stored H200 bests again in a stock HF Trainer with the runtime hook (20 full steps),
# from copies of their stores (the originals stay as recorded). Copies the logs and verify rows into $OUT if set.
#   bash bench/hf_verify_stored_gpu.sh [STORE ...]    (default: the session-7 Pythia-160M and Llama-1B stores)
set -u
cd "$(dirname "$0")/.."
stores=${*:-bench/data/gpu-2026-12-01-s7/pythia-160m bench/data/gpu-2026-12-01-s7/llama-1b}
for s in $stores; do
  d=/tmp/verify-stored/$(basename "$s")
  rm -rf "$d"; mkdir -p "$d"; cp "$s/results.db" "$d/"; chmod -R u+w "$d"
  t1=$(date +%s)
  trainscout verify "$d" --runner hf --steps 20 --warmup 3 > "$d.verify-hf.log" 2>&1
  echo "$s verify --runner hf rc=$? wall $(( $(date +%s) - t1 )) s"; tail -6 "$d.verify-hf.log"
  ray stop --force >/dev/null 2>&1
  if [ -n "${OUT:-}" ]; then mkdir -p "$OUT/$(basename "$s")"; cp "$d.verify-hf.log" "$d"/verify-*.json "$OUT/$(basename "$s")/" 2>/dev/null; fi
done
