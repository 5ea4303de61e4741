#!/usr/bin/env bash
# Session 45, exploratory (decides nothing; informs the next pre-registration): bytes per request of PASK
# keeping 0.01 of the prompt in full plus 4 sinks, the rest at k4v2, radix cache on (repository root; bf16).
# Policy: python -m sglang_pask.calibrate --refit sglang_pask/policy/calibrated/Qwen2.5-Coder-0.5B-Instruct.keep.json \
#   --budget 0.01 --kv-decode keep --sinks 4 --out bench/results/memory_sinks4_001_2026-12-06/keep001_sinks4.json
set -euo pipefail
M=bench/results/memory_sinks4_001_2026-12-06
python -m bench.memory --policies pask --budgets 0.01 --kv-dropped k4v2 --pask-policy $M/keep001_sinks4.json \
  --server-args "--chunked-prefill-size 512 --kv-decode keep" --json $M/memory_sinks4_001_radixon.json
