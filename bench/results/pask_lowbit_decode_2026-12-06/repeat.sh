#!/usr/bin/env bash
# Session 47 (repository root, .venv active): run 2 of run.sh once more (memory, radix cache on), see
# preregistration.md's last section.
set -euo pipefail
D=bench/results/pask_lowbit_decode_2026-12-06
P=bench/results/pask_sinks_calib76_2026-12-06/keep002_sinks4.json
python -m bench.memory --policies pask --budgets 0.02 --kv-dropped k4v2 --pask-policy $P \
  --server-args "--chunked-prefill-size 512 --kv-decode lowbit" --breakdown --json $D/memory_radixon_repeat.json
