"""The layer-group KV pool and its allocator: each layer group owns its own slot space.

SGLang gives every token one slot id (``out_cache_loc``, ``req_to_token``) that indexes the K/V
buffers of all layers. Here that id is *virtual*: each layer group ``g`` has its own allocator of
*physical* slots ``1..P_g`` and a map ``group_loc[g]`` from virtual id to physical slot (0 = absent),
the scheme of SGLang's SWA pool (``full_to_swa_index_mapping``). The K/V buffers stay SGLang's own
(one ``(P_g + 1, heads, head_dim)`` tensor per layer of group ``g``, ``P_g`` sized by the group's
budget for the bytes of SGLang's ``P``-slot pool: :mod:`sglang_pask.kvpool.sizing`); a layer of group ``g``
indexes its buffers with ``g``'s physical slots. So a group can drop a token (its slot goes back to
that group's allocator and serves another request) while other groups keep it, and the groups' slots
serve up to ``V > P`` virtual tokens when the groups keep a fraction of each request.

With nothing dropped (budget 1.0) every group has ``P`` slots, the map is a bijection that is never
consulted differently from SGLang's own ids, and every layer reads exactly the K/V that stock SGLang
reads.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Optional

import torch
from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
from sglang.srt.mem_cache.memory_pool import KvBufferDesc, KVWriteLoc, MHATokenToKVPool, _set_kv_buffer_impl
from sglang.srt.mem_cache.prefill_budget import PrefillBudget

from sglang_pask.kvpool.sizing import LayerGroupLayout

if TYPE_CHECKING:
    from sglang_pask.kvpool.lowbit import LowBitStore


class LayerGroupMHAKVPool(MHATokenToKVPool):
    """SGLang's MHA pool whose writes go to each layer group's physical slots.

    Built by SGLang's own configurator with ``layout`` bound (``size`` is ``P``): a layer of group
    ``g`` gets K and V buffers of ``(P_g + page_size, heads, head_dim)`` (SGLang's own buffers, per
    group size). ``group_loc`` is ``(num_groups, V + 1)`` int32, row 0 unused (slot 0 is SGLang's
    padding slot and maps to physical 0 in every group).
    """

    layout: LayerGroupLayout
    group_loc: torch.Tensor
    layer_group: list[int]

    def __init__(self, size: int, *args: Any, layout: LayerGroupLayout, **kwargs: Any):
        if layout.physical_slots != size:
            raise ValueError(f"layout has {layout.physical_slots} physical slots but the pool has {size}")
        if not layout.equal_groups and kwargs.get("post_capture_active"):
            raise NotImplementedError("layer groups of different sizes do not support post-capture KV backing")
        self.layout = layout  # read by _create_buffers_normal, inside SGLang's constructor
        super().__init__(size, *args, **kwargs)
        if sum(len(r) for r in layout.ranges) != self.layer_num:
            raise ValueError(f"layer groups {layout.ranges} do not cover the pool's {self.layer_num} layers")
        if not layout.equal_groups and self.page_size != 1:
            raise ValueError(f"layer groups of different sizes need page size 1, got {self.page_size}")
        self.layer_group = layout.group_of_layer()
        self.group_loc = torch.zeros(
            (layout.num_groups, layout.virtual_slots + 1), dtype=torch.int32, device=self.device
        )

    def _create_buffers_normal(self) -> None:
        """SGLang's buffers, each group's layers with ``P_g`` slots.

        SGLang's own code builds them, one group at a time with its ``size`` and ``layer_num`` set
        to the group's (same layout, memory-saver region and memory pool as stock SGLang).
        """
        layout = self.layout
        if layout.equal_groups:
            super()._create_buffers_normal()
            return
        if self.kv_cache_layout != "nhd":
            raise NotImplementedError(
                f"layer groups of different sizes support SGLang's NHD KV layout only, not {self.kv_cache_layout!r}"
            )
        size, layer_num = self.size, self.layer_num
        k_buffers: list[torch.Tensor] = []
        v_buffers: list[torch.Tensor] = []
        try:
            for layers, slots in zip(layout.ranges, layout.group_slots):
                self.size, self.layer_num = slots, len(layers)
                super()._create_buffers_normal()
                k_buffers += self.k_buffer
                v_buffers += self.v_buffer
        finally:
            self.size, self.layer_num = size, layer_num
        self.k_buffer, self.v_buffer = k_buffers, v_buffers

    def _build_kv_buffer_descs(self) -> list[KvBufferDesc]:
        """SGLang's per-buffer descriptors (k0..k(L-1), then v0..v(L-1)), each with its layer's own
        shape. (Consumers that size every buffer from ``size``, as PD transfer does, are not
        supported with groups of different sizes.)"""
        if self.layout.equal_groups:
            return super()._build_kv_buffer_descs()
        itemsize = self.store_dtype.itemsize
        return [
            KvBufferDesc(
                f"{prefix}{layer}",
                tuple(buffer.shape),
                row_bytes=math.prod(buffer.shape[1:]) * itemsize,
                tokens_per_row=1,
            )
            for prefix, buffers in (("k", self.k_buffer), ("v", self.v_buffer))
            for layer, buffer in enumerate(buffers)
        ]

    def _store_kv_layer(self, layer_idx: int, loc: torch.Tensor, cache_k: torch.Tensor, cache_v: torch.Tensor) -> None:
        """SGLang's write into layer ``layer_idx``, bounded by that layer's own rows."""
        if self.layout.equal_groups:
            super()._store_kv_layer(layer_idx, loc, cache_k, cache_v)
            return
        _set_kv_buffer_impl(
            cache_k,
            cache_v,
            self.k_buffer[layer_idx],
            self.v_buffer[layer_idx],
            loc,
            row_dim=self.row_dim,
            store_dtype=self.store_dtype,
            device_module=self.device_module,
            size_limit=int(self.k_buffer[layer_idx].shape[0]),
            alt_stream=self.alt_stream,
            v_row_dim=self.v_row_dim,
        )

    def physical(self, group: int, virtual_loc: torch.Tensor) -> torch.Tensor:
        """Physical slots of ``group`` for ``virtual_loc`` (any shape, int), int64; 0 where absent."""
        return self.group_loc[group][virtual_loc.long()].long()

    def set_kv_buffer(
        self, layer: Any, loc_info: Any, cache_k: torch.Tensor, cache_v: torch.Tensor, *args: Any, **kwargs: Any
    ) -> None:
        """SGLang's write, with the virtual ``loc`` translated to the layer group's physical slots."""
        loc = loc_info.loc if isinstance(loc_info, KVWriteLoc) else loc_info
        layer_id = kwargs.get("layer_id_override") or layer.layer_id
        physical = self.physical(self.layer_group[layer_id - self.start_layer], loc)
        super().set_kv_buffer(layer, physical, cache_k, cache_v, *args, **kwargs)

    def bytes_per_slot(self, group: int) -> int:
        """K and V bytes one physical slot of ``group`` holds over the group's layers."""
        per_layer = self.head_num * (self.head_dim + self.v_head_dim) * self.store_dtype.itemsize
        return per_layer * len(self.layout.ranges[group])

    def group_buffer_bytes(self, group: int) -> int:
        """Bytes of the K and V buffers of ``group``'s layers, as allocated (padding rows included)."""
        return sum(
            self.k_buffer[layer - self.start_layer].nbytes + self.v_buffer[layer - self.start_layer].nbytes
            for layer in self.layout.ranges[group]
        )


