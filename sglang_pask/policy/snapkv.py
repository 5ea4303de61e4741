"""``snapkv``: what the last window of queries attends to, max-pooled over neighbours (Li et al., 2024, arXiv 2404.14469)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from torch import Tensor

from .base import RankingPolicy
from .pooling import check_kernel_size, max_pool_by_position
from .registry import register_policy


@register_policy("snapkv")
@dataclass(frozen=True)
class SnapKVPolicy(RankingPolicy):
    """Keep the recent window, then the candidates the last-window queries attend to most.

    The scores are the attention that the last ``window`` queries pay to each candidate (recomputed
    after prefill and again as decode grows); the latest scores replace earlier ones (the default
    :meth:`~KVPolicy.accumulate_scores`). Before the top-k, scores are max-pooled over
    ``kernel_size`` neighbouring candidates in position order, so a kept token brings its
    neighbours (a name keeps its whole span of tokens).

    Attributes
    ----------
    kernel_size : int
        Odd pooling width; 1 turns pooling off.
    """

    kernel_size: int = 7

    needs_scores: ClassVar[bool] = True

    def __post_init__(self) -> None:
        check_kernel_size(self.name, self.kernel_size)

    def priority(self, positions: Tensor, roles: Tensor, scores: Tensor | None, seq_len: int) -> Tensor:
        """Scores max-pooled over ``kernel_size`` neighbours in position order.

        Returns
        -------
        Tensor
            (n,) float32: ``out[i]`` is the largest score among the candidates within
            ``kernel_size // 2`` places of ``i`` when the candidates are sorted by position.
        """
        assert scores is not None  # checked by select (needs_scores)
        return max_pool_by_position(positions, scores, self.kernel_size)
