"""StructKV's prefill on a stack of Llama-3.1-8B-shaped layers: full against the skeleton path, in one run.

One prompt of each ``--contexts`` length runs through ``--layers`` decoder layers (attention with
``--q-heads`` / ``--kv-heads`` heads of ``--head-dim``, a SwiGLU MLP of ``--intermediate``; one set of
random bf16 weights shared by every layer, so the stack fits one GPU; torch stand-ins for the layers,
the timed difference is what StructKV changes) two ways, each the median of ``--repeats`` runs after
a warm-up, timed with CUDA events:

* ``full``: every layer on every token (causal SDPA);
* ``skeleton``: every layer up to the pivot on every token, and in each of them what StructKV adds:
  the last ``--window`` queries' attention to every token (recomputed, as the server does), folded
  into the decayed centrality (:class:`~sglang_pask.structkv.CentralityAccumulator`) and the pivot
  statistics (:func:`~sglang_pask.structkv.layer_statistics`: what auto pivot detection reads); after
  the pivot layer (``--pivot``, fixed so runs compare; 12 of 32 as in ``shared/notes/gpu-anchors.md``)
  the skeleton (top ``--ratio`` by pooled centrality plus the window,
  :func:`~sglang_pask.structkv.pooled_skeleton`) is gathered with the project's Triton kernel
  (:mod:`skeleton_gather`) and the later layers run on it alone.

The table gives both times and their ratio. With ``--ratio 1`` the skeleton path computes every
token, and the check compares its output with the full path's. On a CPU, ``--dry-run`` runs tiny
shapes in float32 (the gather in its torch reference) and checks only.

Usage (from the repository root; needs only torch and triton)::

    python bench/structkv_prefill_stack.py [--contexts 8192 32768] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch.nn.functional import scaled_dot_product_attention

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from bench.common import cuda_median_ms, kernel_run_meta, load_kernel, optional_cell  # noqa: E402
from bench.layer_standins import add_mlp, random_weights, rms_norm  # noqa: E402
from sglang_pask.cli_paths import output_file  # noqa: E402
from sglang_pask.structkv import CentralityAccumulator, layer_statistics, pooled_skeleton  # noqa: E402
from sglang_pask.structkv.pivot import transition_scores  # noqa: E402

skeleton_gather = load_kernel("skeleton_gather")


@dataclass
class Row:
    """One context length; times in milliseconds (None where not timed)."""

    context: int
    layers: int
    pivot: int
    skeleton_tokens: int
    full_ms: float | None
    skeleton_ms: float | None
    ratio: float | None
    matches_full_at_ratio_1: bool


class LayerStack:
    """``layers`` decoder layers sharing one set of random weights (pre-norm attention, SwiGLU MLP)."""

    def __init__(self, args: argparse.Namespace, device: torch.device, dtype: torch.dtype) -> None:
        hidden, heads, kv_heads, dim = args.hidden, args.q_heads, args.kv_heads, args.head_dim
        weights = random_weights(
            {
                "qkv": ((heads + 2 * kv_heads) * dim, hidden),
                "out": (hidden, heads * dim),
                "gate_up": (2 * args.intermediate, hidden),
                "down": (hidden, args.intermediate),
            },
            device,
            dtype,
            seed=0,
        )
        self.qkv, self.out = weights["qkv"], weights["out"]
        self.gate_up, self.down = weights["gate_up"], weights["down"]
        self.heads, self.kv_heads, self.dim = heads, kv_heads, dim

    def layer(self, hidden: torch.Tensor, window: int = 0) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One layer on ``hidden`` ``(n, hidden)``; with ``window``, also the attention its last
        ``window`` queries pay to every token, summed over heads and queries: ``(n,)`` float32."""
        n = hidden.shape[0]
        qkv = rms_norm(hidden) @ self.qkv.T
        q, k, v = qkv.split([self.heads * self.dim, self.kv_heads * self.dim, self.kv_heads * self.dim], dim=-1)
        q = q.view(n, self.heads, self.dim).transpose(0, 1)
        k = k.view(n, self.kv_heads, self.dim).transpose(0, 1)
        v = v.view(n, self.kv_heads, self.dim).transpose(0, 1)
        group = self.heads // self.kv_heads
        k, v = k.repeat_interleave(group, dim=0), v.repeat_interleave(group, dim=0)  # flash SDPA takes equal heads
        attn = scaled_dot_product_attention(q[None], k[None], v[None], is_causal=True)[0]
        hidden = hidden + attn.transpose(0, 1).reshape(n, -1) @ self.out.T
        hidden = add_mlp(hidden, self.gate_up, self.down)
        if not window:
            return hidden, None
        last = q[:, n - window :, :].float()  # (heads, w, dim)
        logits = last @ k.float().transpose(1, 2) / self.dim**0.5
        causal = (
            torch.arange(n, device=hidden.device)[None, :] > torch.arange(n - window, n, device=hidden.device)[:, None]
        )
        scores = logits.masked_fill(causal, float("-inf")).softmax(dim=-1).sum(dim=(0, 1))
        return hidden, scores


def full_prefill(stack: LayerStack, hidden: torch.Tensor, layers: int) -> torch.Tensor:
    for _ in range(layers):
        hidden, _ = stack.layer(hidden)
    return hidden


