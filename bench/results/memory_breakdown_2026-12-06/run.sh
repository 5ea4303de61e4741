#!/usr/bin/env bash
# Session 46 (repository root, .venv active): where PASK 0.02 + 4 sinks + k4v2's slots go, radix cache on, then off.
# Ran with bench/memory.py as committed in 00a5637 (the JSONs say da87dc6-dirty: that diff was the --breakdown option).
set -euo pipefail
D=bench/results/memory_breakdown_2026-12-06
P=bench/results/pask_sinks_calib76_2026-12-06/keep002_sinks4.json
SA="--chunked-prefill-size 512 --kv-decode keep"
python -m bench.memory --policies pask --budgets 0.02 --kv-dropped k4v2 --pask-policy $P \
  --server-args "$SA" --breakdown --json $D/breakdown_radixon.json
python -m bench.memory --policies pask --budgets 0.02 --kv-dropped k4v2 --pask-policy $P \
  --server-args "$SA --disable-radix-cache" --breakdown --json $D/breakdown_radixoff.json
