"""The running requests' views, and when and what each layer group drops of them.

Pure torch (no sglang import); the attention backends (:mod:`sglang_pask.srt.attention`) drive it.

:class:`KVViewTable` holds every running request's views (:mod:`.views`), by request-pool row. It
compresses a request's view of a group (the policy chooses what stays; the others' slots are freed,
``drop``); dropping never touches shared positions (before ``shared_upto``):

* at the end of each extend (prefill) pass, in each group after the group's last layer: its fresh
  tokens are candidates, compressed right away (SnapKV after prefill) so that the row holds about
  ``floor(b_g * L)`` of its ``L`` tokens at full precision however its prompt was split into passes or
  matched from the cache (``extend_capacity``); what the radix cache receives is already compressed;
* during decode, once the private tokens a group holds exceed their capacity by ``slack`` (so the
  policy runs every ``slack`` steps, not every step).

The policy's scores reach the views through :meth:`KVViewTable.add_scores` (:mod:`.scores`). Rows
whose request carries a calibration probe are in :attr:`KVViewTable.probes` and handled by
:mod:`.probe`; without one, nothing here looks at probes.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
from torch import Tensor

from sglang_pask.kvpool import probe as probes
from sglang_pask.kvpool.probe import CalibrationProbe, ProbeFn
from sglang_pask.kvpool.scores import add_layer_scores, fold_scores
from sglang_pask.kvpool.views import DropFn, GroupView, HoldsFn, RequantizeFn, RequestView, RolesFn
from sglang_pask.policy import KVPolicy, capacity, extend_capacity
from sglang_pask.structure import Role


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
        Frees a group's slots of a row's positions (under a low-bit ``--kv-dropped`` mode, storing them
        at low bits).
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
    evict : DropFn, optional
        Frees a group's slots of a row's positions, storing nothing: the evicted tier of a tiered
        policy (:attr:`~sglang_pask.policy.KeepDecision.lowbit`). Default: ``drop``.
    requantize : RequantizeFn, optional
        Replaces the K/V a group holds at a row's positions by their low-bit round trip in the named
        ``--kv-dropped`` format, in place (calibration probes measuring the low-bit tier, :mod:`.probe`).
    reduce_scores : callable, optional
        Sums a ``(k,)`` float32 tensor over the tensor-parallel ranks, in place (one collective):
        each rank scores with its own KV heads, and every rank must keep the same tokens, so the
        caller runs :meth:`share_scores` for each group's step before compressing it.
    """

    DECODE_SLACK = 4

    def __init__(
        self,
        policy: KVPolicy,
        group_budgets: list[float],
        window: int,
        drop: DropFn,
        slack: int = DECODE_SLACK,
        device: torch.device | str = "cpu",
        roles_of: Optional[RolesFn] = None,
        probe_of: Optional[ProbeFn] = None,
        score_window: Optional[int] = None,
        compress_decode: bool = True,
        holds: Optional[HoldsFn] = None,
        dropped_block: Optional[tuple[int, int]] = None,
        decode_block: Optional[int] = None,
        reduce_scores: Optional[Callable[[Tensor], None]] = None,
        evict: Optional[DropFn] = None,
        requantize: Optional[RequantizeFn] = None,
    ):
        if decode_block is not None and (compress_decode or decode_block < 1):
            raise ValueError(
                f"decode blocks of {decode_block} tokens need a decode that does not compress, "
                "and at least one token per block"
            )
        self.device = torch.device(device)
        self.roles_of = roles_of
        self.probe_of = probe_of
        self.policy = policy
        self.group_budgets = list(group_budgets)
        self.window = window
        self.score_window = max(1, window) if score_window is None else score_window
        self.drop = drop
        self.evict = drop if evict is None else evict
        self.requantize = requantize
        self.slack = slack
        self.compress_decode = compress_decode
        self.holds = holds
        self.dropped_block = dropped_block
        self.decode_block = decode_block
        self.reduce_scores = reduce_scores
        self.views: dict[int, RequestView] = {}
        # Rows whose request carries a calibration probe (empty unless calibration is running).
        self.probes: dict[int, CalibrationProbe] = {}
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
            found = RequestView([GroupView() for _ in self.group_budgets], shared_upto=prefix_len)
            probe = self.probe_of(row) if self.probe_of is not None else None
            if probe is not None:
                found.probe = probe
                found.distortion = [[0.0, 0] for _ in self.group_budgets]
                self.probes[row] = probe
            self.views[row] = found
            self.peak_requests = max(self.peak_requests, len(self.views))
        return found

    def release(self, row: int) -> Optional[RequestView]:
        """Forget a row (its request left the pool); returns its last view, if any."""
        if self.probes:
            self.probes.pop(row, None)
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
        add_layer_scores(self.views[row].groups[group], positions, scores, num_queries)

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
        if self.probes:
            probe = self.probes.get(row)
            if probe is not None and probe.drop_group is not None:
                probes.finish_group(self, row, group, seq_len, is_extend, probe)
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
        if decision.lowbit is not None:
            gone = torch.ones(decision.evict.numel(), dtype=torch.bool, device=self.device)
            gone[torch.searchsorted(decision.evict, decision.lowbit)] = False
            if bool(gone.any()):  # first, so that their slots can hold the low-bit blocks
                self.evict(row, group, candidates[decision.evict[gone]])
            if decision.lowbit.numel():
                self.drop(row, group, candidates[decision.lowbit])
        elif decision.evict.numel():
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
        in_full = (
            seq_len - request.shared_upto
            if view.kept is None
            else seq_len - view.upto + int((view.kept >= request.shared_upto).sum())
        )
        if in_full - self.window < self.decode_block:
            return
        held = view.positions(seq_len, self.device)
        stored = held[held >= request.shared_upto][: self.decode_block]
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

    def finish_step(self, row: int, seq_len: int, is_extend: bool) -> None:
        """Every group ran: after an extend, everything so far counts as shared (the radix cache
        publishes it)."""
        request = self.views[row]
        request.seq_len = seq_len
        if is_extend:
            request.shared_upto = seq_len

    def share_scores(self, group: int, rows: list[int]) -> None:
        """Sum the step's pending scores of ``group`` for ``rows`` over the tensor-parallel ranks
        (:attr:`reduce_scores`), all rows in one collective; nothing on one rank. Every rank calls it
        with the same rows in the same order (same batch), so the collectives match."""
        if self.reduce_scores is None:
            return
        pending = [view.pending for view in (self.views[row].groups[group] for row in rows) if view.pending is not None]
        if not pending:
            return
        flat = torch.cat(pending)
        self.reduce_scores(flat)
        for scores, summed in zip(pending, flat.split([p.numel() for p in pending])):
            scores.copy_(summed)

    def _fold_scores(self, view: GroupView) -> None:
        fold_scores(view, self.policy, self.score_window, self.device)
