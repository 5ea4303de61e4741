#!/usr/bin/env bash
# usage: run_streaming.sh   (repository root; 228 evaluation items, float32, streaming-llm 0.12 + 2-bit rest, radix cache off)
set -euo pipefail
D=bench/results/pask_2bit_radix_eval228_2026-12-06
E=bench/results/pask_2bit_dropped_eval228_2026-12-05
.venv/bin/python -m bench.bfcl --server-args "--kv-layer-groups 4 --kv-decode keep --kv-dropped 2bit --dtype float32" \
    --ids "$E/eval228_ids.txt" --concurrency 4 --max-tokens 256 --policies streaming-llm --budgets 0.12 \
    --json "$D/eval228_2bit_012_streaming.json" --markdown "$D/eval228_2bit_012_streaming.md"
