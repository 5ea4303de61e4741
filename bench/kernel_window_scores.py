"""Window-score kernel: Triton against its torch reference, timed side by side in one run.

For each shape (one attention layer: ``--q-heads`` query heads over ``--kv-heads`` kv heads, head dim
``--head-dim``, ``--dtype``), a batch of equal-length sequences whose keys sit at shuffled slots of a
token pool is scored by ``window_scores_reference`` (gather, matmul, mask, softmax, sum per sequence)
and by ``window_scores_triton``; each runs ``--repeats`` times after a warm-up and keeps its median.
The table gives both times, the speed-up, the Triton kernel's effective key bandwidth (the keys'
bytes once, over its time; it reads them twice), the largest difference between the two results and
whether they agree within the kernel tests' tolerance for the dtype.

Triton is timed only on a CUDA device with compiled kernels: interpreter timings
(``TRITON_INTERPRET=1``, the only way Triton runs on a CPU) say nothing about the kernel, so on a
machine without CUDA the Triton column is refused with a message and only the reference is timed.

Usage (from the repository root; needs only torch and triton, not an install of this package)::

    python bench/kernel_window_scores.py [--windows 8 32] [--shapes BxT ...] [--repeats N] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
# The kernel module needs only torch and triton: importing it from its folder lets this run from a bare
# checkout (the GPU benchmark machine has neither sglang nor an install of this package).
sys.path.insert(0, str(REPO_ROOT / "kernels"))
sys.path.insert(0, str(REPO_ROOT))

from window_scores import (  # noqa: E402
    SCORE_TOLERANCES,
    runs_interpreted,
    window_scores_reference,
    window_scores_triton,
)

from bench.common import kernel_run_meta, kernel_shape, median_ms, optional_cell, triton_refusal  # noqa: E402
from sglang_pask.cli_paths import output_file  # noqa: E402

# (batch, tokens per sequence): one long prompt, mid-size batches, a wide batch of short ones.
DEFAULT_SHAPES = ((1, 32768), (1, 8192), (8, 4096), (64, 1024))
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@dataclass
class Row:
    """One shape's results; times in milliseconds (``None`` where not measured)."""

    batch: int
    tokens: int
    window: int
    reference_ms: float
    triton_ms: float | None
    speedup: float | None
    triton_key_gbps: float | None
    max_abs_diff: float | None
    matches_reference: bool | None


def make_batch(batch: int, tokens: int, window: int, args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    """Inputs of the window-score functions: random keys and queries, sequences at shuffled pool slots."""
    total = batch * tokens
    pool_size = total + total // 4
    dtype = DTYPES[args.dtype]
    k_buffer = torch.randn(pool_size, args.kv_heads, args.head_dim, device=device, dtype=dtype)
    q = torch.randn(batch, window, args.q_heads, args.head_dim, device=device, dtype=dtype)
    kv_indices = torch.randperm(pool_size, device=device)[:total].to(torch.int32)
    kv_indptr = torch.arange(0, total + 1, tokens, device=device, dtype=torch.int32)
    return {"q": q, "k_buffer": k_buffer, "kv_indptr": kv_indptr, "kv_indices": kv_indices}


def bench_shape(
    batch: int, tokens: int, window: int, args: argparse.Namespace, device: torch.device, time_triton: bool
) -> Row:
    """Time the reference (and Triton when ``time_triton``) on one shape."""
    inputs = make_batch(batch, tokens, window, args, device)
    reference_ms = median_ms(lambda: window_scores_reference(**inputs), args.repeats, device)
    if not time_triton:
        return Row(batch, tokens, window, reference_ms, None, None, None, None, None)
    triton_ms = median_ms(lambda: window_scores_triton(**inputs), args.repeats, device)
    got, expected = window_scores_triton(**inputs), window_scores_reference(**inputs)
    tol = SCORE_TOLERANCES[DTYPES[args.dtype]]
    key_bytes = batch * tokens * args.kv_heads * args.head_dim * inputs["k_buffer"].element_size()
    return Row(
        batch,
        tokens,
        window,
        reference_ms,
        triton_ms,
        reference_ms / triton_ms,
        key_bytes / triton_ms / 1e6,
        (got - expected).abs().max().item(),
        torch.allclose(got, expected, atol=tol, rtol=tol),
    )


def print_table(rows: list[Row], tolerance: float) -> None:
    """One line per shape; ``tolerance`` is the atol = rtol the ``close`` column was judged by."""
    head = (
        f"{'batch':>5} {'tokens':>7} {'window':>6} {'reference ms':>13} {'triton ms':>10} {'ratio':>7}"
        f" {'triton key GB/s':>16} {'max |diff|':>11} {'close':>6}"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        close = "-" if r.matches_reference is None else ("yes" if r.matches_reference else "NO")
        print(
            f"{r.batch:>5} {r.tokens:>7} {r.window:>6} {r.reference_ms:>13.3f}"
            f" {optional_cell(r.triton_ms, '.3f'):>10} {optional_cell(r.speedup, '.1f'):>7}"
            f" {optional_cell(r.triton_key_gbps, '.0f'):>16} {optional_cell(r.max_abs_diff, '.2e'):>11} {close:>6}"
        )
    print(
        "ratio = reference ms / triton ms; key GB/s = the keys' bytes (read once) / triton ms; "
        f"close: within atol = rtol = {tolerance:g}"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--windows", type=int, nargs="+", default=[8, 32], help="query windows (StructKV uses 8, SnapKV commonly 32)"
    )
    parser.add_argument("--q-heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--dtype", choices=list(DTYPES), default="bf16")
    parser.add_argument(
        "--shapes",
        type=kernel_shape,
        nargs="+",
        default=list(DEFAULT_SHAPES),
        metavar="BxT",
        help="batch x tokens per sequence (default: " + " ".join(f"{b}x{t}" for b, t in DEFAULT_SHAPES) + ")",
    )
    parser.add_argument(
        "--repeats", type=int, help="timed calls per function (median kept); default 20 on CUDA, 1 on CPU"
    )
    parser.add_argument("--json", type=output_file, metavar="OUT", help="also write the results as JSON")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    args.repeats = args.repeats or (20 if device.type == "cuda" else 1)
    refusal = triton_refusal(device, runs_interpreted(), "the reference")
    if refusal:
        print(refusal)
    torch.manual_seed(0)
    rows = [
        bench_shape(batch, tokens, window, args, device, refusal is None)
        for window in args.windows
        for batch, tokens in args.shapes
    ]
    meta = kernel_run_meta(
        device,
        args.repeats,
        {
            "q_heads": args.q_heads,
            "kv_heads": args.kv_heads,
            "head_dim": args.head_dim,
            "dtype": args.dtype,
            "shapes": args.shapes,
        },
    )
    print(
        f"{meta['device']}: {args.q_heads} q / {args.kv_heads} kv heads, head dim {args.head_dim}, "
        f"{args.dtype}; median of {args.repeats} calls"
    )
    print_table(rows, SCORE_TOLERANCES[DTYPES[args.dtype]])
    if args.json:
        record = {"meta": meta, "triton_refused": refusal, "rows": [asdict(r) for r in rows]}
        Path(args.json).write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
