#!/usr/bin/env bash
# usage: run.sh   (repository root; bf16, the CPU default on this AVX512-BF16 machine; one job at a time)
# PASK keeping 0.047 of the prompt in full and the rest with keys at 4 bits, values at 2 (--kv-dropped
# k4v2), radix cache on (SGLang's default) and off; each run has its own full-KV baseline.
# Ran on 2026-12-06 as two separate commands (the second started by hand after the first).
set -euo pipefail
M=bench/results/memory_k4v2_2026-12-06
P=bench/results/pask_lowbit_formats_calib76_2026-12-06/keep0047.json
SA="--chunked-prefill-size 512 --kv-decode keep"
python -m bench.memory --policies pask --budgets 0.047 --kv-dropped k4v2 --pask-policy $P \
    --server-args "$SA" --json $M/memory_k4v2_0047_radixon.json
python -m bench.memory --policies pask --budgets 0.047 --kv-dropped k4v2 --pask-policy $P \
    --server-args "$SA --disable-radix-cache" --json $M/memory_k4v2_0047_radixoff.json
