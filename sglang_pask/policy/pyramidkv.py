"""``pyramidkv``: SnapKV selection with pyramid-shaped budgets, more in lower layers (Cai et al., 2024, arXiv 2406.02069)."""

from __future__ import annotations

from dataclasses import dataclass

from .budget import check_layer_split
from .registry import register_policy
from .snapkv import SnapKVPolicy


@register_policy("pyramidkv")
@dataclass(frozen=True)
class PyramidKVPolicy(SnapKVPolicy):
    """SnapKV selection; the total budget is split between groups as a pyramid.

    Per layer ``l`` of ``L`` (all groups' layers together), budgets fall linearly from ``b_max`` at
    the lowest layer to ``b_min`` at the top, with mean ``t`` (the total budget); the linear shape and
    ``beta = 20`` are those of kvpress's ``PyramidKVPress``, which falls back to uniform budgets where
    this flattens the pyramid instead::

        b_min = t / beta,  b_max = 2 t - b_min
        if b_max > 1:  b_max = 1,  b_min = 2 t - 1      (flatter pyramid, same mean)
        b_l = b_max - (b_max - b_min) * l / (L - 1)     (b_0 = t when L = 1)

    A group's budget is the mean of its layers' ``b_l`` (a group keeps one token set), so the
    layer-weighted mean of the group budgets is ``t``, and the budgets fall with depth (strictly
    when ``t < 1``, ``beta > 1`` and there are several groups).

    Attributes
    ----------
    kernel_size : int
        As in :class:`SnapKVPolicy`.
    beta : float
        Steepness: the top layer gets ``t / beta`` (unless clipped); 1 gives uniform budgets.
    """

    beta: float = 20.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.beta >= 1.0:
            raise ValueError(f"pyramidkv: beta must be at least 1, got {self.beta}")

    def group_budgets(self, total_budget: float, num_groups: int, layers_per_group: list[int]) -> list[float]:
        """Pyramid-shaped budgets, lower groups first (see the class docstring for the formula).

        Returns
        -------
        list[float]
            (num_groups,) budgets in (0, 1], non-increasing, layer-weighted mean ``total_budget``.
        """
        check_layer_split(total_budget, num_groups, layers_per_group)
        t = float(total_budget)
        b_min = t / self.beta
        b_max = 2 * t - b_min
        if b_max > 1.0:
            b_max, b_min = 1.0, 2 * t - 1.0
        half_range = (b_max - b_min) / 2
        last = sum(layers_per_group) - 1
        budgets = []
        first = 0
        for count in layers_per_group:
            center = first + (count - 1) / 2  # b_l is linear in l: the group's mean is b at its center
            tilt = 1 - 2 * center / last if last else 0.0
            budgets.append(min(1.0, t + half_range * tilt))  # min: float error at b_max == 1
            first += count
        return budgets
