#!/usr/bin/env bash
# The checks a session runs in one call when a GPU machine is lent (the device tool), from the
# repository root, with torch and triton (all that machine has; no install of this package):
#   1. the machine: nvidia-smi, the torch / triton versions, the device name;
#   2. bench/kernel_window_scores.py and bench/kernel_skeleton_gather.py at their default shapes
#      (up to 32K tokens): compiled Triton against the torch references, timed side by side, and
#      whether Triton's results agree with them (within tolerance / bit for bit);
#   3. bench/kernel_decode_attention.py: one decode layer (Qwen3-4B shapes, batch 64, 4K and 32K
#      tokens) at full KV through the layer-group kernel, at about 0.33 of the bytes (k4v2, 2bit) and
#      dropping to 0.33, against SDPA on contiguous KV, each checked against its torch reference;
#   4. bench/decode_step_graph.py: a captured decode step of 36 Qwen3-4B-shaped layers (batch 64 x 4K),
#      attention by SDPA on contiguous KV, by the layer-group kernel at budget 1.0, at k4v2, dropping
#      to 0.33, and dropping with the window scores a compressing decode adds in the graph;
#   5. bench/structkv_prefill_stack.py: StructKV's prefill on 32 Llama-3.1-8B-shaped layers at 8K and
#      32K tokens, full against the skeleton path (centrality, pivot statistics, the Triton gather).
# Each benchmark has its own time limit (110 + 80 + 110 + 2 x 85 s: under 8 minutes in all).
# Everything goes to $OUT (the device tool's folder that comes back; ./gpu_check_out without it):
# env.txt, one .txt (the table) and one .json per benchmark, verdict.txt.
# Exit status: 0 every Triton result agrees; 1 a result disagrees or a benchmark failed; 3 Triton
# was not timed (no CUDA device: on a CPU this only checks that the script runs).
# SHAPES="2x64 1x100" (BATCHxTOKENS) replaces the default shapes, for a dry run; without CUDA the
# decode benchmark then checks tiny shapes under TRITON_INTERPRET=1 (--dry-run).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT="${OUT:-gpu_check_out}"
PYTHON="${PYTHON:-python}"
mkdir -p "$OUT"
shapes=()
if [ -n "${SHAPES:-}" ]; then
    read -r -a shapes <<< "--shapes $SHAPES"
fi

{
    nvidia-smi || echo "nvidia-smi: not available"
    "$PYTHON" -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__);
print('device', torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no CUDA device')"
} > "$OUT/env.txt" 2>&1

status=0
decode_args=()
if [ -n "${SHAPES:-}" ] && ! "$PYTHON" -c "import torch, sys; sys.exit(not torch.cuda.is_available())"; then
    decode_args=(--dry-run)
fi
echo "== kernel_decode_attention"
if ! env ${decode_args[0]:+TRITON_INTERPRET=1} timeout 110 "$PYTHON" bench/kernel_decode_attention.py \
        ${decode_args[@]+"${decode_args[@]}"} --json "$OUT/kernel_decode_attention.json" \
        > "$OUT/kernel_decode_attention.txt" 2>&1; then
    echo "kernel_decode_attention failed (exit status or timeout): see $OUT/kernel_decode_attention.txt"
    status=1
fi
cat "$OUT/kernel_decode_attention.txt"

echo "== decode_step_graph"
if ! env ${decode_args[0]:+TRITON_INTERPRET=1} timeout 80 "$PYTHON" bench/decode_step_graph.py \
        ${decode_args[@]+"${decode_args[@]}"} --json "$OUT/decode_step_graph.json" > "$OUT/decode_step_graph.txt" 2>&1; then
    echo "decode_step_graph failed (exit status or timeout): see $OUT/decode_step_graph.txt"
    status=1
fi
cat "$OUT/decode_step_graph.txt"

echo "== structkv_prefill_stack"
if ! timeout 110 "$PYTHON" bench/structkv_prefill_stack.py ${decode_args[@]+"${decode_args[@]}"} \
        --json "$OUT/structkv_prefill_stack.json" > "$OUT/structkv_prefill_stack.txt" 2>&1; then
    echo "structkv_prefill_stack failed (exit status or timeout): see $OUT/structkv_prefill_stack.txt"
    status=1
fi
cat "$OUT/structkv_prefill_stack.txt"

for bench in kernel_window_scores kernel_skeleton_gather; do
    echo "== $bench"
    if ! timeout 85 "$PYTHON" "bench/$bench.py" ${shapes[@]+"${shapes[@]}"} --json "$OUT/$bench.json" > "$OUT/$bench.txt" 2>&1; then
        echo "$bench failed (exit status or timeout): see $OUT/$bench.txt"
        status=1
    fi
    cat "$OUT/$bench.txt"
done

"$PYTHON" - "$OUT" "$status" <<'PY' | tee "$OUT/verdict.txt"
import json, sys
from pathlib import Path

out, status = Path(sys.argv[1]), int(sys.argv[2])
agree = {"kernel_window_scores": "matches_reference", "kernel_skeleton_gather": "bitwise_equal",
         "kernel_decode_attention": "matches_reference", "structkv_prefill_stack": "matches_full_at_ratio_1",
         "decode_step_graph": "matches_stock"}
not_timed = False
for bench, column in agree.items():
    path = out / f"{bench}.json"
    if not path.exists():
        print(f"{bench}: no results")
        status = 1
        continue
    record = json.loads(path.read_text())
    record.setdefault("triton_refused", record.get("refused"))
    bad = [row for row in record["rows"] if row[column] is False]
    for row in bad:
        print(f"  disagrees: {row}")
    status = status or (1 if bad else 0)
    if record["triton_refused"]:
        print(f"{bench}: {record['triton_refused']}")
        not_timed = True
        continue
    print(f"{bench}: {len(record['rows']) - len(bad)} of {len(record['rows'])} rows agree with torch ({column})")
if status == 0 and not_timed:
    status = 3
print(f"verdict: exit status {status}")
sys.exit(status)
PY
