"""Budgets: how many tokens a layer group keeps for a request, and start-up checks of the numbers.

A *budget* is a fraction of full KV in (0, 1]. A layer group with budget ``b`` keeps, of a
request's ``n`` candidate tokens, ``floor(b * n)``, but never fewer than the protected recent window
plus the policy's reserved tokens (attention sinks), and never more than ``n``:

    capacity = min(n, max(floor(b * n), window + reserved))

So a long request holds ``b`` of full KV and a short one at most the window: "``b`` of full plus a
small fixed window".

A prompt may arrive in several extend passes (chunked prefill, or a prefix matched from the radix
cache before the rest is computed). Each pass compresses only its own tokens, but the budget is the
row's: a pass of ``n`` candidates in a row of ``L`` tokens that already holds ``h`` tokens before them
keeps

    extend_capacity = min(n, max(floor(b * L) - h, window + reserved))

(:func:`extend_capacity`, with ``reserved`` the sinks among the candidates), so a prompt holds about
``floor(b * L)`` however it was split, instead of a window and sinks per pass.

A budget is *impossible* when even the longest request the server admits (``max_tokens``, e.g. its
context length) would keep fewer tokens than the window and the reserved tokens: the budget could
never bind. :func:`check_budget` rejects that at start-up, and :func:`plan_group_budgets` does it
for every group of a policy's split.

Pure Python (no torch, no sglang).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .base import KVPolicy

# Absorbs float error in budget * n (0.29 * 100 == 28.999999999999996).
_EPS = 1e-9


def check_fraction(budget: float, what: str = "KV budget") -> float:
    """Return ``budget`` as a float after checking that it lies in (0, 1].

    Raises
    ------
    ValueError
        If ``budget`` is not finite or not in (0, 1]; the message starts with ``what``.
    """
    value = float(budget)
    if not (math.isfinite(value) and 0.0 < value <= 1.0):
        raise ValueError(f"{what} must be in (0, 1], got {budget}")
    return value


def check_layer_split(total_budget: float, num_groups: int, layers_per_group: Sequence[int]) -> None:
    """Check the arguments of :meth:`KVPolicy.group_budgets <sglang_pask.policy.base.KVPolicy.group_budgets>`.

    Raises
    ------
    ValueError
        If ``total_budget`` is not in (0, 1], ``num_groups < 1``, ``layers_per_group`` does not have
        ``num_groups`` entries, or a group has no layer.
    """
    check_fraction(total_budget, "total KV budget")
    if num_groups < 1:
        raise ValueError(f"the number of layer groups must be at least 1, got {num_groups}")
    if len(layers_per_group) != num_groups:
        raise ValueError(
            f"layers_per_group has {len(layers_per_group)} entries ({list(layers_per_group)}) "
            f"but there are {num_groups} layer groups"
        )
    if any(count < 1 for count in layers_per_group):
        raise ValueError(f"every layer group needs at least one layer, got layers_per_group={list(layers_per_group)}")


def _kept(budget: float, num_tokens: int) -> int:
    return math.floor(budget * num_tokens + _EPS)


def capacity(budget: float, num_tokens: int, window: int, reserved: int = 0) -> int:
    """How many of a request's candidate tokens one layer group keeps.

    Parameters
    ----------
    budget : float
        The group's budget, a fraction of full KV in (0, 1] (one entry of
        :func:`plan_group_budgets`).
    num_tokens : int
        The request's candidate tokens in the group (the tokens it privately owns and may drop).
    window : int
        The protected recent window, in tokens.
    reserved : int
        Tokens outside the window the policy always keeps (:attr:`KVPolicy.reserved_tokens`).

    Returns
    -------
    int
        ``min(num_tokens, max(floor(budget * num_tokens), window + reserved))``; equal to
        ``num_tokens`` at budget 1.0.
    """
    check_fraction(budget)
    if num_tokens < 0 or window < 0 or reserved < 0:
        raise ValueError(
            f"num_tokens, window and reserved must be non-negative, got {num_tokens}, {window}, {reserved}"
        )
    return min(num_tokens, max(_kept(budget, num_tokens), window + reserved))


def extend_capacity(
    budget: float, row_tokens: int, held_before: int, num_tokens: int, window: int, reserved: int = 0
) -> int:
    """How many of an extend pass's candidate tokens one layer group keeps, the budget applying to
    the whole row.

    Parameters
    ----------
    budget : float
        The group's budget, a fraction of full KV in (0, 1].
    row_tokens : int
        The row's length after the pass (``L``).
    held_before : int
        Tokens before the candidates that the group still holds at full precision (``h``): those
        of a prefix matched from the radix cache, or kept by the row's earlier passes.
    num_tokens : int
        The pass's candidate tokens (``n``).
    window : int
        The protected recent window, in tokens.
    reserved : int
        The policy's reserved tokens (attention sinks) among the candidates.

    Returns
    -------
    int
        ``min(n, max(floor(b * L) - h, window + reserved))``; :func:`capacity` when ``h == 0`` and
        ``L == n`` (a prompt in one pass).
    """
    check_fraction(budget)
    if min(row_tokens, held_before, num_tokens, window, reserved) < 0 or held_before + num_tokens > row_tokens:
        raise ValueError(
            f"need 0 <= held_before + num_tokens <= row_tokens and a non-negative window and reserved, got "
            f"row_tokens={row_tokens}, held_before={held_before}, num_tokens={num_tokens}, window={window}, "
            f"reserved={reserved}"
        )
    return min(num_tokens, max(_kept(budget, row_tokens) - held_before, window + reserved))


def check_budget(budget: float, window: int, max_tokens: int, reserved: int = 0, *, what: str = "KV budget") -> None:
    """Check at start-up that ``budget`` can hold the window (and the reserved tokens).

    Parameters
    ----------
    budget : float
        A fraction of full KV.
    window : int
        The protected recent window, in tokens.
    max_tokens : int
        The longest request the server admits (its context length).
    reserved : int
        Tokens outside the window the policy always keeps (attention sinks).
    what : str
        How messages name the budget (``"KV budget"``, or a layer group's budget).

    Raises
    ------
    ValueError
        If ``budget`` is not in (0, 1], ``window`` or ``reserved`` is negative, ``max_tokens < 1``,
        or ``floor(budget * max_tokens) < window + reserved``. The message names the numbers and
        the smallest budget that would do.
    """
    check_fraction(budget, what)
    if window < 0:
        raise ValueError(f"the recent window must be non-negative, got {window}")
    if reserved < 0:
        raise ValueError(f"the reserved token count must be non-negative, got {reserved}")
    if max_tokens < 1:
        raise ValueError(f"max_tokens (the longest request) must be at least 1, got {max_tokens}")
    need = window + reserved
    kept = _kept(budget, max_tokens)
    if kept >= need:
        return
    held = f"the {window}-token recent window" + (
        f" plus {reserved} reserved tokens ({need} in all)" if reserved else ""
    )
    if reserved >= max_tokens:
        fix = f"no budget can hold it: the reserved tokens (attention sinks) must be fewer than {max_tokens}"
    elif need > max_tokens:
        fix = f"no budget can hold it: the window must be at most {max_tokens - reserved} tokens"
    else:
        fix = f"it needs a budget of at least {math.ceil(need / max_tokens * 1e4) / 1e4:g}, or a smaller window"
    raise ValueError(
        f"{what} {budget:.6g} keeps {kept} of {max_tokens} tokens even for the longest request, "
        f"fewer than {held}; {fix}"
    )


def plan_group_budgets(
    policy: KVPolicy, total_budget: float, layers_per_group: Sequence[int], window: int, max_tokens: int
) -> list[float]:
    """Split ``total_budget`` between layer groups with ``policy`` and check every share.

    The launcher calls this once at start-up; the pool keeps the result.

    Parameters
    ----------
    policy : KVPolicy
        The configured policy (its :meth:`~KVPolicy.group_budgets` and
        :attr:`~KVPolicy.reserved_tokens`).
    total_budget : float
        The total KV budget (``--kv-budget``), in (0, 1].
    layers_per_group : Sequence[int]
        Number of layers in each group, first group (lowest layers) first.
    window : int
        The protected recent window, in tokens.
    max_tokens : int
        The longest request the server admits (its context length).

    Returns
    -------
    list[float]
        One budget per group.

    Raises
    ------
    ValueError
        If the split's arguments are invalid, or some group's budget cannot hold the window (see
        :func:`check_budget`); the message names the group, its layers and the policy.
    """
    budgets = policy.group_budgets(total_budget, len(layers_per_group), list(layers_per_group))
    first = 0
    for group, (budget, count) in enumerate(zip(budgets, layers_per_group)):
        what = (
            f"layer group {group} (layers {first}-{first + count - 1}; policy {policy.name!r}, "
            f"total budget {total_budget}): budget"
        )
        check_budget(budget, window, max_tokens, policy.reserved_tokens, what=what)
        first += count
    return budgets
