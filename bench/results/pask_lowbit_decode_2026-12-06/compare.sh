#!/usr/bin/env bash
# usage: compare.sh   (repository root): PASK 0.02 + 4 sinks + k4v2 with --kv-decode lowbit, cache off and on,
# beside session 46's --kv-decode keep runs of the same mechanism and the standing runs of the same 228 items.
set -euo pipefail
R=bench/results
D=$R/pask_lowbit_decode_2026-12-06
K=$R/pask_row_budget_2026-12-06
python -m bench.bfcl --from-json $R/bfcl_eval126_float32_2026-12-03/eval126_base.json \
  $R/bfcl_1.5B_eval228_2026-12-05/next102_0.5B.json \
  $K/eval228.json:keep $K/eval228_radixon.json:keepradix \
  $D/eval228.json:lowbit $D/eval228_radixon.json:lowbitradix \
  --only full@1 pask-lowbit@0.02 pask-lowbitradix@0.02 pask-keep@0.02 pask-keepradix@0.02 streaming-llm@0.28 \
  --compare-to full@1 streaming-llm@0.28 pask-keep@0.02 pask-keepradix@0.02 \
  --markdown $D/compare.md
