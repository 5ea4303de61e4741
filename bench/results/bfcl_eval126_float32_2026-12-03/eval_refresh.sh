#!/bin/bash
cd /work/main
while pgrep -f "bench.bfcl --server-args --kv-layer-groups 4 --kv-decode keep\" --split calib" >/dev/null || pgrep -f "calib_f32_full" >/dev/null; do sleep 10; done
.venv/bin/python -m bench.bfcl --server-args "--kv-layer-groups 4 --kv-decode keep --pask-policy bench/results/pask_schema_example_2026-12-01/pask_keep_ex48_b028.json" --split eval --limit 16 --concurrency 4 --max-tokens 256 --policies pask --budgets 0.28 --json /work/runs/s31/eval126_pask.json > /work/runs/s31/eval126_pask.log 2>&1
echo "pask rc=$?"
.venv/bin/python -m bench.bfcl --server-args "--kv-layer-groups 4 --kv-decode keep" --split eval --limit 16 --concurrency 4 --max-tokens 256 --policies full streaming-llm snapkv --budgets 0.28 --json /work/runs/s31/eval126_base.json > /work/runs/s31/eval126_base.log 2>&1
echo "base rc=$?"
