"""Torch stand-ins for the non-attention parts of a decoder layer, shared by the layer-stack benchmarks
(``decode_step_graph.py``, ``structkv_prefill_stack.py``): random weights, RMS norm, a SwiGLU MLP.
They cost what a real layer costs in matmuls; their values mean nothing."""

from __future__ import annotations

import torch
from torch.nn.functional import silu


def random_weights(
    shapes: dict[str, tuple[int, int]], device: torch.device, dtype: torch.dtype, seed: int
) -> dict[str, torch.Tensor]:
    """A ``(rows, cols)`` matrix per name, entries of variance ``1 / cols`` (activations keep their scale)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    return {
        name: (torch.randn(rows, cols, device=device, generator=gen) / cols**0.5).to(dtype)
        for name, (rows, cols) in shapes.items()
    }


def rms_norm(x: torch.Tensor) -> torch.Tensor:
    """``x`` ``(..., hidden)`` over its RMS (no learned scale)."""
    return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(x.dtype)


def add_mlp(hidden: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
    """``hidden`` ``(n, hidden)`` plus a pre-norm SwiGLU MLP (``gate_up`` ``(2 I, hidden)``, ``down`` ``(hidden, I)``)."""
    gate, up = (rms_norm(hidden) @ gate_up.T).chunk(2, dim=-1)
    return hidden + (silu(gate) * up) @ down.T
