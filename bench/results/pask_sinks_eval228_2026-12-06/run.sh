#!/usr/bin/env bash
# Session 45 (repository root): PASK 0.02 + k4v2 + 4 attention sinks on the 228 evaluation items (float32),
# then its memory with the radix cache off and on (bf16). See preregistration.md.
set -euo pipefail
D=bench/results/pask_sinks_eval228_2026-12-06
P=bench/results/pask_sinks_calib76_2026-12-06/keep002_sinks4.json
IDS=bench/results/pask_2bit_dropped_eval228_2026-12-05/eval228_ids.txt
python -m bench.bfcl --server-args "--kv-layer-groups 4 --kv-decode keep --kv-dropped k4v2 --dtype float32" \
  --pask-policy $P --ids $IDS --concurrency 4 --max-tokens 256 --budgets 0.02 --policies pask \
  --json $D/eval228_sinks4.json --markdown $D/eval228_sinks4.md
SA="--chunked-prefill-size 512 --kv-decode keep"
python -m bench.memory --policies pask --budgets 0.02 --kv-dropped k4v2 --pask-policy $P \
  --server-args "$SA --disable-radix-cache" --json $D/memory_sinks4_radixoff.json
python -m bench.memory --policies pask --budgets 0.02 --kv-dropped k4v2 --pask-policy $P \
  --server-args "$SA" --json $D/memory_sinks4_radixon.json
# 3. Added after runs 1-2 (preregistration.md, addendum): the accuracy run with the radix cache on.
python -m bench.bfcl --server-args "--kv-layer-groups 4 --kv-decode keep --kv-dropped k4v2 --dtype float32" \
  --pask-policy $P --ids $IDS --concurrency 4 --max-tokens 256 --budgets 0.02 --policies pask --radix-cache \
  --json $D/eval228_sinks4_radixon.json --markdown $D/eval228_sinks4_radixon.md
