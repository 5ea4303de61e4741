"""How many physical slots each layer group's pool gets, for the same KV bytes as SGLang's pool.

SGLang sizes one pool of ``P`` slots for every layer. Groups that keep different fractions of each
request (pyramidkv, pask) fill at different rates when every group has ``P`` slots: the group with the
largest budget runs out first and bounds admission while the others sit half empty. So each group
``g`` (``L_g`` of the ``L`` layers, budget ``b_g``) gets slots in proportion to what it keeps, for the
same bytes: ``sum_g L_g P_g <= L P``.

Not everything a group holds scales with its budget. Prefill writes a pass's tokens to every group
before the policy compresses them (a pass is at most the server's chunked-prefill size), and every
request keeps its window, the policy's reserved tokens and the decode slack in every group, however
small the budget. So every group first gets the same *fixed* part ``F`` (one prefill pass plus that
per-request minimum for :data:`FIXED_PART_REQUESTS` requests, never more than ``P``), and the rest of
the bytes is split by budget::

    b_mean = sum_g L_g b_g / L
    P_g    = floor(F + (P - F) * b_g / b_mean)

Then ``sum_g L_g P_g <= L P`` (equal up to the floor of each group), ``P_g >= F`` for every group,
and ``P_g = P`` for every group when the budgets are all equal (uniform policies, ``full``) or when
``F = P`` (e.g. chunked prefill off: one pass may be as long as the pool).

:func:`plan_layout` puts it together: the :class:`LayerGroupLayout` (each group's layers and slots,
and the virtual ids they back) that the pool (:mod:`sglang_pask.srt.pool`) is built on.

Pure Python (no torch, no sglang).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Optional

# Requests whose fixed per-group minimum (window + reserved tokens + decode slack) the fixed part
# holds: about what a small pool serves at once at total budgets near 0.3 (the memory benchmark's
# full-KV pool serves about 11, compressed about 25).
FIXED_PART_REQUESTS = 32


def fixed_group_slots(physical_slots: int, prefill_chunk: Optional[int], per_request_minimum: int) -> int:
    """``F``: the slots every group gets whatever its budget.

    Parameters
    ----------
    physical_slots : int
        ``P``, the slots SGLang sized its pool to.
    prefill_chunk : int or None
        The most tokens one prefill pass writes (``--chunked-prefill-size``); None or non-positive
        when chunked prefill is off (a pass may then fill the pool: ``F = P``).
    per_request_minimum : int
        Tokens every request keeps in every group (window + reserved tokens + decode slack).

    Returns
    -------
    int
        ``min(P, prefill_chunk + FIXED_PART_REQUESTS * per_request_minimum)``.
    """
    if physical_slots < 1:
        raise ValueError(f"the pool needs at least one slot, got {physical_slots}")
    if per_request_minimum < 0:
        raise ValueError(f"the per-request minimum must be non-negative, got {per_request_minimum}")
    if prefill_chunk is None or prefill_chunk <= 0:
        return physical_slots
    return min(physical_slots, prefill_chunk + FIXED_PART_REQUESTS * per_request_minimum)


def group_slot_counts(
    physical_slots: int, budgets: Sequence[float], layers_per_group: Sequence[int], fixed_slots: int
) -> list[int]:
    """``(num_groups,)`` physical slots per group: ``floor(F + (P - F) * b_g / b_mean)``.

    Parameters
    ----------
    physical_slots : int
        ``P``.
    budgets : Sequence[float]
        ``(num_groups,)`` group budgets in (0, 1].
    layers_per_group : Sequence[int]
        ``(num_groups,)`` layers in each group.
    fixed_slots : int
        ``F`` in ``[0, P]`` (:func:`fixed_group_slots`).

    Raises
    ------
    ValueError
        If the lengths differ, a group has no layer, a budget is outside (0, 1] or ``F`` is outside
        ``[0, P]``.
    """
    if len(budgets) != len(layers_per_group) or not budgets:
        raise ValueError(f"{len(budgets)} budgets for {len(layers_per_group)} layer groups")
    if any(n < 1 for n in layers_per_group):
        raise ValueError(f"every layer group needs at least one layer, got {list(layers_per_group)}")
    if any(not (0.0 < b <= 1.0) for b in budgets):
        raise ValueError(f"group budgets must be in (0, 1], got {list(budgets)}")
    if not 0 <= fixed_slots <= physical_slots:
        raise ValueError(f"the fixed part must be in [0, {physical_slots}], got {fixed_slots}")
    if max(budgets) == min(budgets):
        return [physical_slots] * len(budgets)
    mean = sum(b * n for b, n in zip(budgets, layers_per_group)) / sum(layers_per_group)
    return [math.floor(fixed_slots + (physical_slots - fixed_slots) * b / mean + 1e-9) for b in budgets]


def virtual_slot_count(group_slots: Sequence[int], budgets: Sequence[float]) -> int:
    """``V``: the token ids the groups' slots back.

    A request holds an id for every one of its tokens but, in group ``g``, a slot only for about
    ``b_g`` of them, so group ``g``'s ``P_g`` slots serve about ``P_g / b_g`` ids (more with the
    fixed window). Ids cost only map entries, so ``V = ceil(2 min_g P_g / b_g)`` leaves the groups'
    slots, not the ids, as what runs out; ``V = P`` when every budget is 1.0 (SGLang's own capacity).
    """
    if len(group_slots) != len(budgets) or not budgets:
        raise ValueError(f"{len(group_slots)} slot counts for {len(budgets)} budgets")
    if min(budgets) >= 1.0:
        return min(group_slots)
    return math.ceil(2 * min(p / b for p, b in zip(group_slots, budgets)) - 1e-9)


@dataclass(frozen=True)
class LayerGroupLayout:
    """Which layers form which group, and the slot counts.

    Attributes
    ----------
    ranges : tuple[range, ...]
        Each group's layers, lowest first; together they cover ``0 .. num_layers - 1``.
    physical_slots : int
        ``P``: the slots SGLang sized its pool to (every layer's buffer in stock SGLang).
    group_slots : tuple[int, ...]
        ``(num_groups,)`` ``P_g``: each group's physical slots (:func:`group_slot_counts`); all ``P`` when
        the groups' budgets are equal.
    virtual_slots : int
        ``V >= max_g P_g``: token ids SGLang's scheduler may hand out.
    """

    ranges: tuple[range, ...]
    physical_slots: int
    group_slots: tuple[int, ...]
    virtual_slots: int

    def __post_init__(self) -> None:
        if len(self.group_slots) != len(self.ranges) or not self.ranges:
            raise ValueError(f"{len(self.group_slots)} slot counts for {len(self.ranges)} layer groups")
        if min(self.group_slots) < 1:
            raise ValueError(f"every layer group needs at least one slot, got {list(self.group_slots)}")
        if self.virtual_slots < max(self.group_slots):
            raise ValueError(f"{self.virtual_slots} virtual ids cannot address {max(self.group_slots)} slots")

    @property
    def num_groups(self) -> int:
        return len(self.ranges)

    @property
    def equal_groups(self) -> bool:
        """Whether every group has SGLang's ``P`` slots (then every buffer is stock SGLang's)."""
        return all(slots == self.physical_slots for slots in self.group_slots)

    def group_of_layer(self) -> list[int]:
        """``(num_layers,)``: the group of each layer."""
        return [g for g, layers in enumerate(self.ranges) for _ in layers]

    def last_layers(self) -> list[int]:
        """``(num_groups,)``: the last layer of each group."""
        return [layers[-1] for layers in self.ranges]


def plan_layout(
    physical_slots: int,
    ranges: list[range],
    budgets: list[float],
    prefill_chunk: Optional[int],
    per_request_minimum: int,
) -> LayerGroupLayout:
    """The layout for SGLang's ``physical_slots``-slot pool: each group's slots by its budget for the
    same bytes (:func:`fixed_group_slots`, :func:`group_slot_counts`), and the virtual ids they back
    (:func:`virtual_slot_count`)."""
    fixed = fixed_group_slots(physical_slots, prefill_chunk, per_request_minimum)
    slots = group_slot_counts(physical_slots, budgets, [len(r) for r in ranges], fixed)
    return LayerGroupLayout(
        ranges=tuple(ranges),
        physical_slots=physical_slots,
        group_slots=tuple(slots),
        virtual_slots=virtual_slot_count(slots, budgets),
    )
