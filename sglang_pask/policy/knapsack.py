"""The tier knapsack: per (layer group, role), full precision, low bits or evicted, within a byte share.

Every (group ``g``, role ``r``) pair is an item with three choices. With ``w_g = L_g / L`` (the group's
share of the layers), ``p_r`` the role's share of the prompt tokens and ``c`` a low-bit token's share of a
full slot, the choices cost

* full precision: ``w_g p_r`` bytes (of full KV), error 0;
* low bits: ``w_g p_r c`` bytes, error ``e_low[g, r]``;
* evicted: nothing, error ``e_drop[g, r]``;

where the errors are the measured task-error sensitivities (the share of calibration answers the
probe turns incorrect). The solver picks one choice per item minimising the summed error within
``kv_bytes - residual`` (``residual``: the share every group keeps in full by score on top, charged
at full price), exactly, by dynamic programming over the byte cost in steps of :data:`COST_STEP`
(each item's cost rounded up, so the solution never exceeds the share). Among solutions of equal
error it keeps the most tokens readable, then the most at full precision (a tiny tie-break weight,
far below one answer's error).

Pure Python (no torch, no sglang).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: Byte-cost resolution of the dynamic programme (share of full KV).
COST_STEP = 1e-4
#: Tie-break weights (per unit of byte share) for a role evicted, or kept at low bits: far below the
#: smallest error a calibration can measure (one answer among a few hundred).
EVICTED_PENALTY = 1e-3
LOWBIT_PENALTY = 1e-5

FULL, LOWBIT, EVICTED = "full", "lowbit", "evicted"
TIERS = (FULL, LOWBIT, EVICTED)
EVICTED_INDEX = TIERS.index(EVICTED)


@dataclass(frozen=True)
class TierSolution:
    """The chosen tier of every (group, role), and what it costs and risks.

    Attributes
    ----------
    tiers : tuple[tuple[str, ...], ...]
        ``(num_groups, num_roles)``: :data:`FULL`, :data:`LOWBIT` or :data:`EVICTED`.
    bytes : float
        Predicted share of full KV's bytes of the prompt: the tiers plus the residual.
    error : float
        Summed sensitivity of the choices (an additive estimate of the answers lost).
    full_shares : tuple[float, ...]
        ``(num_groups,)``: the share of a group's prompt tokens in the full tier.
    """

    tiers: tuple[tuple[str, ...], ...]
    bytes: float
    error: float
    full_shares: tuple[float, ...]


def solve_tiers(
    error_dropped: list[list[float]],
    error_lowbit: list[list[float]],
    layers_per_group: list[int],
    frequencies: list[float],
    kv_bytes: float,
    lowbit_cost: float,
    residual: float,
) -> TierSolution:
    """Choose every (group, role)'s tier within ``kv_bytes`` (module docstring).

    Parameters
    ----------
    error_dropped, error_lowbit : list[list[float]]
        ``(num_groups, num_roles)`` sensitivities, >= 0, of evicting a role in a group and of keeping
        it at low bits.
    layers_per_group : list[int]
        ``(num_groups,)`` layers per group.
    frequencies : list[float]
        ``(num_roles,)`` role shares of the prompt tokens (sum 1).
    kv_bytes : float
        The byte share to meet, in (0, 1].
    lowbit_cost : float
        A low-bit token's share of a full slot, in (0, 1).
    residual : float
        The share of the prompt every group keeps in full by score, on top of the tiers, in [0, 1).

    Returns
    -------
    TierSolution

    Raises
    ------
    ValueError
        If the residual alone exceeds ``kv_bytes`` (nothing left for the tiers), or on malformed inputs.
    """
    groups, roles = len(layers_per_group), len(frequencies)
    if any(len(row) != roles for row in (*error_dropped, *error_lowbit)) or not (
        len(error_dropped) == len(error_lowbit) == groups
    ):
        raise ValueError(f"sensitivities must be {groups} rows of {roles} roles")
    if not 0 < lowbit_cost < 1 or not 0 <= residual < 1 or not 0 < kv_bytes <= 1:
        raise ValueError(
            f"need 0 < lowbit_cost < 1, 0 <= residual < 1 and 0 < kv_bytes <= 1, got {lowbit_cost}, {residual}, {kv_bytes}"
        )
    room = kv_bytes - residual
    if room < 0:
        raise ValueError(f"the residual {residual:g} kept in full by score already exceeds the byte share {kv_bytes:g}")
    total_layers = sum(layers_per_group)
    items = [(g, r) for g in range(groups) for r in range(roles) if frequencies[r] > 0]
    capacity = int(math.floor(room / COST_STEP + 1e-9))
    # objective[c]: the least objective of the items so far within c cost steps; picks[i][c]: item i's tier there.
    objective = [0.0] * (capacity + 1)
    picks: list[list[int]] = []
    costs: list[tuple[int, ...]] = []
    for g, r in items:
        share = layers_per_group[g] / total_layers * frequencies[r]
        cost = (math.ceil(share / COST_STEP - 1e-9), math.ceil(share * lowbit_cost / COST_STEP - 1e-9), 0)
        risk = (0.0, error_lowbit[g][r] + LOWBIT_PENALTY * share, error_dropped[g][r] + EVICTED_PENALTY * share)
        updated, pick = [math.inf] * (capacity + 1), [EVICTED_INDEX] * (capacity + 1)
        for c in range(capacity + 1):
            for tier in range(3):
                if cost[tier] <= c and objective[c - cost[tier]] + risk[tier] < updated[c]:
                    updated[c], pick[c] = objective[c - cost[tier]] + risk[tier], tier
        objective = updated
        picks.append(pick)
        costs.append(cost)
    choices = [0] * len(items)
    c = capacity
    for i in reversed(range(len(items))):
        choices[i] = picks[i][c]
        c -= costs[i][choices[i]]
    tiers = [[LOWBIT] * roles for _ in range(groups)]  # roles absent from the prompt: readable, at no cost
    spent, error = residual, 0.0
    full_shares = [0.0] * groups
    for (g, r), tier in zip(items, choices):
        tiers[g][r] = TIERS[tier]
        share = layers_per_group[g] / total_layers * frequencies[r]
        spent += (share, share * lowbit_cost, 0.0)[tier]
        error += (0.0, error_lowbit[g][r], error_dropped[g][r])[tier]
        if tier == 0:
            full_shares[g] += frequencies[r]
    return TierSolution(tuple(tuple(row) for row in tiers), spent, error, tuple(full_shares))
