"""``streaming-llm``: attention sinks plus the most recent tokens (Xiao et al., 2023, arXiv 2309.17453)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .base import RankingPolicy
from .registry import register_policy


@register_policy("streaming-llm")
@dataclass(frozen=True)
class StreamingLLMPolicy(RankingPolicy):
    """Keep the first ``num_sinks`` positions (attention sinks), then the most recent tokens.

    Scores are not used. The capacity covers the sinks because they are
    :attr:`reserved_tokens`; what is left after the sinks goes to the newest candidates, so the
    recent window is always inside it.

    Attributes
    ----------
    num_sinks : int
        Sequence positions ``0 .. num_sinks - 1`` are sinks (when they are candidates; a shared
        prefix keeps them anyway).
    """

    num_sinks: int = 4

    def __post_init__(self) -> None:
        if self.num_sinks < 0:
            raise ValueError(f"streaming-llm: num_sinks must be non-negative, got {self.num_sinks}")

    @property
    def reserved_tokens(self) -> int:
        """The sinks."""
        return self.num_sinks

    def priority(self, positions: Tensor, roles: Tensor, scores: Tensor | None, seq_len: int) -> Tensor:
        """Sinks first (priority ``seq_len``), then recency (the position itself).

        Returns
        -------
        Tensor
            (n,) int64.
        """
        return torch.where(positions < self.num_sinks, seq_len, positions)
