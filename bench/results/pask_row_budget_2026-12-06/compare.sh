#!/usr/bin/env bash
# usage: compare.sh   (repository root): PASK 0.02 + 4 sinks + k4v2 with the row budget and whole blocks,
# cache off and on, beside session 45's runs of the unchanged mechanism and the standing runs of the same 228 items.
set -euo pipefail
R=bench/results
D=$R/pask_row_budget_2026-12-06
S=$R/pask_sinks_eval228_2026-12-06
python -m bench.bfcl --from-json $R/bfcl_eval126_float32_2026-12-03/eval126_base.json \
  $R/bfcl_1.5B_eval228_2026-12-05/next102_0.5B.json \
  $S/eval228_sinks4.json:sinks4 $S/eval228_sinks4_radixon.json:sinks4radix \
  $D/eval228.json:rowbudget $D/eval228_radixon.json:rowbudgetradix \
  --only full@1 pask-rowbudget@0.02 pask-rowbudgetradix@0.02 pask-sinks4@0.02 pask-sinks4radix@0.02 streaming-llm@0.28 \
  --compare-to full@1 streaming-llm@0.28 pask-sinks4@0.02 pask-sinks4radix@0.02 \
  --markdown $D/compare.md
