#!/usr/bin/env bash
# Session 47 (repository root, .venv active): PASK 0.02 + 4 sinks + k4v2 with --kv-decode lowbit: memory
# with the radix cache off and on (bf16), then accuracy on the 228 evaluation items (float32) with the
# cache off and on. See preregistration.md.
set -euo pipefail
D=bench/results/pask_lowbit_decode_2026-12-06
P=bench/results/pask_sinks_calib76_2026-12-06/keep002_sinks4.json
IDS=bench/results/pask_2bit_dropped_eval228_2026-12-05/eval228_ids.txt
SA="--chunked-prefill-size 512 --kv-decode lowbit"
python -m bench.memory --policies pask --budgets 0.02 --kv-dropped k4v2 --pask-policy $P \
  --server-args "$SA --disable-radix-cache" --breakdown --json $D/memory_radixoff.json
python -m bench.memory --policies pask --budgets 0.02 --kv-dropped k4v2 --pask-policy $P \
  --server-args "$SA" --breakdown --json $D/memory_radixon.json
BA="--kv-layer-groups 4 --kv-decode lowbit --kv-dropped k4v2 --dtype float32"
python -m bench.bfcl --server-args "$BA" --pask-policy $P --ids $IDS --concurrency 4 --max-tokens 256 \
  --budgets 0.02 --policies pask --json $D/eval228.json --markdown $D/eval228.md
python -m bench.bfcl --server-args "$BA" --pask-policy $P --ids $IDS --concurrency 4 --max-tokens 256 \
  --budgets 0.02 --policies pask --radix-cache --json $D/eval228_radixon.json --markdown $D/eval228_radixon.md
