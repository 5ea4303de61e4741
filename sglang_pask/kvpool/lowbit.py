"""``--kv-dropped 2bit|k4v2``: the tokens a layer group drops stay readable at low precision, in the group's own slots.

When a group drops some tokens (:class:`~sglang_pask.kvpool.compression.KVViewTable` via the runtime's drop function),
their K and V in each of the group's layers are quantized in blocks of up to 32 tokens (ascending
positions) in KIVI's layout (:mod:`sglang_pask.kernels.kv_lowbit`: keys per channel, values per
token), keys and values each at the :class:`BlockFormat`'s width (``2bit``: both at 2 bits;
``k4v2``: keys at 4, values at 2). Their full-precision slots go back to the
group's allocator, and each block's packed bytes (keys, then values) are written into
:meth:`BlockFormat.rows_per_block` physical slots taken from the same allocator: the first half of
the bytes fills those slots' rows of each layer's K buffer, the second half the rows of the V buffer.
A block costs ``(4 * (key_bits + value_bits) + 8) * heads * head_dim`` bytes per layer, so
``(2 * (key_bits + value_bits) + 4) / itemsize`` rows: 6 bf16 slots for 32 tokens at 2 bits (a dropped
token costs 3/16 of a bf16 slot), 8 with one half at 4 bits (1/4), and the pool's byte budget,
admission and leak checks see those slots like any other.

Blocks belong to their tokens, not to a request: the store maps each virtual id (SGLang's token id)
to its block and place in it, and a block lives while any of its tokens' ids is allocated. So a
token that reaches the radix prefix cache keeps its low-bit K/V there, and a later request matching
that prefix reads it; a block's slots go back to the group when the allocator frees the last of its
ids (:meth:`LowBitStore.forget`, from :meth:`~sglang_pask.srt.pool.LayerGroupAllocator.free`).

Attention reads, per request, the full-precision positions of its view and the dequantized low-bit
tokens of its row (:meth:`LowBitStore.locate`, :meth:`LowBitStore.read`). If the group has no free
slots for a block, its tokens are dropped outright and counted in :attr:`LowBitStore.unstored_tokens`.

Pure torch (no sglang import): the pool and its allocator are handed in.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch

from sglang_pask.kernels.kv_lowbit import (
    BLOCK_TOKENS,
    check_bits,
    check_head_dim,
    dequantize_key_blocks,
    dequantize_value_blocks,
    packed_part_bytes,
    pad_block,
    quantize_key_blocks,
    quantize_value_blocks,
    rows_per_block,
)


@dataclass(frozen=True)
class BlockFormat:
    """The code widths of a low-bit block: ``key_bits`` and ``value_bits``, each 2 or 4."""

    key_bits: int
    value_bits: int

    def __post_init__(self) -> None:
        check_bits(self.key_bits)
        check_bits(self.value_bits)

    def rows_per_block(self, itemsize: int) -> int:
        """Physical slots one block of :data:`BLOCK_TOKENS` tokens takes in a pool whose K/V elements
        have ``itemsize`` bytes: ``(2 * (key_bits + value_bits) + 4) / itemsize`` (a slot's row is
        ``heads * head_dim`` elements in each of K and V)."""
        return rows_per_block(self.key_bits, self.value_bits, itemsize)

    def storage_budget(self, budget: float, itemsize: int, lowbit_share: Optional[float] = None) -> float:
        """A group's share of full KV's slots when it keeps ``budget`` of a request's tokens in full and
        ``lowbit_share`` of them in blocks (default: all the rest, ``1 - budget``):
        ``budget + lowbit_share * rows_per_block / BLOCK_TOKENS``."""
        stored = 1.0 - budget if lowbit_share is None else lowbit_share
        return budget + stored * self.rows_per_block(itemsize) / BLOCK_TOKENS


@dataclass(frozen=True)
class LocatedTokens:
    """Where one request's low-bit tokens in one group are.

    Attributes
    ----------
    positions : Tensor
        ``(t,)`` int64 ascending positions in the request's row.
    slots : Tensor
        ``(b * rows_per_block,)`` int64 physical slots of the ``b`` blocks holding them.
    index : Tensor
        ``(t,)`` int64: each position's row in the blocks' dequantized tokens ``(b * BLOCK_TOKENS, ...)``.
    """

    positions: torch.Tensor
    slots: torch.Tensor
    index: torch.Tensor


@dataclass(frozen=True)
class BlockPlaces:
    """Where the token places of the low-bit blocks one request's row reads in one group go.

    A block has :data:`BLOCK_TOKENS` places. Each place of a block the row reads is the row's own
    token (``row_tokens``), a live token the row does not read (``other_rows``: another request's or
    the radix cache's, e.g. past the end of a matched prefix), a token freed since the block was made
    (``freed``: e.g. a duplicate the radix cache gave back on insertion), or was never filled
    (``never_filled``: the pass that made the block had fewer dropped tokens left). ``passes`` counts
    the distinct drop calls (one per layer group and extend pass of some request) that made the blocks.
    """

    blocks: int = 0
    passes: int = 0
    row_tokens: int = 0
    other_rows: int = 0
    freed: int = 0
    never_filled: int = 0

    def as_dict(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


class GroupBlockTable:
    """One layer group's low-bit blocks: their slots, how many live tokens each holds, which are free,
    how many tokens each was made with and by which drop call (:class:`BlockPlaces`).

    Parameters
    ----------
    max_blocks : int
        Blocks the group's slots can hold at most (``P_g // rows_per_block``).
    rows : int
        Physical slots per block.
    """

    def __init__(self, max_blocks: int, rows: int, device: Any):
        self.slots = torch.zeros((max_blocks, rows), dtype=torch.int64, device=device)
        self.live = torch.zeros(max_blocks, dtype=torch.int64, device=device)
        self.filled = torch.zeros(max_blocks, dtype=torch.int64, device=device)
        self.made_by = torch.zeros(max_blocks, dtype=torch.int64, device=device)
        self.free = torch.arange(max_blocks, dtype=torch.int64, device=device)

    def take(self, count: int) -> torch.Tensor:
        """``(count,)`` int64 free block ids (the caller holds the slots for them, so they exist)."""
        if count > self.free.numel():
            raise RuntimeError(
                f"low-bit block table: {count} blocks asked, {self.free.numel()} free "
                "(more blocks than the group's slots can hold)"
            )
        taken, self.free = self.free[:count], self.free[count:]
        return taken

    def held_slots(self) -> torch.Tensor:
        """``(s,)`` int64: every physical slot of a live block."""
        return self.slots[self.live > 0].flatten()

    def clear(self) -> None:
        self.slots.zero_()
        self.live.zero_()
        self.filled.zero_()
        self.made_by.zero_()
        self.free = torch.arange(self.live.numel(), dtype=torch.int64, device=self.live.device)


class LowBitStore:
    """Every low-bit token, per layer group, in the groups' physical slots, found by virtual id.

    Parameters
    ----------
    block_format : BlockFormat
        The code widths of keys and values.
    pool : LayerGroupMHAKVPool
        The pool whose K/V buffers hold the blocks (``heads``, ``head_dim`` and ``store_dtype`` as
        SGLang set them; K and V head dims must be equal).
    allocator : LayerGroupAllocator
        Gives and takes back the groups' physical slots
        (:meth:`~sglang_pask.srt.pool.LayerGroupAllocator.alloc_block_slots`).

    Attributes
    ----------
    token_block : Tensor
        ``(num_groups, V + 1)`` int32: per group and virtual id, ``block * BLOCK_TOKENS + place + 1``,
        0 where the id has no low-bit K/V in the group.
    """

    def __init__(self, block_format: BlockFormat, pool: Any, allocator: Any):
        if pool.head_dim != pool.v_head_dim:
            raise RuntimeError(
                f"low-bit blocks need equal K and V head dims, got {pool.head_dim} and {pool.v_head_dim}"
            )
        try:
            check_head_dim(pool.head_dim)
            self.rows_per_block = block_format.rows_per_block(pool.store_dtype.itemsize)
        except ValueError as err:
            raise RuntimeError(f"low-bit blocks: {err}") from None
        self.format = block_format
        self.pool = pool
        self.allocator = allocator
        self.heads, self.head_dim = pool.head_num, pool.head_dim
        self.key_bytes = packed_part_bytes(self.heads, self.head_dim, block_format.key_bits)
        self.value_bytes = packed_part_bytes(self.heads, self.head_dim, block_format.value_bits)
        layout = pool.layout
        self.token_block = torch.zeros(
            (layout.num_groups, layout.virtual_slots + 1), dtype=torch.int32, device=pool.device
        )
        self.tables = [
            GroupBlockTable(slots // self.rows_per_block, self.rows_per_block, pool.device)
            for slots in layout.group_slots
        ]
        self.unstored_tokens = 0
        self.placed_passes = 0

    def _buffers(self, group: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        pool = self.pool
        return [
            (pool.k_buffer[layer - pool.start_layer], pool.v_buffer[layer - pool.start_layer])
            for layer in pool.layout.ranges[group]
        ]

    def drop(self, group: int, virtual: torch.Tensor) -> None:
        """``group`` drops the tokens of ``virtual`` (``(n,)`` int ids in ascending position order):
        their full-precision slots go back to the group's allocator and those still held stay as
        low-bit blocks."""
        virtual = virtual.long()
        physical = self.pool.physical(group, virtual)
        present = physical > 0
        if not bool(present.any()):
            return
        packed = self.quantize(group, physical[present])  # read before the slots go back
        self.allocator.drop(group, virtual)
        self.place(group, virtual[present], packed)

    def quantize(self, group: int, physical: torch.Tensor) -> list[torch.Tensor]:
        """Pack the K/V that ``physical`` slots hold in each of ``group``'s layers.

        Parameters
        ----------
        physical : Tensor
            ``(n,)`` int64 physical slots of the group, in ascending position order, ``n >= 1``.

        Returns
        -------
        list[Tensor]
            Per layer of the group, ``(ceil(n / BLOCK_TOKENS), key_bytes + value_bytes)`` uint8: each
            block's packed keys, then its packed values.
        """
        chunks = physical.split(BLOCK_TOKENS)
        packed = []
        for k_buffer, v_buffer in self._buffers(group):
            keys = torch.stack([pad_block(k_buffer[chunk]) for chunk in chunks])
            values = torch.stack([pad_block(v_buffer[chunk]) for chunk in chunks])
            packed.append(
                torch.cat(
                    (
                        quantize_key_blocks(keys, self.format.key_bits),
                        quantize_value_blocks(values, self.format.value_bits),
                    ),
                    dim=1,
                )
            )
        return packed

    def place(self, group: int, virtual: torch.Tensor, packed: list[torch.Tensor]) -> None:
        """Store :meth:`quantize`'s blocks of the tokens ``virtual`` (``(n,)`` int64, ascending
        positions) in ``group``, in slots taken from the group's allocator (after the tokens' own
        slots went back to it): the first half of a block's bytes in the slots' K rows, the second
        half in their V rows. Without enough free slots the tokens are not stored."""
        blocks = packed[0].shape[0]
        slots = self.allocator.alloc_block_slots(group, blocks * self.rows_per_block)
        if slots is None:
            self.unstored_tokens += int(virtual.numel())
            return
        slots = slots.long()
        for (k_buffer, v_buffer), block_bytes in zip(self._buffers(group), packed):
            halves = block_bytes.view(blocks, 2, -1)
            k_buffer[slots] = halves[:, 0].contiguous().view(k_buffer.dtype).reshape(-1, *k_buffer.shape[1:])
            v_buffer[slots] = halves[:, 1].contiguous().view(v_buffer.dtype).reshape(-1, *v_buffer.shape[1:])
        table = self.tables[group]
        ids = table.take(blocks)
        table.slots[ids] = slots.view(blocks, self.rows_per_block)
        order = torch.arange(virtual.numel(), device=virtual.device)
        table.live[ids] = torch.bincount(order // BLOCK_TOKENS, minlength=blocks)
        table.filled[ids] = table.live[ids]
        table.made_by[ids] = self.placed_passes
        self.placed_passes += 1
        entries = ids[order // BLOCK_TOKENS] * BLOCK_TOKENS + order % BLOCK_TOKENS + 1
        self.token_block[group, virtual] = entries.to(torch.int32)

    def forget(self, virtual: torch.Tensor) -> None:
        """The ids ``virtual`` (``(n,)`` int) were freed: they leave their blocks, and blocks left
        without a token give their slots back to their groups."""
        virtual = virtual.long()
        for group, table in enumerate(self.tables):
            entries = self.token_block[group, virtual].long()
            held = entries > 0
            if not bool(held.any()):
                continue
            self.token_block[group, virtual[held]] = 0
            blocks = (entries[held] - 1) // BLOCK_TOKENS
            table.live.index_add_(0, blocks, torch.full_like(blocks, -1))
            touched = torch.unique(blocks)
            emptied = touched[table.live[touched] == 0]
            if emptied.numel():
                self.allocator.free_block_slots(group, table.slots[emptied].flatten())
                table.slots[emptied] = 0
                table.free = torch.cat((table.free, emptied))

    def freed_by(self, group: int, virtual: torch.Tensor) -> int:
        """Slots of ``group`` that freeing the ids ``virtual`` (``(n,)`` int, distinct) would give back
        through their blocks: those of the blocks all of whose live tokens are among them."""
        entries = self.token_block[group, virtual.long()].long()
        entries = entries[entries > 0]
        if not entries.numel():
            return 0
        table = self.tables[group]
        counts = torch.bincount((entries - 1) // BLOCK_TOKENS, minlength=table.live.numel())
        return int(((counts == table.live) & (table.live > 0)).sum()) * self.rows_per_block

    def locate(self, group: int, virtual: torch.Tensor) -> Optional[LocatedTokens]:
        """The low-bit tokens among a request's row ``virtual`` (``(n,)`` int ids by position) in
        ``group``; None when there are none."""
        entries = self.token_block[group, virtual.long()].long()
        positions = torch.nonzero(entries > 0).flatten()
        if not positions.numel():
            return None
        entries = entries[positions] - 1
        blocks, which = torch.unique(entries // BLOCK_TOKENS, return_inverse=True)
        slots = self.tables[group].slots[blocks].flatten()
        return LocatedTokens(positions, slots, which * BLOCK_TOKENS + entries % BLOCK_TOKENS)

    def read(self, located: LocatedTokens, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`locate`'s tokens in layer ``layer_id`` (of their group), dequantized: keys and
        values ``(t, heads, head_dim)`` float32, in ``located.positions`` order."""
        layer = layer_id - self.pool.start_layer
        blocks = located.slots.numel() // self.rows_per_block
        block_bytes = torch.cat(
            (
                self.pool.k_buffer[layer][located.slots].view(torch.uint8).reshape(blocks, -1),
                self.pool.v_buffer[layer][located.slots].view(torch.uint8).reshape(blocks, -1),
            ),
            dim=1,
        )
        keys = dequantize_key_blocks(
            block_bytes[:, : self.key_bytes], self.heads, self.head_dim, self.format.key_bits
        ).flatten(0, 1)[located.index]
        values = dequantize_value_blocks(
            block_bytes[:, self.key_bytes :], self.heads, self.head_dim, self.format.value_bits
        ).flatten(0, 1)[located.index]
        return keys, values

    def row_summary(self, virtual: torch.Tensor) -> tuple[list[torch.Tensor], list[int]]:
        """For a request's row ``virtual`` (``(n,)`` int ids by position): per group the positions
        ``(t_g,)`` int64 held at low precision, and the slots of the blocks holding them (shared blocks
        counted whole)."""
        positions, slots = [], []
        for group in range(len(self.tables)):
            located = self.locate(group, virtual)
            positions.append(
                located.positions if located is not None else torch.zeros(0, dtype=torch.int64, device=virtual.device)
            )
            slots.append(0 if located is None else int(located.slots.numel()))
        return positions, slots

    def row_block_places(self, virtual: torch.Tensor) -> list[BlockPlaces]:
        """Per group, :class:`BlockPlaces` of the blocks a request's row ``virtual`` (``(n,)`` int ids
        by position) reads."""
        places = []
        for group, table in enumerate(self.tables):
            entries = self.token_block[group, virtual.long()].long()
            entries = entries[entries > 0]
            if not entries.numel():
                places.append(BlockPlaces())
                continue
            blocks, row_tokens = torch.unique((entries - 1) // BLOCK_TOKENS, return_counts=True)
            live, filled = table.live[blocks], table.filled[blocks]
            places.append(
                BlockPlaces(
                    blocks=int(blocks.numel()),
                    passes=int(torch.unique(table.made_by[blocks]).numel()),
                    row_tokens=int(row_tokens.sum()),
                    other_rows=int((live - row_tokens).sum()),
                    freed=int((filled - live).sum()),
                    never_filled=int((BLOCK_TOKENS - filled).sum()),
                )
            )
        return places

    def held_slots(self, group: int) -> torch.Tensor:
        """``(s,)`` int64: every physical slot of ``group`` holding a low-bit block."""
        return self.tables[group].held_slots()

    def clear(self) -> None:
        """Forget every block (the allocator was cleared)."""
        self.token_block.zero_()
        for table in self.tables:
            table.clear()


def requantize_in_place(pool: Any, group: int, physical: torch.Tensor, block_format: BlockFormat) -> None:
    """Replace the K/V that ``physical`` slots hold in each of ``group``'s layers by their low-bit round
    trip: quantized in blocks of :data:`BLOCK_TOKENS` slots in the given order (as :meth:`LowBitStore.quantize`
    would store them), dequantized, written back in the pool's dtype. Calibration probes use it to
    measure what keeping tokens at low bits costs, without a block store.

    Parameters
    ----------
    pool : LayerGroupMHAKVPool
        The pool (``layout.ranges``, ``k_buffer``, ``v_buffer``, ``head_num``, ``head_dim``).
    physical : Tensor
        ``(n,)`` int64 physical slots of the group, in ascending position order.
    """
    if not physical.numel():
        return
    heads, head_dim = pool.head_num, pool.head_dim
    chunks = physical.long().split(BLOCK_TOKENS)
    for layer in pool.layout.ranges[group]:
        for buffer, quantize, dequantize, bits in (
            (
                pool.k_buffer[layer - pool.start_layer],
                quantize_key_blocks,
                dequantize_key_blocks,
                block_format.key_bits,
            ),
            (
                pool.v_buffer[layer - pool.start_layer],
                quantize_value_blocks,
                dequantize_value_blocks,
                block_format.value_bits,
            ),
        ):
            blocks = torch.stack([pad_block(buffer[chunk]) for chunk in chunks])
            restored = dequantize(quantize(blocks, bits), heads, head_dim, bits)
            for i, chunk in enumerate(chunks):
                buffer[chunk] = restored[i, : chunk.numel()].to(buffer.dtype)
