"""``full``: keep every token (no compression; the reference for budget 1.0)."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from .base import KeepDecision, KVPolicy
from .budget import check_layer_split
from .registry import register_policy


@register_policy("full")
@dataclass(frozen=True)
class FullPolicy(KVPolicy):
    """Keep every candidate in every layer group, whatever the total budget.

    Every group's budget is 1.0, so its capacity equals its candidate count and :meth:`select` keeps
    everything; greedy output is that of stock SGLang.
    """

    def group_budgets(self, total_budget: float, num_groups: int, layers_per_group: list[int]) -> list[float]:
        """Budget 1.0 for every group (the total budget is not used).

        Returns
        -------
        list[float]
            (num_groups,) ones.
        """
        check_layer_split(total_budget, num_groups, layers_per_group)
        return [1.0] * num_groups

    def choose(
        self,
        positions: Tensor,
        roles: Tensor,
        scores: Tensor | None,
        capacity: int,
        window: int,
        seq_len: int,
    ) -> KeepDecision:
        """Refuse: ``full`` never drops a token, so a capacity below the candidate count is a bug.

        Raises
        ------
        ValueError
            Always (the message names the numbers).
        """
        raise ValueError(
            f"KV policy 'full' keeps every token, but was given capacity {capacity} for "
            f"{positions.numel()} candidates (its group budgets are 1.0)"
        )
