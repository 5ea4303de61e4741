#!/usr/bin/env bash
# Session 43 screen (repository root, PYTHONPATH at it): PASK at the same bytes, three block formats.
set -euo pipefail
D=bench/results/pask_lowbit_formats_calib76_2026-12-06
common=(--split calib --limit 12 --concurrency 4 --max-tokens 256 --policies pask)
flags="--kv-layer-groups 4 --kv-decode keep --dtype float32"
python -m bench.bfcl "${common[@]}" --server-args "$flags --kv-dropped k2v4" --pask-policy $D/keep0047.json --budgets 0.047 --json $D/calib76_k2v4.json --markdown $D/calib76_k2v4.md
python -m bench.bfcl "${common[@]}" --server-args "$flags --kv-dropped k4v2" --pask-policy $D/keep0047.json --budgets 0.047 --json $D/calib76_k4v2.json --markdown $D/calib76_k4v2.md
python -m bench.bfcl "${common[@]}" --server-args "$flags --kv-dropped 2bit" --pask-policy bench/results/pask_2bit_dropped_eval228_2026-12-05/keep012.json --budgets 0.12 --json $D/calib76_2bit.json --markdown $D/calib76_2bit.md
