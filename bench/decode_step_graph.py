"""A decode step of a Qwen3-4B-shaped layer stack, captured in a CUDA graph: with and without this project's kernel.

One decode step of ``--batch`` requests at ``--context`` tokens through ``--layers`` decoder layers
(hidden ``--hidden``, ``--q-heads`` / ``--kv-heads`` heads of ``--head-dim``, a SwiGLU MLP of
``--intermediate``; torch stand-ins with one set of random bf16 weights shared by every layer, and one
KV cache every layer reads, far larger than the GPU's caches, so each layer pays its KV reads) is
captured once per configuration in a CUDA graph and replayed, the median of ``--repeats`` replays
timed with CUDA events:

* ``stock``: each request's KV contiguous, attention by SDPA: a captured step without this project;
* ``pergroup_full``: attention by the layer-group kernel (:mod:`lowbit_decode_attention`) over every
  token's slot in a token pool (budget 1.0);
* ``k4v2``: the same kernel over ``--full-share`` (0.02) of the tokens in full and the rest in ``k4v2``
  blocks (about 0.33 of full KV's bytes with the pool's overheads);
* ``drop``: the same kernel over ``--drop-share`` (0.33) of the tokens, the rest dropped;
* ``drop_scored``: ``drop`` plus what a decode that compresses with a scoring policy adds in every
  layer of a captured step: the query's attention to each read slot (the window-score kernel with a
  window of one query) added into a score buffer of the capacity the serving backend's CUDA-graph
  buffers have (``batch * (context + 1)`` slots).

The decode kernel takes its read lists as tensors and launches a fixed grid, so it captures as is.
Before timing, ``pergroup_full``'s step output is compared with ``stock``'s (the same tokens; ``k4v2``,
``drop`` and ``drop_scored`` read other tokens and are timed only, their kernels checked by
``kernel_decode_attention.py`` and ``kernel_window_scores.py``).
On a CPU, ``--dry-run`` runs one eager step of tiny shapes (the kernel under ``TRITON_INTERPRET=1``)
and only compares.

Usage (from the repository root; needs only torch and triton)::

    python bench/decode_step_graph.py [--batch 64] [--context 4096] [--json OUT]
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from torch.nn.functional import scaled_dot_product_attention

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from bench.common import cuda_median_ms, kernel_run_meta, load_kernel, optional_cell  # noqa: E402
from bench.kernel_decode_attention import build_inputs  # noqa: E402
from bench.layer_standins import add_mlp, random_weights, rms_norm  # noqa: E402
from sglang_pask.cli_paths import output_file  # noqa: E402

decode = load_kernel("lowbit_decode_attention")
window_scores = load_kernel("window_scores")
# Configurations that read other tokens than stock's: timed, not compared.
UNCOMPARED = ("k4v2", "drop", "drop_scored")


@dataclass
class Row:
    """One configuration; times in milliseconds (None where not timed)."""

    config: str
    step_ms: float | None
    ratio_to_stock: float | None
    max_abs_diff_to_stock: float | None
    matches_stock: bool | None


class Stack:
    """``layers`` decoder layers sharing random weights; attention is a function of the layer's queries."""

    def __init__(self, args: argparse.Namespace, device: torch.device, dtype: torch.dtype) -> None:
        weights = random_weights(
            {
                "q_proj": (args.q_heads * args.head_dim, args.hidden),
                "out": (args.hidden, args.q_heads * args.head_dim),
                "gate_up": (2 * args.intermediate, args.hidden),
                "down": (args.hidden, args.intermediate),
            },
            device,
            dtype,
            seed=1,
        )
        self.q_proj, self.out = weights["q_proj"], weights["out"]
        self.gate_up, self.down = weights["gate_up"], weights["down"]
        self.layers, self.heads, self.dim = args.layers, args.q_heads, args.head_dim

    def step(self, hidden: torch.Tensor, attend: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """``hidden`` ``(batch, hidden)``; ``attend`` maps queries ``(batch, q_heads, head_dim)`` to the
        attention output of the same shape."""
        batch = hidden.shape[0]
        for _ in range(self.layers):
            q = (rms_norm(hidden) @ self.q_proj.T).view(batch, self.heads, self.dim)
            hidden = hidden + attend(q).reshape(batch, -1) @ self.out.T
            hidden = add_mlp(hidden, self.gate_up, self.down)
        return hidden


def attention_functions(args: argparse.Namespace, device: torch.device) -> dict[str, Callable[[torch.Tensor], Any]]:
    """Per configuration, attention over the batch's KV (built once, read by every layer)."""
    full = build_inputs(args.batch, args.context, args.context, None, args, device)
    lowbit = build_inputs(args.batch, args.context, max(1, round(args.full_share * args.context)), (4, 2), args, device)
    dropped = build_inputs(args.batch, args.context, max(1, round(args.drop_share * args.context)), None, args, device)
    capacity = args.batch * (args.context + 1)
    scored_indices = torch.zeros(capacity, dtype=torch.int64, device=device)
    scored_indices[: dropped["kv_indices"].numel()] = dropped["kv_indices"]
    step_scores = torch.zeros(capacity, dtype=torch.float32, device=device)
    slots = full["kv_indices"].long().view(args.batch, args.context)
    k_contiguous = full["k_buffer"][slots].transpose(1, 2).contiguous()  # (batch, kv_heads, context, head_dim)
    v_contiguous = full["v_buffer"][slots].transpose(1, 2).contiguous()
    scale = args.head_dim**-0.5

    def stock(q: torch.Tensor) -> torch.Tensor:
        out = scaled_dot_product_attention(q[:, :, None, :], k_contiguous, v_contiguous, scale=scale, enable_gqa=True)
        return out[:, :, 0, :]

    def kernel(inputs: dict[str, Any], q: torch.Tensor) -> torch.Tensor:
        return decode.lowbit_decode_attention_triton(**{**inputs, "q": q})

    def scored(q: torch.Tensor) -> torch.Tensor:
        out = kernel(dropped, q)
        scores = window_scores.window_scores_triton(
            q[:, None], dropped["k_buffer"], dropped["kv_indptr"], scored_indices, scale
        )
        step_scores.add_(scores.sum(dim=0))
        return out

    return {
        "stock": stock,
        "pergroup_full": functools.partial(kernel, full),
        "k4v2": functools.partial(kernel, lowbit),
        "drop": functools.partial(kernel, dropped),
        "drop_scored": scored,
    }


def captured(step: Callable[[], torch.Tensor]) -> Callable[[], None]:
    """``step`` captured in a CUDA graph (after warm-up on a side stream); returns its replay."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return graph.replay


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--context", type=int, default=4096)
    parser.add_argument("--layers", type=int, default=36)
    parser.add_argument("--hidden", type=int, default=2560)
    parser.add_argument("--q-heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--intermediate", type=int, default=9728)
    parser.add_argument("--full-share", type=float, default=0.02, help="share kept in full under k4v2 (0.02)")
    parser.add_argument("--drop-share", type=float, default=0.33, help="share kept when dropping (0.33)")
    parser.add_argument("--repeats", type=int, default=50, help="timed replays (median kept; default 50)")
    parser.add_argument("--dry-run", action="store_true", help="no CUDA: one eager step of tiny shapes, compared")
    parser.add_argument("--json", type=output_file, metavar="OUT", help="also write the results as JSON")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    timed = device.type == "cuda" and not decode.runs_interpreted()
    refusal = None if timed else "not timed: no CUDA device (or TRITON_INTERPRET=1); the comparison still runs"
    if not timed and not args.dry_run:
        print(f"{refusal.split(';')[0]}; pass --dry-run (with TRITON_INTERPRET=1) to compare tiny shapes here.")
        if args.json:
            Path(args.json).write_text(json.dumps({"refused": refusal, "rows": []}, indent=2) + "\n")
        return 0
    if args.dry_run and not timed:
        args.batch, args.context, args.layers = 2, 100, 2
        args.hidden, args.q_heads, args.kv_heads, args.head_dim, args.intermediate = 64, 4, 2, 32, 128
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    stack = Stack(args, device, dtype)
    attends = attention_functions(args, device)
    hidden = torch.randn(
        args.batch, args.hidden, device=device, dtype=dtype, generator=torch.Generator(device=device).manual_seed(2)
    )
    tol = 0.05 if dtype == torch.bfloat16 else 1e-4
    rows = []
    with torch.no_grad():
        outputs = {name: stack.step(hidden, attend).float() for name, attend in attends.items()}
        bound = tol * max(1.0, outputs["stock"].abs().max().item())
        stock_ms = None
        for name, attend in attends.items():
            diff = None if name in UNCOMPARED else (outputs[name] - outputs["stock"]).abs().max().item()
            ms = cuda_median_ms(captured(lambda: stack.step(hidden, attend)), args.repeats) if timed else None
            stock_ms = ms if name == "stock" else stock_ms
            ratio = None if ms is None else ms / stock_ms
            rows.append(Row(name, ms, ratio, diff, None if name != "pergroup_full" else diff <= bound))
    meta = kernel_run_meta(
        device,
        args.repeats,
        {
            key: getattr(args, key)
            for key in (
                "batch",
                "context",
                "layers",
                "hidden",
                "q_heads",
                "kv_heads",
                "head_dim",
                "intermediate",
                "full_share",
                "drop_share",
            )
        },
    )
    print(
        f"{meta['device']}: batch {args.batch} x {args.context} tokens, {args.layers} layers; "
        f"median of {args.repeats} CUDA-graph replays"
    )
    head = f"{'config':>14} {'step ms':>9} {'x stock':>8} {'max |diff| to stock':>20}"
    print(head)
    print("-" * len(head))
    for r in rows:
        print(
            f"{r.config:>14} {optional_cell(r.step_ms, '.3f'):>9} {optional_cell(r.ratio_to_stock, '.3f'):>8}"
            f" {optional_cell(r.max_abs_diff_to_stock, '.2e'):>20}"
        )
    matches = bool(rows[1].matches_stock)
    print(
        f"x stock = step time / stock's; pergroup_full's output matches stock's: {'yes' if matches else 'NO'} "
        f"({', '.join(UNCOMPARED)} read other tokens: timed, not compared)"
    )
    if args.json:
        record = {
            "meta": meta,
            "refused": refusal,
            "rows": [asdict(r) for r in rows],
        }
        Path(args.json).write_text(json.dumps(record, indent=2) + "\n")
    return 0 if matches else 1


if __name__ == "__main__":
    sys.exit(main())
