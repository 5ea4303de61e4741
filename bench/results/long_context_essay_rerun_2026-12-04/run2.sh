#!/usr/bin/env bash
# Essay NIAH (multi-key, multi-value) at 2K and 4K with the current code: full, StructKV, fixed pivot; then 4K full, GemFilter-style, SnapKV.
set -x
cd /work/main
O=/work/runs/s33/lc
git rev-parse HEAD > $O/commit3
.venv/bin/python -m bench.long_context --lengths 2048 4096 --items 6 --tasks niah-mk niah-mv --modes full structkv fixed-pivot --interleave --json $O/essay2k4k_sf.json --markdown $O/essay2k4k_sf.md
echo "rc3=$?"
.venv/bin/python -m bench.long_context --lengths 4096 --items 6 --tasks niah-mk niah-mv --modes full gemfilter snapkv --interleave --json $O/essay4k_gs.json --markdown $O/essay4k_gs.md
echo "rc4=$?"
touch $O/done2
