#!/bin/bash
cd /work/main
for b in 0.5 0.4; do
  .venv/bin/python -m bench.bfcl --server-args "--kv-layer-groups 4 --kv-decode keep --pask-policy /work/runs/s17/pask_keep_b$b.json" --split eval --limit 16 --concurrency 4 --max-tokens 256 --policies pask --budgets $b --json /work/runs/s17/pask_b$b.json > /work/runs/s17/pask_b$b.log 2>&1
  echo "pask $b rc=$?"
done
.venv/bin/python -m bench.bfcl --server-args "--kv-layer-groups 4 --kv-decode keep" --split eval --limit 16 --concurrency 4 --max-tokens 256 --policies streaming-llm snapkv --budgets 0.5 --json /work/runs/s17/base_b0.5.json --markdown /work/runs/s17/base_b0.5.md > /work/runs/s17/base_b0.5.log 2>&1
echo "base rc=$?"
