"""Per-request views of the KV: which positions each layer group reads, and when to compress them.

Pure torch (no sglang import); the attention backend (:mod:`.layer_group_attention`) drives it.

A request's *view* in layer group ``g`` is a sorted list of sequence positions: ``kept`` (positions
below ``upto`` that survived compression) followed by every position from ``upto`` on. Attention in
the group's layers reads exactly these positions (filtered by what the pool still holds). Only
*private* positions are candidates for dropping: those at or after ``shared_upto``, the length the
request had when its last extend pass began (everything before came from, or was published to, the
radix prefix cache, which other requests may share). Dropping a private position frees its slot in
that group (``drop``); dropping never touches shared positions.

When a request is compressed:

* at the end of each extend (prefill) pass, in each group after the group's last layer: its fresh
  tokens are candidates, compressed right away (SnapKV after prefill) so that the row holds about
  ``floor(b_g * L)`` of its ``L`` tokens at full precision however its prompt was split into passes or
  matched from the cache (``extend_capacity``); what the radix cache receives is already compressed;
* during decode, once the private tokens a group holds exceed their capacity by ``slack`` (so the
  policy runs every ``slack`` steps, not every step).

Scores (for policies that need them) arrive per (layer, request) as the attention the step's queries
pay to the view's positions, summed over heads and the group's layers. Windowed policies (SnapKV)
score with the last ``score_window`` queries (the observation window); others (H2O) with every query
since the last call.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Optional

import torch
from torch import Tensor

from sglang_pask.policy import KVPolicy, capacity, extend_capacity
from sglang_pask.structure import Role

# A function that frees group ``g``'s slots of some positions of a request row: (row, group, positions).
DropFn = Callable[[int, int, Tensor], None]
# A function that gives the roles of some positions of a request row: (row, positions) -> roles.
RolesFn = Callable[[int, Tensor], Tensor]
# A function that says which positions of a request row group ``g`` holds at full precision:
# (row, group, positions) -> bool mask.
HoldsFn = Callable[[int, int, Tensor], Tensor]


# CalibrationProbe.drop_group of a probe that drops its role in every layer group.
ALL_GROUPS = -1


@dataclass(frozen=True)
class CalibrationProbe:
    """What a calibration request asks of the views (``python -m sglang_pask.calibrate``).

    Attributes
    ----------
    drop_group, drop_role : int or None
        Drop every private token of this role in this layer group (every group if ``drop_group``
        is :data:`ALL_GROUPS`), keep everything else.
    distortion_budget : float or None
        Measure, per layer group, the attention-output distortion of keeping this budget's
        score-ordered subset of the prompt (the prompt's last ``score_window`` queries; nothing is
        dropped).
    """

    drop_group: Optional[int] = None
    drop_role: Optional[int] = None
    distortion_budget: Optional[float] = None


# A function that gives a row's calibration probe, if its request carries one.
ProbeFn = Callable[[int], Optional[CalibrationProbe]]


@dataclass
class GroupView:
    """One request's view in one layer group.

    Attributes
    ----------
    kept : Tensor or None
        ``(k,)`` int64 sorted positions below :attr:`upto` still read; None means all of them.
    upto : int
        Every position from here on is read.
    scores : Tensor or None
        ``(m,)`` float32 running scores by position (``policy.accumulate_scores``).
    recent : deque[tuple[int, Tensor]]
        The latest steps' ``(num_queries, (len,) scores)``, covering the last ``window`` queries.
    pending : Tensor or None
        The current step's scores summed over the group's layers so far.
    pending_queries : int
        Queries in the current step.
    """

    kept: Optional[Tensor] = None
    upto: int = 0
    scores: Optional[Tensor] = None
    recent: deque = field(default_factory=deque)
    pending: Optional[Tensor] = None
    pending_queries: int = 0

    def positions(self, seq_len: int, device: torch.device) -> Tensor:
        """``(k + seq_len - upto,)`` int64: the positions attention reads, ascending."""
        tail = torch.arange(self.upto, seq_len, dtype=torch.int64, device=device)
        if self.kept is None:
            return torch.arange(0, seq_len, dtype=torch.int64, device=device)
        return torch.cat((self.kept, tail))


@dataclass
class RequestView:
    """A request's views in every layer group, and where its private tokens begin."""

    groups: list[GroupView]
    shared_upto: int
    seq_len: int = 0
    probe: Optional[CalibrationProbe] = None
    # Per group: [sum of relative errors, layers measured] (probe.distortion_budget).
    distortion: list[list[float]] = field(default_factory=list)
    # StructKV's report of the request's last pruned extend pass (StructKVPass.report), if any.
    prefill: Optional[dict] = None


