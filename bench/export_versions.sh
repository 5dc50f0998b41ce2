#!/usr/bin/env bash
# Exports against the lowest transformers and accelerate the pyproject allows: a virtual environment with them
# (default 4.50.0 / 1.6.0), then the export tests run there: every format of real tiny measurements is built by its
# consumer (TrainingArguments, DeepSpeed's parser, accelerate's launch checks), 2 stock HF Trainer steps run from
# the HF export with the runtime hook, and the H200 measurements in bench/data export (trainscout export --format all).
#   bash bench/export_versions.sh [VENV] [TRANSFORMERS] [ACCELERATE]
set -eu
cd "$(dirname "$0")/.."
venv=${1:-/tmp/trainscout-lowest} tf=${2:-4.50.0} acc=${3:-1.6.0}
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/pip" install -q torch==2.13.0
"$venv/bin/pip" install -q -e ".[test]" "transformers==$tf" "accelerate==$acc"
"$venv/bin/python" -c "import transformers, accelerate; print('transformers', transformers.__version__, 'accelerate', accelerate.__version__)"
for d in bench/data/gpu-2026-12-01-s7/pythia-160m bench/data/gpu-2026-12-01-s7/llama-1b; do
    out=$(mktemp -d)
    "$venv/bin/trainscout" export "$d" --best --format all --out "$out" > "$out.log" 2>&1 \
        && echo "export $d: ok ($(ls "$out" | tr '\n' ' '))" || { echo "export $d: FAILED"; tail -3 "$out.log"; }
done
"$venv/bin/python" -m pytest -q -p no:cacheprovider tests/test_runtime_hf.py tests/test_analysis.py \
    -k "hook or export or spelled or deepspeed"
