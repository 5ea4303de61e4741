#!/usr/bin/env bash
# Session 44: PASK and streaming-llm keeping 0.02 of the prompt in full (0.03 measured above 0.33 with the radix cache on; see preregistration.md), the rest with keys at 4 bits and
# values at 2, on the 228 evaluation items (repository root); float32. See preregistration.md.
set -euo pipefail
D=bench/results/pask_k4v2_003_eval228_2026-12-06
IDS=bench/results/pask_2bit_dropped_eval228_2026-12-05/eval228_ids.txt
FLAGS="--kv-layer-groups 4 --kv-decode keep --kv-dropped k4v2 --dtype float32"
common=(--pask-policy $D/keep002.json --ids $IDS --concurrency 4 --max-tokens 256 --budgets 0.02)
# 1. radix cache off (the bench's default)
python -m bench.bfcl --server-args "$FLAGS" "${common[@]}" --policies pask streaming-llm \
  --json $D/eval228_k4v2_002.json --markdown $D/eval228_k4v2_002.md
# 2. radix cache on (SGLang's default): started at 09:48 UTC and stopped after 4 items to make room for
#    the sinks screen (pask_sinks_calib76_2026-12-06); no figure of it exists.
python -m bench.bfcl --server-args "$FLAGS" "${common[@]}" --policies pask --radix-cache \
  --json $D/eval228_k4v2_002_radixon.json --markdown $D/eval228_k4v2_002_radixon.md
