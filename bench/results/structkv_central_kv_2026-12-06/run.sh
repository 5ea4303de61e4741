#!/usr/bin/env bash
# Runs 1-3 of preregistration.md, in order (repository root, .venv active).
set -euo pipefail
R=bench/results/structkv_central_kv_2026-12-06
python -m bench.long_context --lengths 2048 --first-item 35 --items 10 --tasks niah vt niah-mk niah-mv --modes full structkv structkv-central-kv --interleave --json $R/c2k_i35.json --markdown $R/c2k_i35.md
python -m bench.long_context --lengths 8192 --first-item 35 --items 5 --tasks niah vt niah-mk niah-mv --modes full structkv structkv-central-kv --interleave --json $R/c8k_i35.json --markdown $R/c8k_i35.md
python -m bench.long_context --lengths 2048 --items 20 --tasks niah vt niah-mk niah-mv --modes structkv-central-kv --json $R/ckv2k_i0.json --markdown $R/ckv2k_i0.md
# Run 4 of preregistration.md (time was left after 1-3):
python -m bench.long_context --lengths 4096 --first-item 35 --items 5 --tasks niah vt niah-mk niah-mv --modes full structkv structkv-central-kv --interleave --json $R/c4k_i35.json --markdown $R/c4k_i35.md
