#!/usr/bin/env bash
# Session 47 (repository root, .venv active): which blocks a request reads under PASK 0.02 + 4 sinks + k4v2,
# radix cache on, and what fills their places that are not the request's own (exploratory: decides nothing).
set -euo pipefail
D=bench/results/block_places_2026-12-06
P=bench/results/pask_sinks_calib76_2026-12-06/keep002_sinks4.json
python -m bench.memory --policies pask --budgets 0.02 --kv-dropped k4v2 --pask-policy $P \
  --server-args "--chunked-prefill-size 512 --kv-decode keep" --breakdown --json $D/places_radixon.json
# Second run: a pool no workload fills (65536 tokens), so the radix cache never evicts: places freed
# here come from elsewhere (duplicates freed on insertion, tokens of finished requests not cached).
python -m bench.memory --policies pask --budgets 0.02 --kv-dropped k4v2 --pask-policy $P --max-total-tokens 65536 \
  --server-args "--chunked-prefill-size 512 --kv-decode keep" --breakdown --json $D/places_radixon_pool65536.json
