"""Attention-output distortion: how much a layer's attention output moves when a group keeps a subset.

Used by calibration (:mod:`sglang_pask.calibrate`) to divide the residual budget between layer groups.
Pure torch.
"""

from __future__ import annotations

import torch
from torch import Tensor

from sglang_pask.kernels.window_scores import sequence_window_scores

from .base import keep_highest
from .budget import capacity


def attend(
    q: Tensor, keys: Tensor, values: Tensor, query_positions: Tensor, key_positions: Tensor, scale: float
) -> Tensor:
    """Causal attention of some queries over some keys, in float32.

    Parameters
    ----------
    q : Tensor
        ``(w, num_q_heads, head_dim)``.
    keys, values : Tensor
        ``(k, num_kv_heads, head_dim)``.
    query_positions, key_positions : Tensor
        ``(w,)`` and ``(k,)`` int64 sequence positions (a query sees keys at or before it).
    scale : float
        Logit scale.

    Returns
    -------
    Tensor
        ``(w, num_q_heads, head_dim)`` float32.
    """
    group = q.shape[1] // keys.shape[1]
    k = keys.float().repeat_interleave(group, dim=1)
    v = values.float().repeat_interleave(group, dim=1)
    logits = torch.einsum("whd,khd->hwk", q.float(), k) * scale
    visible = key_positions[None, :] <= query_positions[:, None]
    weights = torch.softmax(logits.masked_fill(~visible[None], float("-inf")), dim=-1)
    return torch.einsum("hwk,khd->whd", weights, v)


def attention_distortion(q: Tensor, keys: Tensor, values: Tensor, scale: float, budget: float, window: int) -> float:
    """Relative error of the last-window queries' attention output when only a budgeted subset stays.

    The subset is the recent ``window`` plus the best keys by window score (SnapKV order), ``capacity(
    budget, L, window)`` keys in all.

    Parameters
    ----------
    q : Tensor
        ``(w, num_q_heads, head_dim)``: the sequence's last ``w`` queries, oldest first.
    keys, values : Tensor
        ``(L, num_kv_heads, head_dim)``: all of the sequence's keys and values, in position order.
    scale : float
        Logit scale.
    budget : float
        Fraction of the keys kept, in (0, 1].
    window : int
        Newest keys always kept.

    Returns
    -------
    float
        ``||o_subset - o_full|| / ||o_full||`` over the window queries (0 when nothing is dropped).
    """
    length = keys.shape[0]
    positions = torch.arange(length, device=keys.device)
    query_positions = positions[length - q.shape[0] :]
    scores = sequence_window_scores(q.float(), keys.float(), scale).sum(dim=0)
    kept = keep_highest(scores, positions >= length - window, capacity(budget, length, window)).keep
    full = attend(q, keys, values, query_positions, positions, scale)
    subset = attend(q, keys[kept], values[kept], query_positions, positions[kept], scale)
    return float(torch.linalg.vector_norm(subset - full) / torch.linalg.vector_norm(full).clamp_min(1e-12))