class LayerGroupAllocator(TokenToKVPoolAllocator):
    """SGLang's token allocator over virtual ids, allocating a physical slot in every group per id.

    ``alloc(n)`` takes ``n`` virtual ids and ``n`` physical slots in each group (all or nothing);
    ``free(ids)`` returns the ids and whatever physical slots they still hold; :meth:`drop` returns
    one group's slots of some ids while the ids stay allocated. ``available_size()`` is what can be
    allocated now: the fewest free ids or free slots of any group (the fullest group, in tokens).
    Admission counts every group on its own (:class:`~sglang_pask.srt.admission.LayerGroupPrefillBudget`).
    Under a low-bit ``--kv-dropped`` mode the groups' blocks (:attr:`lowbit`) take slots of the same
    allocators (:meth:`alloc_block_slots`, :meth:`free_block_slots`) that no virtual id maps, and
    ``free(ids)`` also takes the ids out of their blocks (a block's slots return with its last id).

    Parameters
    ----------
    pool : LayerGroupMHAKVPool
        The pool (its layout gives the slot counts).
    budgets : Sequence[float], optional
        ``(num_groups,)`` group budgets, for the decode growth (all 1.0 when omitted).
    growth_overhead : int
        Fixed slots a request's decode may hold above ``b_g`` of its tokens in a group (window,
        reserved tokens, compression slack).
    compress_decode : bool
        Whether decode compresses generated tokens (``--kv-decode compress``); when False every
        decoded token keeps its slot in every group.
    prefill_chunk : int, optional
        The most tokens one prefill pass writes (``--chunked-prefill-size``); None when chunked
        prefill is off.
    """

    def __init__(
        self,
        pool: LayerGroupMHAKVPool,
        dtype: torch.dtype,
        device: str,
        need_sort: bool,
        budgets: Optional[Sequence[float]] = None,
        growth_overhead: int = 0,
        prefill_chunk: Optional[int] = None,
        compress_decode: bool = True,
    ):
        layout = pool.layout
        budgets = [1.0] * layout.num_groups if budgets is None else list(budgets)
        if len(budgets) != layout.num_groups:
            raise ValueError(f"{len(budgets)} budgets for {layout.num_groups} layer groups")
        self.pool = pool
        self.budgets = budgets
        self.growth_overhead = growth_overhead
        self.compress_decode = compress_decode
        self.prefill_chunk = prefill_chunk
        self.peak_group_used = [0] * layout.num_groups
        self.lowbit: Optional[LowBitStore] = None
        self.group_allocators = [
            TokenToKVPoolAllocator(slots, dtype, device, pool, need_sort=False) for slots in layout.group_slots
        ]
        super().__init__(layout.virtual_slots, dtype, device, pool, need_sort)

    def clear(self) -> None:
        super().clear()
        for allocator in self.group_allocators:
            allocator.clear()
        self.pool.group_loc.zero_()
        if self.lowbit is not None:
            self.lowbit.clear()

    def decode_growth(self, group: int, new_tokens: float) -> float:
        """Slots a request's next ``new_tokens`` decoded tokens take in ``group``.

        The group keeps about ``b_g`` of the decoded tokens plus a fixed overhead (the window, the
        policy's reserved tokens, the compression slack): ``min(n, b_g * n + overhead)``. Admission
        reserves this for decode growth in the group instead of ``n``; ``n`` when decode keeps
        every generated token.
        """
        if not self.compress_decode:
            return new_tokens
        return min(new_tokens, self.budgets[group] * new_tokens + self.growth_overhead)

    def prompt_peak(self, group: int, prompt_tokens: int) -> float:
        """The most slots a prompt of ``prompt_tokens`` new tokens holds in ``group`` while it is
        prefilled.

        A pass writes its tokens to every group and each group then compresses them to about
        ``b_g`` of them plus the fixed overhead. Passes are at most the prefill chunk ``c`` (the first
        may be shorter), so there are at most ``ceil(n / c) + 1`` of them. The peak is the earlier
        passes' kept tokens plus the last pass written in full:
        ``min(n, b_g * n + (ceil(n / c) + 1) * overhead + c)``; ``n`` without chunked prefill.
        """
        chunk = self.prefill_chunk
        if chunk is None or prompt_tokens <= chunk:
            return prompt_tokens
        passes = -(-prompt_tokens // chunk) + 1
        return min(prompt_tokens, self.budgets[group] * prompt_tokens + passes * self.growth_overhead + chunk)

    def create_prefill_budget(self, tree_cache: Any, *, num_mixed_decode_tokens: int = 0) -> PrefillBudget:
        from sglang_pask.srt.admission import LayerGroupPrefillBudget

        return LayerGroupPrefillBudget(self, tree_cache, num_mixed_decode_tokens=num_mixed_decode_tokens)

    def available_size(self) -> int:
        return min(super().available_size(), *(a.available_size() for a in self.group_allocators))

    def virtual_available_size(self) -> int:
        """Free virtual ids (for the scheduler's conservation check)."""
        return super().available_size()

    def allocatable_after_eviction(self, evictable: torch.Tensor) -> tuple[int, list[int]]:
        """What could be allocated once the unlocked part of the prefix cache is evicted.

        Parameters
        ----------
        evictable : torch.Tensor
            ``(n,)`` int virtual ids of the prefix cache's unlocked (evictable) tokens.

        Returns
        -------
        tuple[int, list[int]]
            The free ids plus ``n``, and ``(num_groups,)`` per group the free slots plus the slots
            those ids hold there (a group holds a slot for only the tokens it kept, and under
            a low-bit ``--kv-dropped`` mode the slots of the blocks left without a token).
        """
        held = (
            (self.pool.group_loc[:, evictable.long()] > 0).sum(dim=1).tolist()
            if evictable.numel()
            else [0] * len(self.group_allocators)
        )
        if self.lowbit is not None and evictable.numel():
            held = [h + self.lowbit.freed_by(group, evictable) for group, h in enumerate(held)]
        per_group = [a.available_size() + h for a, h in zip(self.group_allocators, held)]
        return self.virtual_available_size() + int(evictable.numel()), per_group

    def group_used_slots(self, group: int) -> int:
        """Physical slots of ``group`` in use."""
        return self.pool.layout.group_slots[group] - self.group_allocators[group].available_size()

    def alloc(self, need_size: int) -> Optional[torch.Tensor]:
        virtual = super().alloc(need_size)
        if virtual is None:
            return None
        taken: list[torch.Tensor] = []
        for allocator in self.group_allocators:
            physical = allocator.alloc(need_size)
            if physical is None:
                for group, slots in enumerate(taken):
                    self.group_allocators[group].free(slots)
                self.free_pages = torch.cat((virtual, self.free_pages))
                return None
            taken.append(physical)
        for group, physical in enumerate(taken):
            self.pool.group_loc[group][virtual] = physical.to(torch.int32)
            self.peak_group_used[group] = max(self.peak_group_used[group], self.group_used_slots(group))
        return virtual

    def alloc_block_slots(self, group: int, count: int) -> Optional[torch.Tensor]:
        """``(count,)`` free physical slots of ``group`` that no virtual id maps (low-bit blocks), or
        None if the group has fewer free."""
        slots = self.group_allocators[group].alloc(count)
        if slots is not None:
            self.peak_group_used[group] = max(self.peak_group_used[group], self.group_used_slots(group))
        return slots

    def free_block_slots(self, group: int, slots: torch.Tensor) -> None:
        """Return :meth:`alloc_block_slots`'s ``slots`` (``(n,)`` int) to ``group``'s allocator."""
        self.group_allocators[group].free(slots)

    def free(self, free_index: torch.Tensor) -> None:
        if free_index.numel() == 0:
            return
        if self.free_group is not None:
            self.free_group.append(self._copy_for_free_group(free_index))
            return
        for group in range(len(self.group_allocators)):
            self.drop(group, free_index)
        if self.lowbit is not None:
            self.lowbit.forget(free_index)
        super().free(free_index)

    def drop(self, group: int, virtual: torch.Tensor) -> int:
        """Return ``group``'s physical slots of the ``virtual`` ids (those still present).

        Parameters
        ----------
        group : int
            The layer group.
        virtual : torch.Tensor
            ``(n,)`` int virtual ids, allocated.

        Returns
        -------
        int
            How many slots went back to the group's allocator.
        """
        virtual = virtual.long()
        physical = self.pool.group_loc[group][virtual].long()
        present = physical > 0
        slots = physical[present]
        if slots.numel():
            self.group_allocators[group].free(slots)
            self.pool.group_loc[group][virtual[present]] = 0
        return int(slots.numel())

    def evict_to_free_tokens(self, tree_cache: Any, num_tokens: int) -> None:
        """Evict unlocked prefix-cache entries until ``num_tokens`` can be allocated.

        A cached token may hold fewer physical slots than ids (groups dropped some before it was
        cached), so one eviction sized in ids can free too few slots: repeat while it helps.
        """
        from sglang.srt.mem_cache.base_prefix_cache import EvictParams

        if tree_cache is None or not tree_cache.supports_prefix_sharing():
            return
        while self.available_size() < num_tokens:
            result = tree_cache.evict(EvictParams(num_tokens=num_tokens - self.available_size()))
            if result.num_tokens_evicted == 0:
                return

    def check_slots(self) -> list[str]:
        """Conservation of every group's slots: free + mapped (+ held by low-bit blocks) == P_g and no
        slot used twice.

        Returns
        -------
        list[str]
            One message per violated group (empty when all hold).
        """
        problems = []
        layout = self.pool.layout
        for group, allocator in enumerate(self.group_allocators):
            slots = layout.group_slots[group]
            mapped = self.pool.group_loc[group][1:].long()
            mapped = mapped[mapped > 0]
            if self.lowbit is not None:
                mapped = torch.cat((mapped, self.lowbit.held_slots(group)))
            free = allocator.get_all_free_pages()
            if mapped.numel() + free.numel() != slots:
                problems.append(f"layer group {group}: {mapped.numel()} mapped + {free.numel()} free slots != {slots}")
            elif bool(((free < 1) | (free > slots)).any()) or bool((mapped > slots).any()):
                problems.append(f"layer group {group}: a slot outside 1..{slots}")
            elif torch.unique(torch.cat((mapped, free))).numel() != slots:
                problems.append(f"layer group {group}: a physical slot is mapped twice or both mapped and free")
        return problems
