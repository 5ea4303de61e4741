#!/usr/bin/env bash
# usage: run.sh   (repository root; bf16, the CPU default on this AVX512-BF16 machine; one job at a time)
# PASK keeping 0.03 of the prompt in full and the rest with keys at 4 bits, values at 2 (--kv-dropped
# k4v2), radix cache off and on; each run has its own full-KV baseline.
set -euo pipefail
M=bench/results/memory_k4v2_003_2026-12-06
P=bench/results/pask_k4v2_003_eval228_2026-12-06/keep003.json
SA="--chunked-prefill-size 512 --kv-decode keep"
python -m bench.memory --policies pask --budgets 0.03 --kv-dropped k4v2 --pask-policy $P \
    --server-args "$SA --disable-radix-cache" --json $M/memory_k4v2_003_radixoff.json
python -m bench.memory --policies pask --budgets 0.03 --kv-dropped k4v2 --pask-policy $P \
    --server-args "$SA" --json $M/memory_k4v2_003_radixon.json
# 0.03 measured 0.32 (radix off) and 0.35 (radix on); by the pre-registration
# (pask_k4v2_003_eval228_2026-12-06/preregistration.md) the same two runs at 0.02:
P2=bench/results/pask_k4v2_003_eval228_2026-12-06/keep002.json
python -m bench.memory --policies pask --budgets 0.02 --kv-dropped k4v2 --pask-policy $P2 \
    --server-args "$SA" --json $M/memory_k4v2_002_radixon.json
python -m bench.memory --policies pask --budgets 0.02 --kv-dropped k4v2 --pask-policy $P2 \
    --server-args "$SA --disable-radix-cache" --json $M/memory_k4v2_002_radixoff.json
