"""The layer-group KV pool and its allocator: each layer group owns its own slot space.

SGLang gives every token one slot id (``out_cache_loc``, ``req_to_token``) that indexes the K/V
buffers of all layers. Here that id is *virtual*: each layer group ``g`` has its own allocator of
*physical* slots ``1..P`` and a map ``group_loc[g]`` from virtual id to physical slot (0 = absent),
the scheme of SGLang's SWA pool (``full_to_swa_index_mapping``). The K/V buffers stay SGLang's own
(one ``(P + 1, heads, head_dim)`` tensor per layer); a layer of group ``g`` indexes its buffers with
``g``'s physical slots. So a group can drop a token (its slot goes back to that group's allocator and
serves another request) while other groups keep it, and P physical slots serve up to ``V > P``
virtual tokens when the groups keep a fraction of each request.

With nothing dropped (budget 1.0) the map is a bijection that is never consulted differently from
SGLang's own ids, and every layer reads exactly the K/V that stock SGLang reads.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

import torch
from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
from sglang.srt.mem_cache.memory_pool import KVWriteLoc, MHATokenToKVPool
from sglang.srt.mem_cache.prefill_budget import PrefillBudget


@dataclass(frozen=True)
class LayerGroupLayout:
    """Which layers form which group, and the slot counts.

    Attributes
    ----------
    ranges : tuple[range, ...]
        Each group's layers, lowest first; together they cover ``0 .. num_layers - 1``.
    physical_slots : int
        ``P``: slots per group (the size SGLang sized its pool to).
    virtual_slots : int
        ``V >= P``: token ids SGLang's scheduler may hand out.
    """

    ranges: tuple[range, ...]
    physical_slots: int
    virtual_slots: int

    @property
    def num_groups(self) -> int:
        return len(self.ranges)

    def group_of_layer(self) -> list[int]:
        """``(num_layers,)``: the group of each layer."""
        return [g for g, layers in enumerate(self.ranges) for _ in layers]

    def last_layers(self) -> list[int]:
        """``(num_groups,)``: the last layer of each group."""
        return [layers[-1] for layers in self.ranges]


def virtual_slot_count(physical_slots: int, largest_group_budget: float) -> int:
    """``V``: the token ids that ``P`` physical slots per group back.

    A request holds an id for every one of its tokens but a slot only for those its groups keep, so
    when groups keep about ``b`` of each request, ``P`` slots serve about ``P / b`` ids, more with
    the fixed window overhead. Ids cost only map entries, so ``V = ceil(2 P / b)`` leaves the groups'
    slots, not the ids, as what runs out; ``V = P`` at budget 1.0 (SGLang's own capacity).
    """
    if largest_group_budget >= 1.0:
        return physical_slots
    return math.ceil(2 * physical_slots / largest_group_budget - 1e-9)


class LayerGroupMHAKVPool(MHATokenToKVPool):
    """SGLang's MHA pool whose writes go to each layer group's physical slots.

    Built by SGLang's own configurator (same buffers, same size ``P``); :meth:`attach_layout` then
    adds the per-group maps. ``group_loc`` is ``(num_groups, V + 1)`` int32, row 0 unused (slot 0 is
    SGLang's padding slot and maps to physical 0 in every group).
    """

    layout: LayerGroupLayout
    group_loc: torch.Tensor
    layer_group: list[int]

    def attach_layout(self, layout: LayerGroupLayout) -> None:
        """Add the virtual-to-physical maps for ``layout`` (all absent)."""
        if layout.physical_slots != self.size:
            raise ValueError(f"layout has {layout.physical_slots} physical slots but the pool has {self.size}")
        num_layers = self.layer_num
        if sum(len(r) for r in layout.ranges) != num_layers:
            raise ValueError(f"layer groups {layout.ranges} do not cover the pool's {num_layers} layers")
        self.layout = layout
        self.layer_group = layout.group_of_layer()
        self.group_loc = torch.zeros((layout.num_groups, layout.virtual_slots + 1), dtype=torch.int32, device=self.device)

    def physical(self, group: int, virtual_loc: torch.Tensor) -> torch.Tensor:
        """Physical slots of ``group`` for ``virtual_loc`` (any shape, int), int64; 0 where absent."""
        return self.group_loc[group][virtual_loc.long()].long()

    def set_kv_buffer(self, layer: Any, loc_info: Any, cache_k: torch.Tensor, cache_v: torch.Tensor, *args: Any,
                      **kwargs: Any) -> None:
        """SGLang's write, with the virtual ``loc`` translated to the layer group's physical slots."""
        loc = loc_info.loc if isinstance(loc_info, KVWriteLoc) else loc_info
        layer_id = kwargs.get("layer_id_override") or layer.layer_id
        physical = self.physical(self.layer_group[layer_id - self.start_layer], loc)
        super().set_kv_buffer(layer, physical, cache_k, cache_v, *args, **kwargs)

    def bytes_per_slot(self, group: int) -> int:
        """K and V bytes one physical slot of ``group`` holds over the group's layers."""
        per_layer = self.head_num * (self.head_dim + self.v_head_dim) * self.store_dtype.itemsize
        return per_layer * len(self.layout.ranges[group])


class LayerGroupAllocator(TokenToKVPoolAllocator):
    """SGLang's token allocator over virtual ids, allocating a physical slot in every group per id.

    ``alloc(n)`` takes ``n`` virtual ids and ``n`` physical slots in each group (all or nothing);
    ``free(ids)`` returns the ids and whatever physical slots they still hold; :meth:`drop` returns
    one group's slots of some ids while the ids stay allocated. ``available_size()`` is what can be
    allocated now: the smallest free count over the virtual ids and the groups.
    """

    def __init__(self, pool: LayerGroupMHAKVPool, dtype: torch.dtype, device: str, need_sort: bool,
                 growth_budget: float = 1.0, growth_overhead: int = 0):
        layout = pool.layout
        self.pool = pool
        self.growth_budget = growth_budget
        self.growth_overhead = growth_overhead
        self.peak_group_used = [0] * layout.num_groups
        self.group_allocators = [
            TokenToKVPoolAllocator(layout.physical_slots, dtype, device, pool, need_sort=False)
            for _ in range(layout.num_groups)
        ]
        super().__init__(layout.virtual_slots, dtype, device, pool, need_sort)

    def clear(self) -> None:
        super().clear()
        for allocator in self.group_allocators:
            allocator.clear()
        self.pool.group_loc.zero_()

    def decode_growth(self, new_tokens: float) -> float:
        """Slots a request's next ``new_tokens`` decoded tokens take in the fullest group.

        The groups keep about ``b`` of the decoded tokens plus a fixed overhead (the window, the
        policy's reserved tokens, the compression slack): ``min(n, b * n + overhead)``. SGLang's
        admission reserves this for decode growth instead of ``n``.
        """
        return min(new_tokens, self.growth_budget * new_tokens + self.growth_overhead)

    def create_prefill_budget(self, tree_cache: Any, *, num_mixed_decode_tokens: int = 0) -> PrefillBudget:
        return LayerGroupPrefillBudget(self, tree_cache, num_mixed_decode_tokens=num_mixed_decode_tokens)

    def available_size(self) -> int:
        return min(super().available_size(), *(a.available_size() for a in self.group_allocators))

    def virtual_available_size(self) -> int:
        """Free virtual ids (for the scheduler's conservation check)."""
        return super().available_size()

    def allocatable_after_eviction(self, cached: torch.Tensor, cached_evictable: int, protected: int) -> int:
        """How many tokens could be allocated once the unlocked part of the prefix cache is evicted.

        Per group, the free slots plus what the cache's evictable tokens hold there, which is at
        least the slots the cache holds in that group minus one per protected (locked) token; for
        ids, the free ids plus the evictable tokens. The smallest of these: a lower bound.

        Parameters
        ----------
        cached : torch.Tensor
            ``(n,)`` int virtual ids the prefix cache holds.
        cached_evictable : int
            How many of them are evictable.
        protected : int
            How many of them are locked by running requests.
        """
        held = (self.pool.group_loc[:, cached.long()] > 0).sum(dim=1).tolist() if cached.numel() else \
            [0] * len(self.group_allocators)
        per_group = [a.available_size() + max(0, h - protected) for a, h in zip(self.group_allocators, held)]
        return min(self.virtual_available_size() + cached_evictable, *per_group)

    def group_used_slots(self, group: int) -> int:
        """Physical slots of ``group`` in use."""
        return self.pool.layout.physical_slots - self.group_allocators[group].available_size()

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

    def free(self, free_index: torch.Tensor) -> None:
        if free_index.numel() == 0:
            return
        if self.free_group is not None:
            self.free_group.append(self._copy_for_free_group(free_index))
            return
        for group in range(len(self.group_allocators)):
            self.drop(group, free_index)
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
        """Conservation of every group's slots: free + mapped == P and no slot mapped twice.

        Returns
        -------
        list[str]
            One message per violated group (empty when all hold).
        """
        problems = []
        layout = self.pool.layout
        for group, allocator in enumerate(self.group_allocators):
            mapped = self.pool.group_loc[group][1:].long()
            mapped = mapped[mapped > 0]
            free = allocator.get_all_free_pages()
            if mapped.numel() + free.numel() != layout.physical_slots:
                problems.append(
                    f"layer group {group}: {mapped.numel()} mapped + {free.numel()} free slots != "
                    f"{layout.physical_slots}"
                )
            elif torch.unique(torch.cat((mapped, free))).numel() != layout.physical_slots:
                problems.append(f"layer group {group}: a physical slot is mapped twice or both mapped and free")
        return problems


class LayerGroupPrefillBudget(PrefillBudget):
    """SGLang's prefill admission budget, counting slots as the layer groups hold them.

    * The prompt is charged in full (prefill writes every token to every group before the policy
      compresses them); a request's future decode tokens are charged
      :meth:`LayerGroupAllocator.decode_growth`.
    * What evicting the prefix cache would free is counted per group in slots, not in token ids: a
      cached token whose group slots were dropped before it was cached frees fewer slots than ids
      (:meth:`LayerGroupAllocator.allocatable_after_eviction`, taken once per scheduling round).
    """

    allocator: LayerGroupAllocator
    _allocatable: Optional[int] = None

    def _available_and_evictable(self) -> int:
        if self._allocatable is None:
            tree = self.tree_cache
            if tree is None or not tree.supports_prefix_sharing():
                self._allocatable = self.allocator.available_size()
            else:
                self._allocatable = self.allocator.allocatable_after_eviction(
                    tree.all_values_flatten(), tree.evictable_size(), tree.protected_size())
        return self._allocatable

    def reserve(self, extend_input_len: int, max_new_tokens: int, **kwargs: Any) -> None:
        super().reserve(extend_input_len, self.allocator.decode_growth(max_new_tokens), **kwargs)


def running_decode_reserve(original: Any, adder: Any, req: Any) -> float:
    """AROUND hook of ``PrefillAdder._get_running_request_total_token_offset``: a running request's
    decode headroom, as its layer groups will keep it."""
    reserve = original(adder, req)
    allocator = adder.token_to_kv_pool_allocator
    return allocator.decode_growth(reserve) if isinstance(allocator, LayerGroupAllocator) else reserve
