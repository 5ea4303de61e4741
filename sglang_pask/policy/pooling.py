"""Max-pooling of candidate scores over neighbouring positions (SnapKV's clustering step).

A token of a multi-token span (a name, a number, a quoted value) is only useful with its neighbours;
pooling each candidate's score with its neighbours in position order lets a high-scoring token bring
its whole span into the kept set.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def check_kernel_size(owner: str, kernel_size: int) -> None:
    """Raise ValueError unless ``kernel_size`` is a positive odd number (``owner`` names the policy)."""
    if kernel_size < 1 or kernel_size % 2 == 0:
        raise ValueError(f"{owner}: kernel_size must be a positive odd number, got {kernel_size}")


def max_pool_by_position(positions: Tensor, scores: Tensor, kernel_size: int) -> Tensor:
    """Scores max-pooled over ``kernel_size`` neighbouring candidates in position order.

    Parameters
    ----------
    positions : Tensor
        (n,) int64, unique sequence positions of the candidates (any order).
    scores : Tensor
        (n,) float, one score per candidate.
    kernel_size : int
        Odd pooling width; 1 returns the scores unchanged (as float32).

    Returns
    -------
    Tensor
        (n,) float32: ``out[i]`` is the largest score among the candidates within ``kernel_size // 2``
        places of candidate ``i`` when the candidates are sorted by position.
    """
    if kernel_size == 1 or scores.numel() == 0:
        return scores.float()
    order = torch.argsort(positions)
    pooled = F.max_pool1d(scores[order].float()[None, None], kernel_size, stride=1, padding=kernel_size // 2)[0, 0]
    return torch.empty_like(pooled).index_copy_(0, order, pooled)
