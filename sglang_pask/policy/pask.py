"""``pask``: parser-aware structural KV persistence (PASK, arXiv 2608.28276).

Each layer group ``g`` has, for every structural role ``r``, a protection *floor* ``f[g, r]`` in
[0, 1] (from task-error sensitivity, calibrated offline) and a *residual share* of the total budget
(from attention-output distortion). Online, for one (request, group):

1. the recent window and the table's attention sinks (the first ``sinks`` positions, 0 unless the
   policy file says) are kept;
2. for each role ``r`` among the candidates, the ``ceil(f[g, r] * count_r)`` best-scored candidates of
   that role are protected;
3. the rest of the capacity is filled by score.

Scores are max-pooled over ``kernel_size`` neighbouring positions first (as SnapKV does,
:mod:`.pooling`), so a kept token brings the rest of its span.

If the window and the floors together exceed the capacity, the floors lose their lowest-scored
tokens first: a group never keeps more than its capacity. Only table lookups, sorts and a top-k run
on the hot path. With every floor at zero this is the score-ordered fill.

A *tiered* table (:attr:`PaskTable.lowbit`, for a server with a low-bit ``--kv-dropped`` format)
gives each (group, role) three tiers: of role ``r``'s candidates, the best-scored ``f[g, r]`` share is
kept at full precision (as above), the next ``l[g, r]`` share at low bits, and the rest is evicted
(:attr:`~.base.KeepDecision.lowbit`). A candidate the capacity pushes out of the full tier falls to
the low-bit tier when its role's cumulative share ``f + l`` covers it. Without ``lowbit`` every
candidate not kept goes to the server's ``--kv-dropped`` mode.

The group budgets follow the residual shares: group ``g`` with ``L_g`` of the ``L`` layers gets
``b_g = share_g * t * L / L_g`` of total budget ``t`` (the layer-weighted mean stays ``t``), clipped
at 1 with the excess handed to the other groups in proportion to their shares.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import ClassVar, Optional

import torch
from torch import Tensor

from sglang_pask.structure.roles import Role

from .base import KeepDecision, KVPolicy
from .budget import check_layer_split
from .pooling import check_kernel_size, max_pool_by_position
from .registry import register_policy

NUM_ROLES = len(Role)


@dataclass(frozen=True)
class PaskTable:
    """A calibrated PASK table (see :mod:`.pask_file` for its file form).

    Attributes
    ----------
    floors : tuple[tuple[float, ...], ...]
        ``(num_groups, NUM_ROLES)``: the floor of each role (by :class:`Role` value) in each group.
    residual_shares : tuple[float, ...]
        ``(num_groups,)``, summing to 1: each group's share of the total KV budget.
    layers_per_group : tuple[int, ...]
        ``(num_groups,)`` layers in each group.
    role_frequencies : tuple[float, ...]
        ``(NUM_ROLES,)``: each role's share of the tokens in the calibration data (sums to 1).
    sinks : int
        Positions ``0 .. sinks - 1`` are always kept, as StreamingLLM's attention sinks, on top of
        the budget (:attr:`PaskPolicy.reserved_tokens`); 0 keeps none.
    lowbit : tuple[tuple[float, ...], ...] or None
        ``(num_groups, NUM_ROLES)``: the share of each role's candidates kept at low bits after its
        floor's share at full precision (``floors + lowbit <= 1``; the rest is evicted). None: an
        untiered table (every candidate not kept goes to the server's ``--kv-dropped`` mode).
    """

    floors: tuple[tuple[float, ...], ...]
    residual_shares: tuple[float, ...]
    layers_per_group: tuple[int, ...]
    role_frequencies: tuple[float, ...]
    sinks: int = 0
    lowbit: Optional[tuple[tuple[float, ...], ...]] = None

    def __post_init__(self) -> None:
        groups = len(self.layers_per_group)
        if groups < 1 or any(n < 1 for n in self.layers_per_group):
            raise ValueError(
                f"layers_per_group must list at least one group of at least one layer, "
                f"got {list(self.layers_per_group)}"
            )
        if len(self.floors) != groups or any(len(row) != NUM_ROLES for row in self.floors):
            raise ValueError(f"floors must be {groups} rows of {NUM_ROLES} roles")
        if any(not 0.0 <= f <= 1.0 for row in self.floors for f in row):
            raise ValueError("every floor must be in [0, 1]")
        if len(self.residual_shares) != groups or any(s < 0 for s in self.residual_shares):
            raise ValueError(f"residual_shares must be {groups} non-negative numbers")
        if not math.isclose(sum(self.residual_shares), 1.0, abs_tol=1e-6):
            raise ValueError(f"residual_shares must sum to 1, got {sum(self.residual_shares):.6g}")
        if len(self.role_frequencies) != NUM_ROLES or any(f < 0 for f in self.role_frequencies):
            raise ValueError(f"role_frequencies must be {NUM_ROLES} non-negative numbers")
        if isinstance(self.sinks, bool) or not isinstance(self.sinks, int) or self.sinks < 0:
            raise ValueError(f"sinks must be a non-negative integer, got {self.sinks!r}")
        if self.lowbit is not None:
            if len(self.lowbit) != groups or any(len(row) != NUM_ROLES for row in self.lowbit):
                raise ValueError(f"lowbit must be {groups} rows of {NUM_ROLES} roles")
            pairs = [(f, q) for floors, shares in zip(self.floors, self.lowbit) for f, q in zip(floors, shares)]
            if any(not 0.0 <= q <= 1.0 or f + q > 1.0 + 1e-9 for f, q in pairs):
                raise ValueError("every lowbit share must be in [0, 1], and at most 1 minus its role's floor")

    def group_budgets(self, total_budget: float) -> list[float]:
        """``(num_groups,)`` budgets from the residual shares (module docstring), each in (0, 1]."""
        layers = list(self.layers_per_group)
        total_layers = sum(layers)
        budgets = [0.0] * len(layers)
        open_groups = set(range(len(layers)))
        mass = total_budget * total_layers  # layer-tokens still to place
        while open_groups:
            shares = sum(self.residual_shares[g] for g in open_groups)
            clipped = False
            for g in sorted(open_groups):
                share = self.residual_shares[g] / shares if shares > 0 else 1.0 / len(open_groups)
                if share * mass / layers[g] >= 1.0:
                    budgets[g] = 1.0
                    mass -= layers[g]
                    open_groups.discard(g)
                    clipped = True
            if not clipped:
                for g in open_groups:
                    share = self.residual_shares[g] / shares if shares > 0 else 1.0 / len(open_groups)
                    budgets[g] = share * mass / layers[g]
                break
        return [max(b, 1e-9) for b in budgets]

    def protected_fraction(self, group: int) -> float:
        """The expected fraction of a request's tokens that group ``group``'s floors protect."""
        return sum(f * p for f, p in zip(self.floors[group], self.role_frequencies))

    def lowbit_fraction(self, group: int) -> float:
        """The expected fraction of a request's tokens that group ``group`` keeps at low bits by their
        roles' shares (0 for an untiered table)."""
        if self.lowbit is None:
            return 0.0
        return sum(q * p for q, p in zip(self.lowbit[group], self.role_frequencies))


def check_floors_fit(table: PaskTable, budgets: list[float]) -> None:
    """Raise ValueError if some group's floors protect more than its budget (by role frequencies)."""
    for group, budget in enumerate(budgets):
        protected = table.protected_fraction(group)
        if protected > budget + 1e-9:
            raise ValueError(
                f"the floors of layer group {group} protect an expected {protected:.3f} of the tokens, "
                f"more than the group's budget {budget:.3f}: lower those floors or raise --kv-budget"
            )


@register_policy("pask")
@dataclass(frozen=True)
class PaskPolicy(KVPolicy):
    """Role floors first, then the residual by score (module docstring).

    Attributes
    ----------
    table : PaskTable or None
        The calibrated table; None means every floor at zero and uniform shares.
    group : int or None
        The layer group this instance decides for (:meth:`for_group`); None uses zero floors.
    kernel_size : int
        Odd width of the max-pooling of scores over neighbouring positions; 1 turns it off.
    """

    table: Optional[PaskTable] = None
    group: Optional[int] = None
    kernel_size: int = 7
    needs_scores: ClassVar[bool] = True
    uses_roles: ClassVar[bool] = True

    def __post_init__(self) -> None:
        check_kernel_size(self.name, self.kernel_size)

    def for_group(self, group: int) -> "PaskPolicy":
        """The policy as it decides for layer group ``group`` (that group's floors)."""
        return dataclasses.replace(self, group=group)

    @property
    def tiered(self) -> bool:
        """Whether decisions carry a low-bit tier (the table has :attr:`PaskTable.lowbit`) and this
        instance decides for one group."""
        return self.table is not None and self.table.lowbit is not None and self.group is not None

    def lowbit_shares(self, num_groups: int) -> Optional[list[float]]:
        """A tiered table's expected low-bit share per group (:meth:`PaskTable.lowbit_fraction`), else None."""
        if self.table is None or self.table.lowbit is None:
            return None
        return [self.table.lowbit_fraction(g) for g in range(num_groups)]

    @property
    def reserved_tokens(self) -> int:
        """The table's attention sinks (0 without a table)."""
        return 0 if self.table is None else self.table.sinks

    def group_budgets(self, total_budget: float, num_groups: int, layers_per_group: list[int]) -> list[float]:
        """Budgets from the table's residual shares; uniform without a table.

        Raises
        ------
        ValueError
            If the table was calibrated for other layer groups, or its floors exceed a budget.
        """
        check_layer_split(total_budget, num_groups, layers_per_group)
        if self.table is None:
            return [float(total_budget)] * num_groups
        if list(self.table.layers_per_group) != list(layers_per_group):
            raise ValueError(
                f"the PASK policy was calibrated for layer groups of {list(self.table.layers_per_group)} layers, "
                f"the server has {list(layers_per_group)}"
            )
        budgets = self.table.group_budgets(total_budget)
        check_floors_fit(self.table, budgets)
        return budgets

    def choose(
        self, positions: Tensor, roles: Tensor, scores: Tensor | None, capacity: int, window: int, seq_len: int
    ) -> KeepDecision:
        """Window and sinks, then floors (best-scored first within each role), then the residual by
        score (scores max-pooled over neighbouring positions)."""
        assert scores is not None  # checked by select (needs_scores)
        scores = max_pool_by_position(positions, scores, self.kernel_size)
        n = positions.numel()
        tier = torch.zeros(n, dtype=torch.int64, device=positions.device)
        if self.table is not None and self.group is not None:
            floors = torch.tensor(self.table.floors[self.group], dtype=torch.float64, device=positions.device)
            tier[floor_protected(roles, scores, floors)] = 1
        tier[(positions >= seq_len - window) | (positions < self.reserved_tokens)] = 2
        order = torch.sort(scores.float(), descending=True, stable=True).indices
        order = order[torch.sort(tier[order], descending=True, stable=True).indices]
        keep, evict = torch.sort(order[:capacity]).values, torch.sort(order[capacity:]).values
        if not self.tiered:
            return KeepDecision(keep, evict)
        assert self.table is not None and self.table.lowbit is not None and self.group is not None
        cumulative = torch.tensor(
            [min(1.0, f + q) for f, q in zip(self.table.floors[self.group], self.table.lowbit[self.group])],
            dtype=torch.float64,
            device=positions.device,
        )
        lowbit = evict[floor_protected(roles, scores, cumulative)[evict]]
        return KeepDecision(keep, evict, lowbit)


def floor_protected(roles: Tensor, scores: Tensor, floors: Tensor) -> Tensor:
    """Which candidates their role's floor protects.

    Parameters
    ----------
    roles : Tensor
        ``(n,)`` int64 role values.
    scores : Tensor
        ``(n,)`` float scores.
    floors : Tensor
        ``(NUM_ROLES,)`` float floors.

    Returns
    -------
    Tensor
        ``(n,)`` bool: the ``ceil(floor[r] * count_r)`` best-scored candidates of each role ``r``.
    """
    n = roles.numel()
    by_score = torch.sort(scores.float(), descending=True, stable=True).indices
    order = by_score[torch.sort(roles[by_score], stable=True).indices]  # by role, best score first
    sorted_roles = roles[order]
    counts = torch.bincount(roles, minlength=NUM_ROLES)
    starts = torch.cumsum(counts, 0) - counts
    rank = torch.arange(n, device=roles.device) - starts[sorted_roles]
    quota = torch.ceil(floors[sorted_roles] * counts[sorted_roles] - 1e-9)
    protected = torch.zeros(n, dtype=torch.bool, device=roles.device)
    protected[order] = rank < quota
    return protected
