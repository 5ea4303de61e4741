#!/usr/bin/env bash
# Session 44 screen (repository root): PASK with and without attention sinks beside streaming-llm, k4v2 at 0.02.
set -euo pipefail
S=bench/results/pask_sinks_calib76_2026-12-06
common=(--split calib --limit 12 --concurrency 4 --max-tokens 256 --budgets 0.02)
flags="--kv-layer-groups 4 --kv-decode keep --kv-dropped k4v2 --dtype float32"
python -m bench.bfcl "${common[@]}" --server-args "$flags" --policies pask --pask-policy $S/keep002_sinks4.json \
  --json $S/calib76_sinks4.json --markdown $S/calib76_sinks4.md
python -m bench.bfcl "${common[@]}" --server-args "$flags" --policies pask streaming-llm \
  --pask-policy bench/results/pask_k4v2_003_eval228_2026-12-06/keep002.json \
  --json $S/calib76_sinks0.json --markdown $S/calib76_sinks0.md
