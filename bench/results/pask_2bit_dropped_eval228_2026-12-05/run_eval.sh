#!/usr/bin/env bash
# usage: run_eval.sh   (repository root; 228 evaluation items, float32, --kv-dropped 2bit at 0.175)
set -euo pipefail
D=bench/results/pask_2bit_dropped_eval228_2026-12-05
.venv/bin/python -m bench.bfcl --server-args "--kv-layer-groups 4 --kv-decode keep --kv-dropped 2bit --dtype float32" \
    --pask-policy bench/results/pask_lowbit_dropped_calib_2026-12-05/keep0175.json \
    --ids "$D/eval228_ids.txt" --concurrency 4 --max-tokens 256 --policies pask snapkv streaming-llm --budgets 0.175 \
    --json "$D/eval228_2bit.json" --markdown "$D/eval228_2bit.md"
