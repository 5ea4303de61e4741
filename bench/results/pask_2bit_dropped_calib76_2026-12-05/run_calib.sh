#!/usr/bin/env bash
# usage: run_calib.sh OUT_NAME POLICIES...   (repository root; the 76 calibration items, float32, prompt
# budget 0.175 kept in full, every dropped prompt token kept at 2 bits: --kv-dropped 2bit)
set -euo pipefail
D=bench/results/pask_2bit_dropped_calib76_2026-12-05
name=$1; shift
.venv/bin/python -m bench.bfcl --server-args "--kv-layer-groups 4 --kv-decode keep --kv-dropped 2bit --dtype float32" \
    --pask-policy bench/results/pask_lowbit_dropped_calib_2026-12-05/keep0175.json \
    --split calib --limit 12 --concurrency 4 --max-tokens 256 --policies "$@" --budgets 0.175 \
    --json "$D/$name.json" --markdown "$D/$name.md"
