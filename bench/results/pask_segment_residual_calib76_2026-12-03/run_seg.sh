#!/bin/bash
cd /work/main
PASK_HACK_SEG=$1 .venv/bin/python -m bench.bfcl --server-args "--kv-layer-groups 4 --kv-decode keep --pask-policy /work/runs/s30/keep028.json" --split calib --limit 12 --concurrency 4 --max-tokens 256 --policies pask --budgets 0.28 --json /work/runs/s30/calib_seg$1.json > /work/runs/s30/calib_seg$1.log 2>&1
echo "seg$1 rc=$?"
