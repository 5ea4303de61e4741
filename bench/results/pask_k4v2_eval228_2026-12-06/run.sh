#!/usr/bin/env bash
# Session 43: PASK and streaming-llm with keys at 4 bits on the 228 evaluation items (repository root).
set -euo pipefail
D=bench/results/pask_k4v2_eval228_2026-12-06
python -m bench.bfcl --server-args "--kv-layer-groups 4 --kv-decode keep --kv-dropped k4v2 --dtype float32" \
  --pask-policy bench/results/pask_lowbit_formats_calib76_2026-12-06/keep0047.json \
  --ids bench/results/pask_2bit_dropped_eval228_2026-12-05/eval228_ids.txt --concurrency 4 --max-tokens 256 \
  --policies pask streaming-llm --budgets 0.047 --json $D/eval228_k4v2.json --markdown $D/eval228_k4v2.md
