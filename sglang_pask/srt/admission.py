"""SGLang's prefill admission over the layer-group pool: every group's slots counted on their own.

SGLang admits a request when its prompt plus its future decode tokens fit in what is free (plus
what evicting the prefix cache would free) after the running requests' decode headroom. With layer
groups of different sizes and budgets, one count in tokens cannot say that: a prompt token takes a
slot in every group (prefill writes it everywhere before the policy compresses it), but a decoded
token takes about ``b_g`` of a slot in group ``g``. So the budget keeps, beside SGLang's own
offsets, one offset per group (in that group's slots) and one for the virtual ids, and what remains
is the smallest of ``capacity - offset`` over the groups and the ids:

* a new request is charged, in group ``g``, the most slots its prompt (and SGLang's page and extra
  tokens) holds there while it is prefilled
  (:meth:`~sglang_pask.srt.pool.LayerGroupAllocator.prompt_peak`: the whole prompt when it fits in one
  pass; a longer prompt is written one chunk at a time, each compressed before the next, so the
  peak is about ``b_g`` of it plus one chunk), plus ``decode_growth(g, max_new)``; and its prompt
  plus ``max_new`` ids. SGLang's own budget charges the whole prompt, which for a prompt longer than
  a chunk would make the least-kept group refuse it long before that group is short of slots;
* each running request (:func:`reserve_running_requests`, after SGLang's ``PrefillAdder``
  initialisation) is charged its remaining decode tokens the same way;
* capacity per group is its free slots plus the slots the cache's unlocked tokens hold there
  (:func:`evictable_ids`, :meth:`~sglang_pask.srt.pool.LayerGroupAllocator.allocatable_after_eviction`,
  once per round). Counted exactly: the locked prefix of a running request holds only ``b_g`` of
  its tokens in a small group, so subtracting locked tokens from the cache's slots (a bound that
  needs no tree walk) leaves a small group no evictable slots at all and refuses what would fit.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from sglang.srt.mem_cache.prefill_budget import PrefillBudget

from sglang_pask.srt.pool import LayerGroupAllocator


class LayerGroupPrefillBudget(PrefillBudget):
    """SGLang's prefill admission budget, counting each layer group's slots and the virtual ids.

    Attributes
    ----------
    group_offsets : list[float]
        ``(num_groups,)`` slots of each group promised this round (new prompts, decode headroom).
    id_offset : float
        Virtual ids promised this round.
    """

    allocator: LayerGroupAllocator

    def __init__(self, allocator: LayerGroupAllocator, tree_cache: Any, *, num_mixed_decode_tokens: int = 0):
        super().__init__(allocator, tree_cache, num_mixed_decode_tokens=num_mixed_decode_tokens)
        self.group_offsets = [float(num_mixed_decode_tokens)] * len(allocator.group_allocators)
        self.id_offset = float(num_mixed_decode_tokens)
        self._capacity: Optional[tuple[int, list[int]]] = None
        self._checked: Optional[list[float]] = None

    def _capacities(self) -> tuple[int, list[int]]:
        """Ids and ``(num_groups,)`` slots allocatable once the unlocked cache is evicted."""
        if self._capacity is None:
            tree = self.tree_cache
            if tree is None or not tree.supports_prefix_sharing():
                self._capacity = (
                    self.allocator.virtual_available_size(),
                    [a.available_size() for a in self.allocator.group_allocators],
                )
            else:
                self._capacity = self.allocator.allocatable_after_eviction(evictable_ids(tree))
        return self._capacity

    def _available_and_evictable(self) -> int:
        ids, groups = self._capacities()
        return min(ids, *groups)

    @property
    def remaining_total(self) -> float:
        """Prompt tokens that still fit after everything promised, in the fullest group or ids."""
        ids, groups = self._capacities()
        return min(ids - self.id_offset, *(slots - offset for slots, offset in zip(groups, self.group_offsets)))

    def reserve_running(self, new_tokens: float) -> None:
        """Charge a running request's expected remaining decode tokens (SGLang's estimate)."""
        self.id_offset += new_tokens
        for group in range(len(self.group_offsets)):
            self.group_offsets[group] += self.allocator.decode_growth(group, new_tokens)

    def check_prefill(
        self,
        *,
        extend_input_len: int,
        total_tokens: int,
        max_new_tokens: int,
        chunk_limit: Optional[int],
        **kwargs: Any,
    ) -> tuple[bool, Optional[int]]:
        """Whether the request fits in every group: ``total_tokens`` (SGLang's prompt + decode +
        extras) in ids; in each group the prompt's peak there plus the decode as the group keeps it.
        What fits is remembered for :meth:`reserve`, which SGLang calls next for this request."""
        prompt = total_tokens - max_new_tokens
        ids, groups = self._capacities()
        needs = [
            self.allocator.prompt_peak(g, prompt) + self.allocator.decode_growth(g, max_new_tokens)
            for g in range(len(groups))
        ]
        fits = prompt + max_new_tokens < ids - self.id_offset and all(
            need < slots - offset for need, slots, offset in zip(needs, groups, self.group_offsets)
        )
        self._checked = needs if fits else None
        return (True, chunk_limit) if fits else (False, None)

    def reserve(
        self, extend_input_len: int, max_new_tokens: int, *, is_chunked_continuation: bool = False, **kwargs: Any
    ) -> None:
        """Charge what SGLang admitted: its first pass (``extend_input_len``, a chunk when the prompt
        is longer) now, and for a new request at least what :meth:`check_prefill` found it needs in
        each group, so that later admissions this round leave its remaining chunks their room."""
        before = self.current_offset
        super().reserve(extend_input_len, max_new_tokens, is_chunked_continuation=is_chunked_continuation, **kwargs)
        immediate = self.current_offset - before  # the pass, SGLang's page and extra tokens
        checked = None if is_chunked_continuation else self._checked
        self._checked = None
        self.id_offset += immediate + max_new_tokens
        for group in range(len(self.group_offsets)):
            charge = immediate + self.allocator.decode_growth(group, max_new_tokens)
            self.group_offsets[group] += charge if checked is None else max(charge, checked[group])


def evictable_ids(tree: Any) -> torch.Tensor:
    """``(n,)`` int64 virtual ids of the prefix cache's unlocked nodes: what evicting it can free.

    Every cache a layer-group server builds is SGLang's ``UnifiedRadixCache`` (no SWA, no external
    KV stores); its tree core walks the unlocked nodes (the walk SGLang's KV canary uses).
    """
    walk = tree.tree_core.walk_for_kv_canary(unlocked_only=True, swa_resident_only=False)
    return walk.slot_indices.long()


def reserve_running_requests(result: Any, adder: Any, *args: Any, **kwargs: Any) -> Any:
    """AFTER hook of ``PrefillAdder.__init__``: charge every running request's decode headroom to
    each group as the group will keep it (SGLang's own scalar charge is not read by this budget)."""
    budget = getattr(adder, "memory_budget", None)
    running = getattr(adder, "running_batch", None)
    if isinstance(budget, LayerGroupPrefillBudget) and running is not None:
        for req in running.reqs:
            budget.reserve_running(adder._get_running_request_total_token_offset(req))
    return result