def skeleton_prefill(
    stack: LayerStack, hidden: torch.Tensor, args: argparse.Namespace
) -> tuple[torch.Tensor, torch.Tensor]:
    """The skeleton path: returns the last layer's rows ``(k, hidden)`` and their positions ``(k,)``."""
    centrality = CentralityAccumulator(0.9, 0)
    stats = []
    for _ in range(args.pivot + 1):
        hidden, scores = stack.layer(hidden, window=args.window)
        centrality.add(scores)
        stats.append(layer_statistics(scores, args.ratio))
    skeleton = pooled_skeleton(centrality.centrality(args.pivot), args.ratio, args.window)
    n = hidden.shape[0]
    gather = skeleton_gather.skeleton_gather_triton if hidden.is_cuda else skeleton_gather.skeleton_gather_reference
    positions = torch.arange(n, device=hidden.device)
    indptr = torch.tensor([0, n], device=hidden.device)
    kept = gather(hidden, positions, indptr, skeleton, torch.tensor([0, skeleton.numel()], device=hidden.device))
    hidden = kept.hidden_states
    for _ in range(args.pivot + 1, args.layers):
        hidden, _ = stack.layer(hidden)
    transition_scores(torch.stack(stats))  # what auto pivot detection computes from them
    return hidden, kept.positions


def bench_context(context: int, args: argparse.Namespace, device: torch.device, timed: bool) -> Row:
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    stack = LayerStack(args, device, dtype)
    gen = torch.Generator(device=device).manual_seed(context)
    hidden = torch.randn(context, args.hidden, device=device, dtype=dtype, generator=gen)
    with torch.no_grad():
        full = full_prefill(stack, hidden, args.layers)
        every = argparse.Namespace(**{**vars(args), "ratio": 1.0})
        rows, positions = skeleton_prefill(stack, hidden, every)
        tol = 5e-2 if dtype == torch.bfloat16 else 1e-4
        matches = positions.numel() == context and torch.allclose(rows.float(), full.float(), atol=tol, rtol=tol)
        skeleton_tokens = skeleton_prefill(stack, hidden, args)[1].numel()
        full_ms = skeleton_ms = None
        if timed:
            full_ms = cuda_median_ms(lambda: full_prefill(stack, hidden, args.layers), args.repeats, warmup=1)
            skeleton_ms = cuda_median_ms(lambda: skeleton_prefill(stack, hidden, args), args.repeats, warmup=1)
    return Row(
        context,
        args.layers,
        args.pivot,
        skeleton_tokens,
        full_ms,
        skeleton_ms,
        None if full_ms is None else skeleton_ms / full_ms,
        bool(matches),
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--contexts", type=int, nargs="+", default=[8192, 32768], help="prompt tokens")
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--pivot", type=int, default=12, help="the pivot layer (0-based; default 12)")
    parser.add_argument("--ratio", type=float, default=0.2, help="R_struct (default 0.2)")
    parser.add_argument("--window", type=int, default=8, help="observation window (default 8, the paper's)")
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--q-heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--intermediate", type=int, default=14336)
    parser.add_argument("--repeats", type=int, default=5, help="timed runs (median kept; default 5)")
    parser.add_argument("--dry-run", action="store_true", help="no CUDA: tiny shapes, checks only")
    parser.add_argument("--json", type=output_file, metavar="OUT", help="also write the results as JSON")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    timed = device.type == "cuda"
    refusal = None if timed else "not timed: no CUDA device (prefill timings on a CPU say nothing about a GPU)"
    if not timed and not args.dry_run:
        print(f"{refusal}; pass --dry-run to check tiny shapes here.")
        if args.json:
            Path(args.json).write_text(json.dumps({"refused": refusal, "rows": []}, indent=2) + "\n")
        return 0
    if args.dry_run and not timed:
        args.contexts, args.layers, args.pivot = [96], 4, 1
        args.hidden, args.q_heads, args.kv_heads, args.head_dim, args.intermediate = 64, 4, 2, 16, 128
    rows = [bench_context(context, args, device, timed) for context in args.contexts]
    meta = kernel_run_meta(
        device,
        args.repeats,
        {
            key: getattr(args, key)
            for key in (
                "contexts",
                "layers",
                "pivot",
                "ratio",
                "window",
                "hidden",
                "q_heads",
                "kv_heads",
                "head_dim",
                "intermediate",
            )
        },
    )
    print(
        f"{meta['device']}: {args.layers} layers, pivot {args.pivot}, R_struct {args.ratio}, window {args.window}; "
        f"median of {args.repeats} runs (CUDA events)"
    )
    head = f"{'context':>8} {'skeleton':>9} {'full ms':>10} {'skeleton ms':>12} {'ratio':>6} {'check':>6}"
    print(head)
    print("-" * len(head))
    for r in rows:
        print(
            f"{r.context:>8} {r.skeleton_tokens:>9} {optional_cell(r.full_ms, '.1f'):>10}"
            f" {optional_cell(r.skeleton_ms, '.1f'):>12} {optional_cell(r.ratio, '.3f'):>6}"
            f" {'yes' if r.matches_full_at_ratio_1 else 'NO':>6}"
        )
    print("ratio = skeleton ms / full ms; check: at R_struct 1 the skeleton path gives the full path's output")
    if args.json:
        record = {"meta": meta, "refused": refusal, "rows": [asdict(r) for r in rows]}
        Path(args.json).write_text(json.dumps(record, indent=2) + "\n")
    return 0 if all(r.matches_full_at_ratio_1 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
