#!/usr/bin/env bash
# usage: run.sh   (repository root; bf16, the CPU default on this AVX512-BF16 machine; one job at a time)
# What ran on 2026-12-06 02:12-02:25 UTC: 1. commit 7fbe5a4 (a git worktree at /tmp/wt_old, started
# from there), radix cache off; 2. and 3. commit 52500ca (token-owned blocks, batched dequantization),
# radix cache off, then on.
set -euo pipefail
M=bench/results/memory_2bit_radix_2026-12-06
E=bench/results/pask_2bit_dropped_eval228_2026-12-05
SA="--chunked-prefill-size 512 --kv-decode keep"
.venv/bin/python -m bench.memory --policies pask --budgets 0.12 --kv-dropped 2bit --pask-policy $E/keep012.json \
    --server-args "$SA --disable-radix-cache" --json $M/memory_2bit_012_radixoff.json
.venv/bin/python -m bench.memory --policies pask --budgets 0.12 --kv-dropped 2bit --pask-policy $E/keep012.json \
    --server-args "$SA" --json $M/memory_2bit_012_radixon.json
