#!/usr/bin/env bash
# usage: compare.sh   (repository root): PASK 0.02 + k4v2 with 4 sinks beside the standing runs of the same 228 items.
set -euo pipefail
R=bench/results
D=$R/pask_sinks_eval228_2026-12-06
python -m bench.bfcl --from-json $R/bfcl_eval126_float32_2026-12-03/eval126_base.json \
  $R/bfcl_1.5B_eval228_2026-12-05/next102_0.5B.json \
  $R/pask_k4v2_003_eval228_2026-12-06/eval228_k4v2_002.json:k4v2 \
  $D/eval228_sinks4.json:sinks4 $D/eval228_sinks4_radixon.json:sinks4radix \
  --only full@1 pask-sinks4@0.02 pask-sinks4radix@0.02 pask-k4v2@0.02 streaming-llm-k4v2@0.02 streaming-llm@0.28 \
  --compare-to full@1 streaming-llm@0.28 streaming-llm-k4v2@0.02 pask-k4v2@0.02 pask-sinks4@0.02 \
  --markdown $D/compare.md
