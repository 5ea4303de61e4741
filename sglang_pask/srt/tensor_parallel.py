"""Tensor parallelism: every rank keeps the same tokens, and ``/server_info`` shows each rank's pool.

Under ``--tp-size N`` each rank holds some KV heads of the same tokens and runs its own scheduler over
its own layer-group pool. The policies' scores are attention summed over heads, so a rank alone would
rank tokens by its own heads and keep others than its peers: their slot counts, admission and
scheduling would diverge. :func:`score_reducer` sums each step's scores over the attention
tensor-parallel group before any policy reads them, so every rank decides on all heads (the
decisions are then the same on every rank: same requests, same roles from the same grammars, same
scores). :func:`gather_rank_reports` collects one report per rank for ``/server_info``.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch
from sglang.srt.distributed.parallel_state import get_attn_tp_group
from torch import Tensor


def _group() -> Any:
    return get_attn_tp_group()


def score_reducer() -> Optional[Callable[[Tensor], None]]:
    """``(k,)`` float32 scores -> summed over the attention TP group's ranks, in place; None on one
    rank. CPU tensors go through the group's gloo group, device tensors through its device group."""
    group = _group()
    if group.world_size == 1:
        return None

    def reduce(scores: Tensor) -> None:
        torch.distributed.all_reduce(scores, group=group.device_group if scores.is_cuda else group.cpu_group)

    return reduce


def gather_rank_reports(report: dict[str, Any]) -> Optional[list[dict[str, Any]]]:
    """Every rank's ``report``, in rank order, on every rank; None on one rank. Every rank of the
    group must call it (each scheduler answers ``/server_info``'s internal-state request)."""
    group = _group()
    if group.world_size == 1:
        return None
    return list(group.all_gather_object({**report, "tp_rank": group.rank_in_group}))
