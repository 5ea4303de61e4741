#!/usr/bin/env bash
# 8K noise haystack (niah + vt), current code: full, StructKV, fixed pivot; then full, GemFilter-style, SnapKV.
set -x
cd /work/main
O=/work/runs/s33/lc
git rev-parse HEAD > $O/commit1
.venv/bin/python -m bench.long_context --lengths 8192 --items 5 --tasks niah vt --modes full structkv fixed-pivot --interleave --json $O/noise8k_sf.json --markdown $O/noise8k_sf.md
echo "rc1=$?"
git rev-parse HEAD > $O/commit2
.venv/bin/python -m bench.long_context --lengths 8192 --items 5 --tasks niah vt --modes full gemfilter snapkv --interleave --json $O/noise8k_gs.json --markdown $O/noise8k_gs.md
echo "rc2=$?"
touch $O/done
