"""Decode attention per layer: the layer-group kernel at full KV, at 0.33 of the bytes, dropping, side by side.

For each context length, one decode step of one attention layer (``--q-heads`` query heads over
``--kv-heads`` KV heads, head dim ``--head-dim``, bf16; Qwen3-4B's shapes by default) for a batch of
``--batch`` requests is timed five ways in one run, each the median of ``--repeats`` calls after a
warm-up, with CUDA events:

* ``contiguous``: each request's KV contiguous, read by SDPA (torch's fused attention): what a
  decode step without this project costs (SGLang's own triton decode kernel cannot be installed on
  the benchmark machine; SDPA runs at the bandwidth limit there, ``shared/notes/gpu-anchors.md``);
* ``pergroup_full``: the layer-group kernel (:mod:`lowbit_decode_attention`) over every token's slot
  in a token pool, as a layer group at budget 1.0 reads it;
* ``k4v2``: ``--full-share`` (0.02) of each request's tokens in full precision, the rest in ``k4v2``
  blocks (keys 4 bits, values 2), read and dequantized in the same kernel: the configuration of
  about 0.33 of full KV's bytes (the bytes column gives the measured share);
* ``2bit``: the same with both halves at 2 bits;
* ``drop``: ``--drop-share`` (0.33) of the tokens kept in full, the rest gone.

Before timing, each layer-group configuration is checked against the kernel's torch reference on
fresh inputs (the first ``--check-requests`` requests of a batch of the same shape). The table gives
each time, the bytes read as a share of full KV's, and the speed-up against ``pergroup_full`` and
``contiguous``.

Triton is timed only on a CUDA device with compiled kernels. On a CPU, ``--dry-run`` runs the checks
on tiny shapes under ``TRITON_INTERPRET=1`` and times nothing (the GPU check script's dry run).

Usage (from the repository root; needs only torch and triton)::

    python bench/kernel_decode_attention.py [--contexts 4096 32768] [--batch 64] [--json OUT]
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from bench.common import cuda_median_ms, kernel_run_meta, load_kernel, optional_cell, triton_refusal  # noqa: E402
from sglang_pask.cli_paths import output_file  # noqa: E402

decode = load_kernel("lowbit_decode_attention")
kv_lowbit = load_kernel("kv_lowbit")

#: name -> (key bits, value bits) of the low-bit configurations.
LOWBIT = {"k4v2": (4, 2), "2bit": (2, 2)}


@dataclass
class Row:
    """One context length and configuration; times in milliseconds (None where not timed)."""

    context: int
    config: str
    bytes_share: float
    ms: float | None
    speedup_vs_pergroup_full: float | None
    speedup_vs_contiguous: float | None
    max_abs_diff: float | None
    matches_reference: bool | None


def build_inputs(
    batch: int,
    context: int,
    full_tokens: int,
    bits: tuple[int, int] | None,
    args: argparse.Namespace,
    device: torch.device,
) -> dict[str, Any]:
    """A token pool and the kernel's arguments: each request ``full_tokens`` tokens at its own run of
    slots and, with ``bits``, the rest of its ``context`` tokens in low-bit blocks in other slots."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    gen = torch.Generator(device=device).manual_seed(batch * 7919 + context + full_tokens)
    heads, dim = args.kv_heads, args.head_dim
    lowbit_tokens = context - full_tokens if bits else 0
    blocks = -(-lowbit_tokens // kv_lowbit.BLOCK_TOKENS)
    rows = kv_lowbit.rows_per_block(*bits, torch.finfo(dtype).bits // 8) if bits else 1
    slots = batch * (full_tokens + blocks * rows) + 1
    k_buffer = torch.randn(slots, heads, dim, device=device, dtype=dtype, generator=gen)
    v_buffer = torch.randn(slots, heads, dim, device=device, dtype=dtype, generator=gen)
    kv_indices = torch.arange(1, batch * full_tokens + 1, device=device, dtype=torch.int32)
    block_slots = torch.zeros((batch * blocks, rows), dtype=torch.int64, device=device)
    if blocks:
        block_slots = torch.arange(batch * full_tokens + 1, slots, device=device).view(batch * blocks, rows)
        tokens = kv_lowbit.BLOCK_TOKENS
        for start in range(0, batch * blocks, 256):  # pack real blocks, a chunk at a time
            chunk = block_slots[start : start + 256]
            keys = torch.randn(chunk.shape[0], tokens, heads, dim, device=device, generator=gen)
            values = torch.randn(chunk.shape[0], tokens, heads, dim, device=device, generator=gen)
            packed = torch.cat(
                (kv_lowbit.quantize_key_blocks(keys, bits[0]), kv_lowbit.quantize_value_blocks(values, bits[1])), dim=1
            )
            halves = packed.view(chunk.shape[0], 2, -1)
            k_buffer[chunk.reshape(-1)] = halves[:, 0].contiguous().view(dtype).reshape(-1, heads, dim)
            v_buffer[chunk.reshape(-1)] = halves[:, 1].contiguous().view(dtype).reshape(-1, heads, dim)
    last = lowbit_tokens - (blocks - 1) * kv_lowbit.BLOCK_TOKENS if blocks else 0
    masks = torch.full((batch, max(blocks, 1)), (1 << kv_lowbit.BLOCK_TOKENS) - 1, dtype=torch.int64, device=device)
    if blocks:
        masks[:, -1] = (1 << last) - 1
    return {
        "q": torch.randn(batch, args.q_heads, dim, device=device, dtype=dtype, generator=gen),
        "k_buffer": k_buffer,
        "v_buffer": v_buffer,
        "kv_indptr": torch.arange(0, batch * full_tokens + 1, full_tokens, device=device, dtype=torch.int32),
        "kv_indices": kv_indices,
        "block_indptr": (torch.arange(batch + 1, device=device) * blocks).to(torch.int32),
        "block_slots": block_slots,
        "block_masks": masks[:, :blocks].reshape(-1),
        "key_bits": bits[0] if bits else 4,
        "value_bits": bits[1] if bits else 2,
        "sm_scale": dim**-0.5,
    }


def bytes_share(context: int, full_tokens: int, bits: tuple[int, int] | None, itemsize: int) -> float:
    """Bytes a request's decode step reads, as a share of reading all ``context`` tokens in full."""
    if not bits:
        return full_tokens / context
    blocks = -(-(context - full_tokens) // kv_lowbit.BLOCK_TOKENS)
    return (full_tokens + blocks * kv_lowbit.rows_per_block(*bits, itemsize)) / context


def check(inputs: dict[str, Any], requests: int) -> tuple[float, bool]:
    """The kernel against its torch reference on the first ``requests`` requests of ``inputs``."""
    batch = inputs["q"].shape[0]
    requests = min(requests, batch)
    blocks_per = int(inputs["block_indptr"][1]) if batch else 0
    sub = {
        **inputs,
        "q": inputs["q"][:requests],
        "kv_indptr": inputs["kv_indptr"][: requests + 1],
        "block_indptr": inputs["block_indptr"][: requests + 1],
        "block_slots": inputs["block_slots"][: requests * blocks_per],
        "block_masks": inputs["block_masks"][: requests * blocks_per],
    }
    got = decode.lowbit_decode_attention_triton(**sub)
    expected = decode.lowbit_decode_attention_reference(**sub)
    diff = (got.float() - expected.float()).abs().max().item()
    tol = 2e-2 if got.dtype == torch.bfloat16 else 2e-4
    return diff, torch.allclose(got.float(), expected.float(), atol=tol, rtol=tol)


def configurations(context: int, args: argparse.Namespace) -> list[tuple[str, int, tuple[int, int] | None]]:
    """(name, full-precision tokens per request, low-bit widths or None) of every layer-group configuration."""
    full_share = max(1, round(args.full_share * context))
    return [
        ("pergroup_full", context, None),
        ("k4v2", full_share, LOWBIT["k4v2"]),
        ("2bit", full_share, LOWBIT["2bit"]),
        ("drop", max(1, round(args.drop_share * context)), None),
    ]


def bench_context(context: int, args: argparse.Namespace, device: torch.device, timed: bool) -> list[Row]:
    """Every configuration at ``context`` tokens: checked, then (``timed``) timed."""
    itemsize = 2 if device.type == "cuda" else 4
    rows = []
    contiguous_ms = None
    if timed:
        q = torch.randn(args.batch, args.q_heads, 1, args.head_dim, device=device, dtype=torch.bfloat16)
        k = torch.randn(args.batch, args.kv_heads, context, args.head_dim, device=device, dtype=torch.bfloat16)
        v = torch.randn_like(k)
        sdpa = torch.nn.functional.scaled_dot_product_attention
        contiguous_ms = cuda_median_ms(lambda: sdpa(q, k, v, enable_gqa=True), args.repeats)
        del q, k, v
        rows.append(Row(context, "contiguous", 1.0, contiguous_ms, None, 1.0, None, None))
    full_ms = None
    for name, full_tokens, bits in configurations(context, args):
        inputs = build_inputs(
            args.check_requests if not timed else args.batch, context, full_tokens, bits, args, device
        )
        diff, close = check(inputs, args.check_requests)
        step = functools.partial(decode.lowbit_decode_attention_triton, **inputs)
        ms = cuda_median_ms(step, args.repeats) if timed else None
        if name == "pergroup_full":
            full_ms = ms
        rows.append(
            Row(
                context,
                name,
                bytes_share(context, full_tokens, bits, itemsize),
                ms,
                None if ms is None or full_ms is None else full_ms / ms,
                None if ms is None or contiguous_ms is None else contiguous_ms / ms,
                diff,
                close,
            )
        )
        del inputs, step
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def print_table(rows: list[Row]) -> None:
    head = (
        f"{'context':>8} {'config':>14} {'bytes':>6} {'ms':>9} {'x pergroup_full':>16} {'x contiguous':>13}"
        f" {'max |diff|':>11} {'close':>6}"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        close = "-" if r.matches_reference is None else ("yes" if r.matches_reference else "NO")
        print(
            f"{r.context:>8} {r.config:>14} {r.bytes_share:>6.3f} {optional_cell(r.ms, '.4f'):>9}"
            f" {optional_cell(r.speedup_vs_pergroup_full, '.2f'):>16} {optional_cell(r.speedup_vs_contiguous, '.2f'):>13}"
            f" {optional_cell(r.max_abs_diff, '.2e'):>11} {close:>6}"
        )
    print(
        "bytes: what a step reads as a share of full KV's; x: that configuration's speed-up (time of the "
        "other over its time); close: the kernel against its torch reference"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--contexts", type=int, nargs="+", default=[4096, 32768], help="tokens per request")
    parser.add_argument("--batch", type=int, default=64, help="requests per decode step (default: 64)")
    parser.add_argument("--q-heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument(
        "--full-share",
        type=float,
        default=0.02,
        help="share of tokens kept in full in the low-bit configurations (default: 0.02)",
    )
    parser.add_argument("--drop-share", type=float, default=0.33, help="share kept when dropping (default: 0.33)")
    parser.add_argument(
        "--check-requests",
        type=int,
        default=4,
        help="requests of each configuration checked against the reference (default: 4)",
    )
    parser.add_argument("--repeats", type=int, default=50, help="timed calls (median kept; default: 50)")
    parser.add_argument(
        "--dry-run", action="store_true", help="no CUDA: check tiny shapes under TRITON_INTERPRET=1 and time nothing"
    )
    parser.add_argument("--json", type=output_file, metavar="OUT", help="also write the results as JSON")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    refusal = triton_refusal(device, decode.runs_interpreted(), "nothing")
    if refusal:
        refusal = refusal.replace("; only nothing is timed.", "; the checks against the torch reference still run.")
    if refusal and not args.dry_run:
        print(f"{refusal} Pass --dry-run (with TRITON_INTERPRET=1) to check tiny shapes here.")
        if args.json:
            Path(args.json).write_text(json.dumps({"triton_refused": refusal, "rows": []}, indent=2) + "\n")
        return 0
    if args.dry_run:
        args.contexts, args.q_heads, args.kv_heads, args.head_dim = [100], 4, 2, 32
        args.check_requests = args.batch = 2
    rows = [row for context in args.contexts for row in bench_context(context, args, device, refusal is None)]
    options = {
        key: getattr(args, key)
        for key in ("contexts", "batch", "q_heads", "kv_heads", "head_dim", "full_share", "drop_share")
    }
    meta = kernel_run_meta(device, args.repeats, options)
    print(
        f"{meta['device']}: batch {args.batch}, {args.q_heads} q / {args.kv_heads} kv heads, head dim "
        f"{args.head_dim}; median of {args.repeats} calls (CUDA events)"
    )
    print_table(rows)
    if args.json:
        Path(args.json).write_text(
            json.dumps({"meta": meta, "triton_refused": refusal, "rows": [asdict(r) for r in rows]}, indent=2) + "\n"
        )
    return 0 if all(r.matches_reference is not False for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
