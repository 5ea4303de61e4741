#!/usr/bin/env bash
# usage: run_calib.sh POLICY_JSON OUT_NAME  (repository root; 76 calibration items, float32, PASK at 0.28)
set -euo pipefail
D=bench/results/pask_restore_attribution_calib76_2026-12-05
.venv/bin/python -m bench.bfcl --server-args "--kv-layer-groups 4 --kv-decode keep --dtype float32" \
    --pask-policy "$1" --split calib --limit 12 --concurrency 4 --max-tokens 256 --policies pask --budgets 0.28 \
    --json "$D/$2.json" --markdown "$D/$2.md"
