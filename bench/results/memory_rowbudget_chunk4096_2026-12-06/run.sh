#!/usr/bin/env bash
# Session 46, exploratory (decides nothing): the row budget's bytes with the radix cache on when prefill
# passes are SGLang's 4096-token chunks (as in the accuracy runs) instead of 512, on an 8192-token pool.
set -euo pipefail
D=bench/results/memory_rowbudget_chunk4096_2026-12-06
P=bench/results/pask_sinks_calib76_2026-12-06/keep002_sinks4.json
python -m bench.memory --policies pask --budgets 0.02 --kv-dropped k4v2 --pask-policy $P --max-total-tokens 8192 \
  --server-args "--chunked-prefill-size 4096 --kv-decode keep" --breakdown --json $D/memory_radixon.json
