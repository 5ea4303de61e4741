"""One-off: the default model's 2K-token prefill in bfloat16 and in float32 on this CPU, side by side.

Both servers (``python -m sglang_pask.launch_server``, full KV, one layer group per layer, chunked
prefill and radix cache off, as ``bench.long_context`` runs them) are up at once; each prompt goes to
each dtype in turn, the other server frozen meanwhile. Prints each TTFT and the median ratio.

    PYTHONPATH=. .venv/bin/python bench/results/cpu_dtype_2026-12-03/dtype_prefill.py [--items 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from transformers import AutoTokenizer

from bench.common import run_header
from bench.long_context import ask, build_items
from sglang_pask.default_model import ensure_default_model
from sglang_pask.launch_server import cpu_has_native_bf16
from sglang_pask.server_process import ServerProcess

DTYPES = ("bfloat16", "float32")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=3)
    args = parser.parse_args()
    print(run_header("bench/results/cpu_dtype_2026-12-03/dtype_prefill.py", sys.argv[1:]))
    print(f"native bf16 flags in /proc/cpuinfo: {cpu_has_native_bf16()}")
    model = str(ensure_default_model())
    items = build_items(AutoTokenizer.from_pretrained(model), ["niah-mk"], [2048], args.items)
    servers: dict[str, ServerProcess] = {}
    ttft: dict[str, list[float]] = {dtype: [] for dtype in DTYPES}
    with tempfile.TemporaryDirectory() as logs:
        try:
            for dtype in DTYPES:
                servers[dtype] = ServerProcess(
                    ["--model-path", model, "--dtype", dtype, "--disable-radix-cache", "--chunked-prefill-size", "-1",
                     "--kv-layer-groups", "24", "--max-total-tokens", "65536"],
                    Path(logs) / f"{dtype}.log").wait_ready(timeout_s=900)
                ask(servers[dtype].url, items[0])  # warm-up, not counted
                servers[dtype].pause()
            for item in items:
                for dtype in DTYPES:
                    servers[dtype].resume()
                    answer, seconds, _ = ask(servers[dtype].url, item)
                    servers[dtype].pause()
                    ttft[dtype].append(seconds)
                    print(f"item {item.index} {dtype:>8}: TTFT {seconds:6.2f} s, correct {all(p in answer for p in item.expected)}",
                          flush=True)
        finally:
            for server in servers.values():
                server.stop()
    bf16, fp32 = (statistics.median(ttft[d]) for d in DTYPES)
    print(f"median TTFT: bfloat16 {bf16:.2f} s, float32 {fp32:.2f} s, bfloat16 / float32 {bf16 / fp32:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
