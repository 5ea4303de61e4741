#!/usr/bin/env bash
# usage: compare.sh   (repository root): the screen's three runs beside full KV and session 43's k4v2 0.047.
set -euo pipefail
R=bench/results
S=$R/pask_sinks_calib76_2026-12-06
python -m bench.bfcl --from-json $R/pask_deferred_compression_calib76_2026-12-03/calib_f32_full.json \
  $S/calib76_sinks4.json:sinks4 $S/calib76_sinks0.json:k4v2 \
  $R/pask_lowbit_formats_calib76_2026-12-06/calib76_k4v2.json:k4v2 \
  --only full@1 pask-sinks4@0.02 pask-k4v2@0.02 streaming-llm-k4v2@0.02 pask-k4v2@0.047 \
  --compare-to full@1 pask-k4v2@0.02 streaming-llm-k4v2@0.02 --markdown $S/compare.md