def _add_padded(a: Optional[Tensor], b: Tensor) -> Tensor:
    """``a + b`` for position-indexed vectors of possibly different lengths (missing entries are 0)."""
    if a is None:
        return b.clone()
    if a.numel() < b.numel():
        a, b = b.clone(), a
    a[: b.numel()] += b
    return a


class KVViewTable:
    """The views of every running request, by request-pool row, and their compression.

    Parameters
    ----------
    policy : KVPolicy
        Decides what a group keeps.
    group_budgets : list[float]
        ``(num_groups,)`` budget of each group (:func:`~sglang_pask.policy.plan_group_budgets`).
    window : int
        Newest positions every group keeps.
    drop : DropFn
        Frees a group's slots of a row's positions.
    slack : int
        During decode, compress once a group's private tokens exceed capacity by this many.
    compress_decode : bool
        Whether decode steps compress the generated tokens (``--kv-decode compress``); when False
        (``keep``) only extend passes compress, so every generated token stays.
    roles_of : RolesFn, optional
        Roles of a row's positions, for policies that use roles (free text for all when omitted).
    probe_of : ProbeFn, optional
        A row's calibration probe, read when its view is created.
    score_window : int, optional
        The observation window: how many of the newest queries windowed scores use (default: ``window``,
        at least 1).
    holds : HoldsFn, optional
        Which positions a group holds at full precision (the pool's answer); when omitted, every
        position a view reads counts as held.
    dropped_block : tuple[int, int], optional
        Under a low-bit ``--kv-dropped`` mode, ``(tokens, slots)`` of one low-bit block.
    decode_block : int, optional
        ``--kv-decode lowbit``: after each decode step a group drops (to low-bit blocks) the oldest
        generated tokens outside the window, this many at a time once that many have gathered, so
        each fills one whole block; the policy does not choose them.
    """

    DECODE_SLACK = 4

    def __init__(self, policy: KVPolicy, group_budgets: list[float], window: int, drop: DropFn,
                 slack: int = DECODE_SLACK, device: torch.device | str = "cpu", roles_of: Optional[RolesFn] = None,
                 probe_of: Optional[ProbeFn] = None, score_window: Optional[int] = None,
                 compress_decode: bool = True, holds: Optional[HoldsFn] = None,
                 dropped_block: Optional[tuple[int, int]] = None, decode_block: Optional[int] = None):
        if decode_block is not None and (compress_decode or decode_block < 1):
            raise ValueError(f"decode blocks of {decode_block} tokens need a decode that does not compress, "
                             "and at least one token per block")
        self.device = torch.device(device)
        self.roles_of = roles_of
        self.probe_of = probe_of
        self.policy = policy
        self.group_budgets = list(group_budgets)
        self.window = window
        self.score_window = max(1, window) if score_window is None else score_window
        self.drop = drop
        self.slack = slack
        self.compress_decode = compress_decode
        self.holds = holds
        self.dropped_block = dropped_block
        self.decode_block = decode_block
        self.views: dict[int, RequestView] = {}
        self.peak_requests = 0
        self.compresses = any(b < 1.0 for b in self.group_budgets)

    @property
    def needs_scores(self) -> bool:
        """Whether the backend must compute attention scores for the policy."""
        return self.compresses and self.policy.needs_scores

    def scores_needed(self, is_extend: bool) -> bool:
        """Whether this step's scores can ever be read: :attr:`needs_scores`, and for a decode step
        only while decode compresses (with ``--kv-decode keep`` nothing after the prefill reads them)."""
        return self.needs_scores and (is_extend or self.compress_decode)

    def score_queries(self, extend_len: int) -> int:
        """How many of an extend pass's newest queries score the keys."""
        return min(extend_len, self.score_window) if self.policy.scores_from_window else extend_len

    def view(self, row: int, prefix_len: int) -> RequestView:
        """The row's view, created for a new request whose first ``prefix_len`` tokens are shared."""
        found = self.views.get(row)
        if found is None:
            found = RequestView([GroupView() for _ in self.group_budgets], shared_upto=prefix_len,
                                probe=self.probe_of(row) if self.probe_of is not None else None,
                                distortion=[[0.0, 0] for _ in self.group_budgets])
            self.views[row] = found
            self.peak_requests = max(self.peak_requests, len(self.views))
        return found

    def release(self, row: int) -> Optional[RequestView]:
        """Forget a row (its request left the pool); returns its last view, if any."""
        return self.views.pop(row, None)

    def add_scores(self, row: int, group: int, positions: Tensor, scores: Tensor, num_queries: int) -> None:
        """Add one layer's scores to the current step of ``(row, group)``.

        Parameters
        ----------
        positions : Tensor
            ``(k,)`` int64 positions the layer read.
        scores : Tensor
            ``(k,)`` float32 attention the step's queries paid to them, summed over heads.
        num_queries : int
            Queries behind ``scores``.
        """
        view = self.views[row].groups[group]
        length = int(positions[-1]) + 1 if positions.numel() else 0
        dense = torch.zeros(length, dtype=torch.float32, device=scores.device)
        dense.index_add_(0, positions, scores.float())
        view.pending = _add_padded(view.pending, dense)
        view.pending_queries = num_queries

    def finish_group(self, row: int, group: int, seq_len: int, is_extend: bool) -> None:
        """The group's last layer ran for this step: fold in its scores and compress if due.

        Parameters
        ----------
        row : int
            Request-pool row.
        group : int
            Layer group.
        seq_len : int
            The request's length after this step.
        is_extend : bool
            Whether the step was an extend (prefill) pass.
        """
        request = self.views[row]
        view = request.groups[group]
        self._fold_scores(view)
        probe = request.probe
        if probe is not None and probe.drop_group is not None:
            # As the server would: under --kv-decode keep, decode drops no generated token.
            if probe.drop_group in (group, ALL_GROUPS) and (is_extend or self.compress_decode):
                self._drop_role(row, group, seq_len, probe.drop_role)
            return
        if not self.compresses:
            return
        if not is_extend and self.decode_block is not None:
            self._store_generated(row, group, seq_len)
            return
        if not (is_extend or self.compress_decode):
            return
        held = view.positions(seq_len, self.device)
        candidates = held[held >= request.shared_upto]
        cap = self._capacity(row, group, held, request.shared_upto, seq_len, is_extend)
        if candidates.numel() <= cap + (0 if is_extend else self.slack):
            return
        policy = self.policy.for_group(group)
        roles = (
            self.roles_of(row, candidates)
            if policy.uses_roles and self.roles_of is not None
            else torch.full_like(candidates, int(Role.FREE_TEXT))
        )
        scores = None
        if self.policy.needs_scores:
            scores = torch.zeros(candidates.numel(), dtype=torch.float32, device=self.device)
            known = view.scores if view.scores is not None else torch.zeros(0, device=self.device)
            inside = candidates < known.numel()
            scores[inside] = known[candidates[inside]]
        decision = policy.select(candidates, roles, scores, cap, self.window, seq_len)
        if decision.evict.numel():
            self.drop(row, group, candidates[decision.evict])
        kept = torch.cat((held[held < request.shared_upto], candidates[decision.keep]))
        view.kept, view.upto = kept, seq_len

    def _capacity(self, row: int, group: int, held: Tensor, shared_upto: int, seq_len: int, is_extend: bool) -> int:
        """How many of the row's private tokens ``group`` keeps after this step.

        An extend pass applies the budget to the whole row (:func:`~sglang_pask.policy.extend_capacity`):
        the full-precision tokens the group holds before ``shared_upto`` (a matched prefix, earlier
        passes) count against it, and the sinks only where they are candidates. Decode applies it to
        the tokens since the last extend (:func:`~sglang_pask.policy.capacity`). Under a low-bit
        ``--kv-dropped`` mode the capacity then grows by the dropped tokens that would start a last,
        partial block, when they take no more slots at full precision than that block would.
        """
        budget = self.group_budgets[group]
        private = seq_len - shared_upto
        if not is_extend:
            return capacity(budget, private, self.window, self.policy.reserved_tokens)
        before = held[held < shared_upto]
        held_before = int(self.holds(row, group, before).sum()) if self.holds is not None else int(before.numel())
        sinks = max(0, min(self.policy.reserved_tokens, seq_len) - shared_upto)
        cap = extend_capacity(budget, seq_len, held_before, private, self.window, sinks)
        if self.dropped_block is None or cap >= private:
            return cap
        block_tokens, block_slots = self.dropped_block
        partial = (private - cap) % block_tokens
        return cap + partial if partial <= block_slots else cap

    def _store_generated(self, row: int, group: int, seq_len: int) -> None:
        """``--kv-decode lowbit``: once :attr:`decode_block` generated tokens (those since the last
        extend pass) older than the window are held in full, ``group`` drops the oldest that many,
        which fill one low-bit block."""
        request = self.views[row]
        view = request.groups[group]
        # Generated tokens held in full, counted without building the row's positions (every step).
        in_full = seq_len - request.shared_upto if view.kept is None else \
            seq_len - view.upto + int((view.kept >= request.shared_upto).sum())
        if in_full - self.window < self.decode_block:
            return
        held = view.positions(seq_len, self.device)
        stored = held[held >= request.shared_upto][:self.decode_block]
        self.drop(row, group, stored)
        view.kept, view.upto = held[~torch.isin(held, stored)], seq_len

    def keep_only(self, row: int, group: int, seq_len: int, keep: Tensor) -> None:
        """The extend pass decided itself (StructKV) which private positions ``group`` keeps: drop the
        others, read the kept ones from now on; the policy's scores of the step are folded in as
        usual (decode compression stays the policy's).

        Parameters
        ----------
        keep : Tensor
            ``(k,)`` int64 private positions to keep, sorted.
        """
        request = self.views[row]
        view = request.groups[group]
        self._fold_scores(view)
        held = view.positions(seq_len, self.device)
        private = held[held >= request.shared_upto]
        kept = torch.isin(private, keep)
        if not bool(kept.all()):
            self.drop(row, group, private[~kept])
        view.kept = torch.cat((held[held < request.shared_upto], private[kept]))
        view.upto = seq_len

    def _drop_role(self, row: int, group: int, seq_len: int, role: Optional[int]) -> None:
        """Calibration: drop the row's private tokens of ``role`` from this group."""
        request = self.views[row]
        view = request.groups[group]
        held = view.positions(seq_len, self.device)
        private = held[held >= request.shared_upto]
        roles = self.roles_of(row, private) if self.roles_of is not None else torch.full_like(private, -1)
        dropped = private[roles == role]
        if dropped.numel():
            self.drop(row, group, dropped)
        view.kept = torch.cat((held[held < request.shared_upto], private[roles != role]))
        view.upto = seq_len

    def add_distortion(self, row: int, group: int, relative_error: float) -> None:
        """Record one layer's attention-output distortion for the row's probe."""
        totals = self.views[row].distortion[group]
        totals[0] += relative_error
        totals[1] += 1

    def finish_step(self, row: int, seq_len: int, is_extend: bool) -> None:
        """Every group ran: after an extend, everything so far counts as shared (the radix cache
        publishes it)."""
        request = self.views[row]
        request.seq_len = seq_len
        if is_extend:
            request.shared_upto = seq_len

    def _fold_scores(self, view: GroupView) -> None:
        if view.pending is None:
            return
        step, queries = view.pending, view.pending_queries
        view.pending, view.pending_queries = None, 0
        if self.policy.scores_from_window:
            view.recent.append((queries, step))
            window = self.score_window
            while len(view.recent) > 1 and sum(q for q, _ in view.recent) - view.recent[0][0] >= window:
                view.recent.popleft()
            new: Optional[Tensor] = None
            for _, scores in view.recent:
                new = _add_padded(new, scores)
            assert new is not None
        else:
            new = step
        previous = view.scores
        if previous is not None and previous.numel() > new.numel():
            new = _add_padded(new, torch.zeros(previous.numel(), device=self.device))
        view.scores = self.policy.accumulate_scores(previous, new)
