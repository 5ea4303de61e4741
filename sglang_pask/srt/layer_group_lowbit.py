"""``--kv-dropped 2bit``: the tokens a layer group drops stay readable at 2 bits, in the group's own slots.

When a group drops some of a request's tokens (:class:`~.kv_views.KVViewTable` via the runtime's drop
function), their K and V in each of the group's layers are quantized in blocks of up to 32 tokens
(ascending positions) in KIVI's layout (:mod:`sglang_pask.kernels.kv_2bit`: keys per channel, values
per token), their full-precision slots go back to the group's allocator, and each block's packed
bytes are written into :attr:`LowBitStore.rows_per_block` physical slots taken from the same
allocator: the block's packed keys fill those slots' rows of each layer's K buffer, its packed
values the rows of the V buffer. A block costs ``12 * heads * head_dim`` bytes per layer in each of
K and V, so ``12 / itemsize`` rows (6 in bf16, 3 in float32): a dropped token costs 3/16 of a bf16
slot instead of a whole one, and the pool's byte budget, admission and leak checks see those slots
like any other.

Attention then reads, per request, the full-precision positions of its view and the dequantized 2-bit
tokens (:meth:`LowBitStore.read`). A request's blocks are its own: they are freed when it leaves the
request pool (a later request reusing its prefix from the radix cache reads only the tokens kept at
full precision). If the group has no free slots for a block, its tokens are dropped outright and
counted in :attr:`LowBitStore.unstored_tokens`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from sglang_pask.kernels.kv_2bit import (
    BLOCK_TOKENS,
    check_head_dim,
    dequantize_key_blocks,
    dequantize_value_blocks,
    packed_block_bytes,
    pad_block,
    quantize_key_blocks,
    quantize_value_blocks,
)


def rows_per_block(itemsize: int) -> int:
    """Physical slots one 2-bit block of :data:`BLOCK_TOKENS` tokens takes in a pool whose K/V
    elements have ``itemsize`` bytes: ``12 / itemsize`` (one slot's row is ``heads * head_dim``
    elements in each of K and V)."""
    if itemsize not in (1, 2, 4):
        raise ValueError(f"2-bit blocks need a KV element of 1, 2 or 4 bytes, got {itemsize}")
    return 12 // itemsize


def storage_budget(budget: float, itemsize: int) -> float:
    """A group's share of full KV's slots when it keeps ``budget`` of a request's tokens in full and
    the rest in 2-bit blocks: ``budget + (1 - budget) * rows_per_block / BLOCK_TOKENS``."""
    return budget + (1.0 - budget) * rows_per_block(itemsize) / BLOCK_TOKENS


@dataclass
class GroupBlocks:
    """One request's 2-bit tokens in one layer group.

    Attributes
    ----------
    positions : list[Tensor]
        Per block, ``(m,)`` int64 ascending positions, ``1 <= m <= BLOCK_TOKENS``.
    slots : list[Tensor]
        Per block, ``(rows_per_block,)`` int64 physical slots of the group holding it.
    """

    positions: list[torch.Tensor] = field(default_factory=list)
    slots: list[torch.Tensor] = field(default_factory=list)
    # (all positions (t,), all slots (blocks * rows,), the block-padded index of each position (t,)),
    # rebuilt after a change.
    _flat: Optional[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = None

    def flat(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if self._flat is None:
            positions = torch.cat(self.positions)
            index = torch.cat([torch.arange(p.numel(), device=p.device) + BLOCK_TOKENS * b
                               for b, p in enumerate(self.positions)])
            self._flat = (positions, torch.cat(self.slots), index)
        return self._flat

    @property
    def tokens(self) -> int:
        return sum(int(p.numel()) for p in self.positions)


class LowBitStore:
    """Every running request's 2-bit tokens, per layer group, in the groups' physical slots.

    Parameters
    ----------
    pool : LayerGroupMHAKVPool
        The pool whose K/V buffers hold the blocks (``heads``, ``head_dim`` and ``store_dtype`` as
        SGLang set them; K and V head dims must be equal).
    allocator : LayerGroupAllocator
        Gives and takes back the groups' physical slots (:meth:`~.layer_group_pool.LayerGroupAllocator.alloc_block_slots`).
    """

    def __init__(self, pool: Any, allocator: Any):
        if pool.head_dim != pool.v_head_dim:
            raise RuntimeError(f"--kv-dropped 2bit needs equal K and V head dims, got {pool.head_dim} and "
                               f"{pool.v_head_dim}")
        try:
            check_head_dim(pool.head_dim)
            self.rows_per_block = rows_per_block(pool.store_dtype.itemsize)
        except ValueError as err:
            raise RuntimeError(f"--kv-dropped 2bit: {err}") from None
        self.pool = pool
        self.allocator = allocator
        self.heads, self.head_dim = pool.head_num, pool.head_dim
        self.block_bytes = packed_block_bytes(self.heads, self.head_dim)
        self.requests: dict[int, list[GroupBlocks]] = {}
        self.unstored_tokens = 0

    def _buffers(self, group: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        pool = self.pool
        return [(pool.k_buffer[layer - pool.start_layer], pool.v_buffer[layer - pool.start_layer])
                for layer in pool.layout.ranges[group]]

    def drop(self, row: int, group: int, positions: torch.Tensor, virtual: torch.Tensor) -> None:
        """Request ``row``'s ``group`` drops ``positions`` (``(n,)`` int64 ascending, virtual ids
        ``virtual``): their full-precision slots go back to the group's allocator and those still held
        stay as 2-bit blocks."""
        physical = self.pool.physical(group, virtual)
        present = physical > 0
        if not bool(present.any()):
            return
        packed = self.quantize(group, physical[present])  # read before the slots go back
        self.allocator.drop(group, virtual)
        self.place(row, group, positions[present], packed)

    def quantize(self, group: int, physical: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Pack the K/V that ``physical`` slots hold in each of ``group``'s layers.

        Parameters
        ----------
        physical : Tensor
            ``(n,)`` int64 physical slots of the group, in ascending position order, ``n >= 1``.

        Returns
        -------
        list[tuple[Tensor, Tensor]]
            Per layer of the group, packed keys and values, each ``(ceil(n / BLOCK_TOKENS), block_bytes)`` uint8.
        """
        chunks = physical.split(BLOCK_TOKENS)
        packed = []
        for k_buffer, v_buffer in self._buffers(group):
            keys = torch.stack([pad_block(k_buffer[chunk]) for chunk in chunks])
            values = torch.stack([pad_block(v_buffer[chunk]) for chunk in chunks])
            packed.append((quantize_key_blocks(keys), quantize_value_blocks(values)))
        return packed

    def place(self, row: int, group: int, positions: torch.Tensor,
              packed: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Store :meth:`quantize`'s blocks of ``positions`` (``(n,)`` int64 ascending) for request
        ``row`` in ``group``, in slots taken from the group's allocator (after the tokens' own slots
        went back to it). Without enough free slots the tokens are not stored."""
        blocks = packed[0][0].shape[0]
        slots = self.allocator.alloc_block_slots(group, blocks * self.rows_per_block)
        if slots is None:
            self.unstored_tokens += int(positions.numel())
            return
        slots = slots.long()
        for (k_buffer, v_buffer), (keys, values) in zip(self._buffers(group), packed):
            k_buffer[slots] = keys.view(k_buffer.dtype).reshape(-1, *k_buffer.shape[1:])
            v_buffer[slots] = values.view(v_buffer.dtype).reshape(-1, *v_buffer.shape[1:])
        held = self.requests.setdefault(row, [GroupBlocks() for _ in self.pool.layout.ranges])[group]
        held.positions += list(positions.split(BLOCK_TOKENS))
        held.slots += list(slots.split(self.rows_per_block))
        held._flat = None

    def read(self, row: int, group: int, layer_id: int) -> Optional[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """Request ``row``'s 2-bit tokens in layer ``layer_id`` of ``group``, dequantized.

        Returns
        -------
        tuple[Tensor, Tensor, Tensor] or None
            Positions ``(t,)`` int64 (ascending within each block, blocks in the order stored), keys
            and values ``(t, heads, head_dim)`` float32; None when the request has none in the group.
        """
        held = self.requests.get(row)
        if held is None or not held[group].positions:
            return None
        positions, slots, index = held[group].flat()
        layer = layer_id - self.pool.start_layer
        keys = self.pool.k_buffer[layer][slots].view(torch.uint8).reshape(-1, self.block_bytes)
        values = self.pool.v_buffer[layer][slots].view(torch.uint8).reshape(-1, self.block_bytes)
        keys = dequantize_key_blocks(keys, self.heads, self.head_dim).flatten(0, 1)[index]
        values = dequantize_value_blocks(values, self.heads, self.head_dim).flatten(0, 1)[index]
        return positions, keys, values

    def positions(self, row: int) -> list[torch.Tensor]:
        """``(num_groups,)`` of ``(t_g,)`` int64: the positions request ``row`` holds at 2 bits per group."""
        held = self.requests.get(row)
        empty = torch.zeros(0, dtype=torch.int64, device=self.pool.device)
        if held is None:
            return [empty for _ in self.pool.layout.ranges]
        return [blocks.flat()[0] if blocks.positions else empty for blocks in held]

    def slot_counts(self, row: int) -> list[int]:
        """``(num_groups,)``: the physical slots request ``row``'s 2-bit blocks take in each group."""
        held = self.requests.get(row)
        return [len(blocks.slots) * self.rows_per_block for blocks in held] if held is not None \
            else [0] * len(self.pool.layout.ranges)

    def release(self, row: int) -> None:
        """Request ``row`` left the pool: its blocks' slots go back to their groups."""
        held = self.requests.pop(row, None)
        for group, blocks in enumerate(held or []):
            if blocks.slots:
                self.allocator.free_block_slots(group, torch.cat(blocks.slots))

    def held_slots(self, group: int) -> torch.Tensor:
        """``(s,)`` int64: every physical slot of ``group`` holding a 2-bit block."""
        slots = [torch.cat(held[group].slots) for held in self.requests.values() if held[group].slots]
        return torch.cat(slots) if slots else torch.zeros(0, dtype=torch.int64, device=self.pool.device)

    def clear(self) -> None:
        """Forget every block (the allocator was cleared)."""
        self.requests.clear()
