#!/bin/bash
# usage: run_la.sh K NAME
cd /work/main
K=$1; NAME=$2
PASK_HACK_LOOKAHEAD=$K .venv/bin/python -m bench.bfcl --server-args "--kv-layer-groups 4 --kv-decode keep --pask-policy /work/runs/s30/keep028.json" --split calib --limit 12 --concurrency 4 --max-tokens 256 --policies pask --budgets 0.28 --json /work/runs/s30/$NAME.json > /work/runs/s30/$NAME.log 2>&1
echo "$NAME rc=$?"
