#!/usr/bin/env bash
# usage: run.sh   (repository root; bf16, the CPU default on this AVX512-BF16 machine; one job at a time;
# radix cache off, as in the accuracy runs: a request's 2-bit blocks are its own)
set -euo pipefail
M=bench/results/memory_2bit_2026-12-05
L=bench/results/pask_lowbit_dropped_calib_2026-12-05
E=bench/results/pask_2bit_dropped_eval228_2026-12-05
SA="--chunked-prefill-size 512 --kv-decode keep --disable-radix-cache"
# 1. PASK and SnapKV at 0.175 + 2-bit rest
.venv/bin/python -m bench.memory --policies pask snapkv --budgets 0.175 --kv-dropped 2bit --pask-policy $L/keep0175.json \
    --server-args "$SA" --json $M/memory_2bit_0175.json --plot $M/memory_2bit_0175.png
# 2. PASK at 0.12 + 2-bit rest
.venv/bin/python -m bench.memory --policies pask --budgets 0.12 --kv-dropped 2bit --pask-policy $E/keep012.json \
    --server-args "$SA" --json $M/memory_2bit_012.json --plot $M/memory_2bit_012.png
# 3. PASK dropping at 0.28 (the standing configuration's policy)
.venv/bin/python -m bench.memory --policies pask --budgets 0.28 \
    --pask-policy bench/results/pask_schema_example_2026-12-01/pask_keep_ex48_b028.json \
    --server-args "$SA" --json $M/memory_drop_028.json --plot $M/memory_drop_028.png
