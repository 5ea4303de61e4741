#!/usr/bin/env bash
# usage: run_rotated.sh   (repository root; 228 evaluation items, float32, PASK 0.12 + 2-bit rest with
# Hadamard-rotated values (kernels/kv_2bit.py at the commit that added the rotation), radix cache off)
set -euo pipefail
D=bench/results/pask_2bit_radix_eval228_2026-12-06
E=bench/results/pask_2bit_dropped_eval228_2026-12-05
.venv/bin/python -m bench.bfcl --server-args "--kv-layer-groups 4 --kv-decode keep --kv-dropped 2bit --dtype float32" \
    --pask-policy "$E/keep012.json" \
    --ids "$E/eval228_ids.txt" --concurrency 4 --max-tokens 256 --policies pask --budgets 0.12 \
    --json "$D/eval228_2bit_012_rotated.json" --markdown "$D/eval228_2bit_012_rotated.md"
