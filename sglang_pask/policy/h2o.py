"""``h2o``: heavy hitters by accumulated attention plus the recent window (Zhang et al., 2023, arXiv 2306.14048)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from .base import RankingPolicy, check_accumulate
from .registry import register_policy


@register_policy("h2o")
@dataclass(frozen=True)
class H2OPolicy(RankingPolicy):
    """Keep the recent window, then the candidates with the most attention accumulated so far.

    Scores add up over a request's life (:meth:`accumulate_scores`): each call's ``new`` scores
    should hold the attention the candidates received from the queries since the previous call, so
    no query is counted twice.
    """

    needs_scores: ClassVar[bool] = True
    scores_from_window: ClassVar[bool] = False

    def accumulate_scores(self, previous: Tensor | None, new: Tensor) -> Tensor:
        """Sum: ``out[i] = previous[i] + new[i]`` for old candidates, ``new[i]`` for new ones.

        Parameters
        ----------
        previous : Tensor or None
            (m,) float running sums, or None.
        new : Tensor
            (n,) float with ``n >= m``.

        Returns
        -------
        Tensor
            (n,) float.
        """
        check_accumulate(previous, new)
        if previous is None:
            return new
        m = previous.numel()
        return torch.cat([previous + new[:m], new[m:]])

    def priority(self, positions: Tensor, roles: Tensor, scores: Tensor | None, seq_len: int) -> Tensor:
        """The accumulated scores.

        Returns
        -------
        Tensor
            (n,) float.
        """
        assert scores is not None  # checked by select (needs_scores)
        return scores
