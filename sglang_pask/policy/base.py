"""The KV persistence policy interface: which of a request's tokens one layer group keeps.

Pure torch (no sglang import). Policies are stateless frozen dataclasses configured by their fields;
everything that changes per request lives with the caller (the layer-group KV pool), which drives a
policy like this:

1. At start-up: ``policy = get_policy(name, **options)`` and ``budgets = plan_group_budgets(policy,
   total_budget, layers_per_group, window, max_tokens)`` (:mod:`.budget`): one budget per layer
   group, checked, kept by the pool.
2. Per (request, group), as tokens arrive, if :attr:`KVPolicy.needs_scores`: score the candidates
   (attention from the last-window queries, reduced over heads and TP ranks) and fold the new scores
   into the pair's state: ``state = policy.accumulate_scores(state, new)``.
3. When the group holds more candidates than ``cap = capacity(budgets[g], n, window,
   policy.reserved_tokens)`` (after an extend pass, :func:`~.budget.extend_capacity` over the whole
   row): ``decision = policy.select(positions, roles, state, cap, window, seq_len)``; free the slots
   of ``decision.evict`` and keep ``state = state[decision.keep]``.

Candidates are the tokens the request privately owns in the group and may drop; tokens of a prefix
shared through the radix cache are never candidates (the caller keeps them).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar, NamedTuple, Optional

import torch
from torch import Tensor

from .budget import check_layer_split


class KeepDecision(NamedTuple):
    """What one layer group keeps of one request's candidates.

    Attributes
    ----------
    keep : Tensor
        (k,) int64, sorted ascending, unique: indices into the candidates to keep at full precision;
        ``k <= capacity``.
    evict : Tensor
        (n - k,) int64, sorted ascending: the other indices, whose full-precision slots the caller frees.
    lowbit : Tensor or None
        (j,) int64, sorted ascending, a subset of ``evict``: the candidates a tiered policy keeps at low
        bits; the rest of ``evict`` leave the group. None (every untiered policy): the server's
        ``--kv-dropped`` mode decides for all of ``evict``.
    """

    keep: Tensor
    evict: Tensor
    lowbit: Optional[Tensor] = None


class KVPolicy(ABC):
    """A rule for which candidate tokens a layer group keeps within its capacity.

    Subclasses are frozen dataclasses registered with :func:`~.registry.register_policy`; they
    implement :meth:`choose` and may override :meth:`group_budgets`, :meth:`accumulate_scores` and
    :attr:`reserved_tokens`.

    Attributes
    ----------
    name : str
        The registry name (set by :func:`~.registry.register_policy`).
    needs_scores : bool
        Whether :meth:`select` reads scores; when False the caller need not compute any.
    scores_from_window : bool
        Whether the scores passed to :meth:`accumulate_scores` come from the last ``window`` queries
        (True, SnapKV) or from every query since the previous call (False, H2O).
    uses_roles : bool
        Whether :meth:`select` reads roles; when False the caller may pass any role values.
    """

    name: ClassVar[str] = ""
    needs_scores: ClassVar[bool] = False
    scores_from_window: ClassVar[bool] = True
    uses_roles: ClassVar[bool] = False

    def for_group(self, group: int) -> "KVPolicy":
        """The policy as it decides for layer group ``group`` (itself unless overridden)."""
        return self

    @property
    def reserved_tokens(self) -> int:
        """The first positions of a row (attention sinks), outside the recent window, that the policy
        always keeps when they are candidates (0 unless overridden)."""
        return 0

    def lowbit_shares(self, num_groups: int) -> Optional[list[float]]:
        """``(num_groups,)`` the expected share of a request's tokens each group stores at low bits, for a
        policy that decides it (a tiered table); None when every token a group does not keep in full is
        stored at low bits under a low-bit ``--kv-dropped`` mode (the default)."""
        return None

    def group_budgets(self, total_budget: float, num_groups: int, layers_per_group: list[int]) -> list[float]:
        """Split the total KV budget between layer groups.

        The split keeps the layer-weighted mean equal to the total,
        ``sum(b[g] * layers_per_group[g]) / sum(layers_per_group) == total_budget``, unless a
        policy documents otherwise. Uniform by default: every group gets ``total_budget``.

        Parameters
        ----------
        total_budget : float
            Fraction of full KV in (0, 1].
        num_groups : int
            Number of layer groups.
        layers_per_group : list[int]
            Layers in each group, lowest layers first; ``len == num_groups``.

        Returns
        -------
        list[float]
            (num_groups,) budgets, each in (0, 1].
        """
        check_layer_split(total_budget, num_groups, layers_per_group)
        return [float(total_budget)] * num_groups

    def accumulate_scores(self, previous: Tensor | None, new: Tensor) -> Tensor:
        """Fold the latest scores into a (request, group)'s running scores.

        Candidate ``i < m`` of ``new`` is candidate ``i`` of ``previous`` (the caller indexes its
        state with :attr:`KeepDecision.keep` after each eviction); ``new[m:]`` are tokens that arrived
        since. By default the latest scores replace the old ones (SnapKV: what the last window of
        queries attends to).

        Parameters
        ----------
        previous : Tensor or None
            (m,) float, the running scores, or None before the first scores.
        new : Tensor
            (n,) float with ``n >= m``, the scores just computed.

        Returns
        -------
        Tensor
            (n,) float, the running scores to pass to :meth:`select`.
        """
        check_accumulate(previous, new)
        return new

    def select(
        self,
        positions: Tensor,
        roles: Tensor,
        scores: Tensor | None,
        capacity: int,
        window: int,
        seq_len: int,
    ) -> KeepDecision:
        """Choose which candidates one layer group keeps for one request.

        Parameters
        ----------
        positions : Tensor
            (n,) int64, unique sequence positions of the candidates, each ``< seq_len``.
        roles : Tensor
            (n,) int64, the candidates' :class:`~sglang_pask.structure.roles.Role` values.
        scores : Tensor or None
            (n,) float, importance of each candidate (higher = more important), reduced over heads
            and TP ranks and accumulated with :meth:`accumulate_scores`. Required when
            :attr:`needs_scores`, ignored otherwise.
        capacity : int
            How many candidates the group may keep (:func:`~.budget.capacity`); at least
            ``min(window, n)``.
        window : int
            The recent window: candidates at positions ``>= seq_len - window`` are always kept.
        seq_len : int
            The request's total sequence length (shared prefix included).

        Returns
        -------
        KeepDecision
            ``keep`` holds ``min(n, capacity)`` indices or fewer, on the device of ``positions``.

        Raises
        ------
        ValueError
            On malformed inputs, missing scores, or a capacity that cannot hold the window.
        """
        n = self._check_inputs(positions, roles, scores, capacity, window, seq_len)
        if capacity >= n:
            return KeepDecision(
                torch.arange(n, device=positions.device), torch.empty(0, dtype=torch.int64, device=positions.device)
            )
        return self.choose(positions, roles, scores, capacity, window, seq_len)

    @abstractmethod
    def choose(
        self,
        positions: Tensor,
        roles: Tensor,
        scores: Tensor | None,
        capacity: int,
        window: int,
        seq_len: int,
    ) -> KeepDecision:
        """:meth:`select` on checked inputs with ``min(window, n) <= capacity < n``."""

    def _check_inputs(
        self,
        positions: Tensor,
        roles: Tensor,
        scores: Tensor | None,
        capacity: int,
        window: int,
        seq_len: int,
    ) -> int:
        if positions.dim() != 1 or positions.dtype != torch.int64:
            raise ValueError(
                f"positions must be a 1-D int64 tensor, got shape {tuple(positions.shape)} and dtype {positions.dtype}"
            )
        n = positions.numel()
        if roles.shape != positions.shape or roles.dtype != torch.int64:
            raise ValueError(
                f"roles must be an int64 tensor of shape ({n},) like positions, "
                f"got shape {tuple(roles.shape)} and dtype {roles.dtype}"
            )
        if self.needs_scores:
            if scores is None:
                raise ValueError(f"KV policy {self.name!r} needs scores, got None")
            if scores.shape != positions.shape or not scores.is_floating_point():
                raise ValueError(
                    f"scores must be a float tensor of shape ({n},) like positions, "
                    f"got shape {tuple(scores.shape)} and dtype {scores.dtype}"
                )
        if window < 0 or seq_len < n:
            raise ValueError(f"need window >= 0 and seq_len >= {n} candidates, got window={window}, seq_len={seq_len}")
        if capacity < min(window, n):
            raise ValueError(
                f"capacity {capacity} cannot hold the {window}-token recent window ({n} candidates); "
                f"compute it with sglang_pask.policy.capacity"
            )
        return n


class RankingPolicy(KVPolicy):
    """A policy that keeps the recent window, then the highest-:meth:`priority` candidates.

    ``keep`` always has exactly ``capacity`` entries.
    """

    def choose(
        self,
        positions: Tensor,
        roles: Tensor,
        scores: Tensor | None,
        capacity: int,
        window: int,
        seq_len: int,
    ) -> KeepDecision:
        """Keep the window, fill the rest of ``capacity`` by :meth:`priority`."""
        priority = self.priority(positions, roles, scores, seq_len)
        return keep_highest(priority, positions >= seq_len - window, capacity)

    @abstractmethod
    def priority(self, positions: Tensor, roles: Tensor, scores: Tensor | None, seq_len: int) -> Tensor:
        """Rank the candidates: higher is kept first, ties go to the lower index.

        Parameters
        ----------
        positions, roles, scores, seq_len
            As in :meth:`KVPolicy.select` (checked; ``n >= 1``).

        Returns
        -------
        Tensor
            (n,) real or integer priorities.
        """


def keep_highest(priority: Tensor, protected: Tensor, capacity: int) -> KeepDecision:
    """Keep the protected candidates, then the highest-priority others, up to ``capacity``.

    Deterministic: ties go to the lower index (stable sorts, no host synchronisation).

    Parameters
    ----------
    priority : Tensor
        (n,) real or integer, higher is kept first.
    protected : Tensor
        (n,) bool, candidates kept before any other; at most ``capacity`` of them.
    capacity : int
        How many to keep, ``0 <= capacity <= n``.

    Returns
    -------
    KeepDecision
        ``keep`` with exactly ``capacity`` indices.
    """
    order = torch.sort(priority, descending=True, stable=True).indices
    order = order[torch.sort(protected[order].to(torch.uint8), descending=True, stable=True).indices]
    return KeepDecision(torch.sort(order[:capacity]).values, torch.sort(order[capacity:]).values)


def check_accumulate(previous: Tensor | None, new: Tensor) -> None:
    """Check the arguments of :meth:`KVPolicy.accumulate_scores`; raise ValueError if malformed."""
    if new.dim() != 1 or not new.is_floating_point():
        raise ValueError(f"new scores must be a 1-D float tensor, got shape {tuple(new.shape)} and dtype {new.dtype}")
    if previous is not None and (previous.dim() != 1 or previous.numel() > new.numel()):
        raise ValueError(
            f"previous scores must be 1-D and no longer than the new ones ({new.numel()}), "
            f"got shape {tuple(previous.shape)}"
        )
