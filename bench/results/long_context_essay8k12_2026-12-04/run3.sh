#!/usr/bin/env bash
# Essay NIAH at 8K, 6 prompts per task (12, as at 2K and 4K): full, StructKV, fixed pivot.
set -x
cd /work/main
O=/work/runs/s33/lc
git rev-parse HEAD > $O/commit5
.venv/bin/python -m bench.long_context --lengths 8192 --items 6 --tasks niah-mk niah-mv --modes full structkv fixed-pivot --interleave --json $O/essay8k12_sf.json --markdown $O/essay8k12_sf.md
echo "rc5=$?"
touch $O/done3
