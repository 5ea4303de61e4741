"""Skeleton gather/scatter kernels: Triton against the torch reference, timed side by side in one run.

For each shape (a packed extend batch of equal-length sequences, hidden size ``--dim``, ``--dtype``), a
StructKV selection (top ``--ratio`` by random scores plus the last ``--window`` tokens of each sequence)
is gathered from the hidden states, the residual (unless ``--no-residual``) and the positions by

- ``reference``: ``skeleton_gather_reference`` (validates the selection on the host, builds the packed
  rows sequence by sequence, indexes each tensor);
- ``torch index``: plain torch indexing with the packed rows already known (``hidden[rows]``,
  ``residual[rows]``, ``positions[rows]``): the floor a caller gets without this kernel, which a fused
  launch has to beat to pay;
- ``triton``: ``skeleton_gather_triton`` (one launch, rows found in-kernel, no host sync).

The gathered hidden states are then scattered back (``skeleton_scatter_reference``, ``out[rows] = src``
in torch, against ``skeleton_scatter_triton``). Each runs ``--repeats`` times after a warm-up and keeps
its median. The table gives the times, the reference/Triton and index/Triton ratios, Triton's effective
bandwidth (bytes read plus written, once, over its time) and whether Triton's result equals the
reference bit for bit.

Triton is timed only on a CUDA device with compiled kernels: interpreter timings
(``TRITON_INTERPRET=1``, the only way Triton runs on a CPU) say nothing about the kernel, so on a
machine without CUDA the Triton columns are refused with a message and only torch is timed.

Usage (from the repository root; needs only torch and triton, not an install of this package)::

    python bench/kernel_skeleton_gather.py [--dim 4096] [--ratio 0.2] [--shapes BxT ...] [--repeats N] [--json OUT]
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

from skeleton_gather import (  # noqa: E402
    runs_interpreted,
    skeleton_from_scores,
    skeleton_gather_reference,
    skeleton_gather_triton,
    skeleton_scatter_reference,
    skeleton_scatter_triton,
)

from bench.common import kernel_run_meta, kernel_shape, median_ms, optional_cell, triton_refusal  # noqa: E402
from sglang_pask.cli_paths import output_file  # noqa: E402

# (batch, tokens per sequence): one long prompt, mid-size batches, a wide batch of short ones.
DEFAULT_SHAPES = ((1, 32768), (1, 8192), (8, 4096), (64, 1024))
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@dataclass
class Row:
    """One (operation, shape)'s results; times in milliseconds (``None`` where not measured)."""

    op: str
    batch: int
    tokens: int
    kept: int
    reference_ms: float
    index_ms: float
    triton_ms: float | None
    speedup_vs_reference: float | None
    speedup_vs_index: float | None
    triton_gbps: float | None
    bitwise_equal: bool | None


def make_batch(batch: int, tokens: int, args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    """Inputs of the gather functions: random hidden states (and residual), positions after a cached
    prefix, and a StructKV selection over random scores."""
    total = batch * tokens
    dtype = DTYPES[args.dtype]
    extend_indptr = torch.arange(0, total + 1, tokens, device=device, dtype=torch.int32)
    keep_indices, keep_indptr = skeleton_from_scores(
        torch.rand(total, device=device), extend_indptr, args.ratio, args.window
    )
    return {
        "hidden_states": torch.randn(total, args.dim, device=device, dtype=dtype),
        "positions": 17 + torch.arange(total, device=device) % tokens,
        "extend_indptr": extend_indptr,
        "keep_indices": keep_indices.to(torch.int32),
        "keep_indptr": keep_indptr.to(torch.int32),
        "residual": None if args.no_residual else torch.randn(total, args.dim, device=device, dtype=dtype),
    }


def same_bits(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    """Whether two results are equal bit for bit (both ``None`` counts)."""
    if a is None or b is None:
        return a is b
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.is_floating_point():
        ints = {2: torch.int16, 4: torch.int32}[a.element_size()]
        a, b = a.view(ints), b.view(ints)
    return torch.equal(a, b)


def bench_shape(
    batch: int, tokens: int, args: argparse.Namespace, device: torch.device, time_triton: bool
) -> list[Row]:
    """Time gather and scatter on one shape: reference, torch index, and Triton when ``time_triton``."""
    inputs = make_batch(batch, tokens, args, device)
    hidden, residual, positions = inputs["hidden_states"], inputs["residual"], inputs["positions"]
    expected = skeleton_gather_reference(**inputs)
    rows, kept = expected.rows, expected.rows.shape[0]

    def index_gather() -> tuple[torch.Tensor, ...]:
        return (hidden[rows], positions[rows], *(() if residual is None else (residual[rows],)))

    out = torch.zeros_like(hidden)
    gather_ms = (
        median_ms(lambda: skeleton_gather_reference(**inputs), args.repeats, device),
        median_ms(index_gather, args.repeats, device),
    )
    scatter_ms = (
        median_ms(lambda: skeleton_scatter_reference(expected.hidden_states, rows, out), args.repeats, device),
        median_ms(lambda: out.index_copy_(0, rows, expected.hidden_states), args.repeats, device),
    )
    if not time_triton:
        return [
            Row("gather", batch, tokens, kept, *gather_ms, None, None, None, None, None),
            Row("scatter", batch, tokens, kept, *scatter_ms, None, None, None, None, None),
        ]

    got = skeleton_gather_triton(**inputs)
    gather_equal = all(
        same_bits(getattr(got, name), getattr(expected, name))
        for name in ("hidden_states", "positions", "residual", "rows")
    )
    scattered = skeleton_scatter_triton(expected.hidden_states, rows, torch.zeros_like(hidden))
    scatter_equal = same_bits(
        scattered, skeleton_scatter_reference(expected.hidden_states, rows, torch.zeros_like(hidden))
    )
    row_bytes = hidden.shape[1] * hidden.element_size()
    rows_read_written = 2 * kept * row_bytes
    gather_bytes = rows_read_written * (1 if residual is None else 2) + kept * (
        inputs["keep_indices"].element_size() + 3 * positions.element_size()
    )  # keep list; positions in, out; rows
    scatter_bytes = rows_read_written + kept * rows.element_size()
    triton_gather_ms = median_ms(lambda: skeleton_gather_triton(**inputs), args.repeats, device)
    triton_scatter_ms = median_ms(
        lambda: skeleton_scatter_triton(expected.hidden_states, rows, out), args.repeats, device
    )

    def row(op: str, torch_ms: tuple[float, float], triton_ms: float, nbytes: int, equal: bool) -> Row:
        return Row(
            op,
            batch,
            tokens,
            kept,
            *torch_ms,
            triton_ms,
            torch_ms[0] / triton_ms,
            torch_ms[1] / triton_ms,
            nbytes / triton_ms / 1e6,
            equal,
        )

    return [
        row("gather", gather_ms, triton_gather_ms, gather_bytes, gather_equal),
        row("scatter", scatter_ms, triton_scatter_ms, scatter_bytes, scatter_equal),
    ]


def print_table(rows: list[Row]) -> None:
    """One line per (operation, shape)."""
    head = (
        f"{'op':>7} {'batch':>5} {'tokens':>7} {'kept':>6} {'reference ms':>13} {'index ms':>9}"
        f" {'triton ms':>10} {'ref/tri':>8} {'idx/tri':>8} {'triton GB/s':>12} {'bitwise':>8}"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        equal = "-" if r.bitwise_equal is None else ("yes" if r.bitwise_equal else "NO")
        print(
            f"{r.op:>7} {r.batch:>5} {r.tokens:>7} {r.kept:>6} {r.reference_ms:>13.3f} {r.index_ms:>9.3f}"
            f" {optional_cell(r.triton_ms, '.3f'):>10} {optional_cell(r.speedup_vs_reference, '.1f'):>8}"
            f" {optional_cell(r.speedup_vs_index, '.2f'):>8} {optional_cell(r.triton_gbps, '.0f'):>12} {equal:>8}"
        )
    print(
        "ref/tri, idx/tri = reference ms or torch index ms / triton ms; GB/s = bytes read and written once / triton ms"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dim", type=int, default=4096, help="hidden size (Llama-3.1-8B: 4096)")
    parser.add_argument("--dtype", choices=list(DTYPES), default="bf16")
    parser.add_argument("--ratio", type=float, default=0.2, help="share kept by score (StructKV's R_struct)")
    parser.add_argument("--window", type=int, default=8, help="trailing tokens always kept")
    parser.add_argument("--no-residual", action="store_true", help="gather the hidden states without a residual")
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
    refusal = triton_refusal(device, runs_interpreted(), "torch")
    if refusal:
        print(refusal)
    torch.manual_seed(0)
    rows = [row for batch, tokens in args.shapes for row in bench_shape(batch, tokens, args, device, refusal is None)]
    meta = kernel_run_meta(
        device,
        args.repeats,
        {
            "dim": args.dim,
            "dtype": args.dtype,
            "ratio": args.ratio,
            "window": args.window,
            "residual": not args.no_residual,
            "shapes": args.shapes,
        },
    )
    print(
        f"{meta['device']}: hidden size {args.dim}, {args.dtype}, ratio {args.ratio} + window {args.window}, "
        f"{'with' if meta['residual'] else 'without'} residual; median of {args.repeats} calls"
    )
    print_table(rows)
    if args.json:
        record = {"meta": meta, "triton_refused": refusal, "rows": [asdict(r) for r in rows]}
        Path(args.json).write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
