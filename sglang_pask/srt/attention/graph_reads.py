"""Each layer group's decode read lists in buffers of fixed address, for SGLang's CUDA-graph decode.

A captured decode step launches its kernels with the tensors it saw at capture; on replay only their
contents may change. :class:`GraphReadBuffers` holds, per layer group, the lists the triton backend
builds every step (``kv_indptr``/``kv_indices``: the full-precision slots each request reads; with a
low-bit ``--kv-dropped`` mode, ``block_indptr``/``block_slots``/``block_masks``: its low-bit blocks)
at a capacity fixed when SGLang sets up its graphs. Before each replay the backend copies the step's
lists in (:meth:`GraphReadBuffers.fill`); the kernels read views of the same storage every step.
Where the decode scores tokens (``--kv-decode compress`` with a scoring policy), ``scores`` holds,
per group, the attention each read slot received in the step, summed over the group's layers and
heads, packed like ``kv_indices``: each layer adds its own inside the graph, and the backend hands
them to the policy after the step.

Rows SGLang pads a batch with (to the captured batch size) read one token, slot 0 of the group (the
pool's padding slot), and no low-bit block, as stock SGLang's padded rows read one slot.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import torch

#: Set to 1 in a server's environment, every decode batch on the triton backend reads its lists from
#: the graph buffers, filled as before a replay, and runs eagerly: the replay path, testable on a CPU.
GRAPH_DECODE_ENV = "SGLANG_PASK_GRAPH_DECODE_EAGER"

# A batch's low-bit blocks as the fused decode kernel takes them: block_indptr (batch + 1,) int32,
# block_slots (blocks, rows_per_block) int64, block_masks (blocks,) int64.
BlockLists = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


@dataclasses.dataclass(frozen=True)
class GraphReadBuffers:
    """Fixed buffers of every group's decode read lists.

    Attributes
    ----------
    kv_indptr : Tensor
        ``(groups, max_bs + 1)`` int32.
    kv_indices : Tensor
        ``(groups, capacity)`` int64 physical slots.
    block_indptr : Tensor, optional
        ``(groups, max_bs + 1)`` int32; None without a low-bit store.
    block_slots : Tensor, optional
        ``(groups, block_capacity, rows_per_block)`` int64.
    block_masks : Tensor, optional
        ``(groups, block_capacity)`` int64 (bit ``p``: place ``p`` of the block is read).
    scores : Tensor, optional
        ``(groups, capacity)`` float32, packed like ``kv_indices``; None where the decode does not score.
    """

    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    block_indptr: Optional[torch.Tensor]
    block_slots: Optional[torch.Tensor]
    block_masks: Optional[torch.Tensor]
    scores: Optional[torch.Tensor]

    @classmethod
    def allocate(
        cls,
        groups: int,
        max_bs: int,
        max_context_len: int,
        rows_per_block: Optional[int],
        block_tokens: int,
        device: torch.device | str,
        scores: bool = False,
    ) -> "GraphReadBuffers":
        """Buffers for batches of up to ``max_bs`` requests of up to ``max_context_len`` tokens each
        (a padded row takes one slot); block buffers only where ``rows_per_block`` is given, score
        buffers only with ``scores``."""
        capacity = max_bs * (max_context_len + 1)
        kv_indptr = torch.zeros((groups, max_bs + 1), dtype=torch.int32, device=device)
        kv_indices = torch.zeros((groups, capacity), dtype=torch.int64, device=device)
        step_scores = torch.zeros((groups, capacity), dtype=torch.float32, device=device) if scores else None
        if rows_per_block is None:
            return cls(kv_indptr, kv_indices, None, None, None, step_scores)
        # At least one block, so the kernel's block arguments are never empty.
        blocks = max_bs * -(-max_context_len // block_tokens) + 1
        return cls(
            kv_indptr,
            kv_indices,
            torch.zeros((groups, max_bs + 1), dtype=torch.int32, device=device),
            torch.zeros((groups, blocks, rows_per_block), dtype=torch.int64, device=device),
            torch.zeros((groups, blocks), dtype=torch.int64, device=device),
            step_scores,
        )

    @property
    def max_bs(self) -> int:
        return self.kv_indptr.shape[1] - 1

    def fill(
        self,
        group: int,
        kv_indptr: torch.Tensor,
        kv_indices: torch.Tensor,
        padded: int,
        blocks: Optional[BlockLists] = None,
    ) -> None:
        """Copy one group's lists for a batch in, followed by ``padded`` padding rows; the group's
        scores of the step start at 0.

        Parameters
        ----------
        kv_indptr : Tensor
            ``(batch + 1,)`` int32 offsets into ``kv_indices``.
        kv_indices : Tensor
            ``(total,)`` int64 physical slots.
        padded : int
            Padding rows after the batch's ``batch`` rows.
        blocks : BlockLists, optional
            The batch's low-bit blocks (only with block buffers); none read where omitted.
        """
        batch = kv_indptr.shape[0] - 1
        total = kv_indices.shape[0]
        rows = batch + padded
        if rows > self.max_bs or total + padded > self.kv_indices.shape[1]:
            raise ValueError(
                f"a decode batch of {rows} rows reading {total + padded} slots does not fit the graph "
                f"buffers ({self.max_bs} rows, {self.kv_indices.shape[1]} slots)"
            )
        indptr = self.kv_indptr[group]
        indptr[: batch + 1].copy_(kv_indptr)
        indptr[batch + 1 : rows + 1].copy_(total + torch.arange(1, padded + 1, dtype=torch.int32, device=indptr.device))
        indices = self.kv_indices[group]
        indices[:total].copy_(kv_indices)
        indices[total : total + padded].zero_()
        if self.scores is not None:
            self.scores[group, : total + padded].zero_()
        if self.block_indptr is None:
            if blocks is not None:
                raise ValueError("low-bit block lists given to graph buffers allocated without a low-bit store")
            return
        assert self.block_slots is not None and self.block_masks is not None
        block_indptr = self.block_indptr[group]
        if blocks is None:
            block_indptr[: rows + 1].zero_()
            return
        counts, slots, masks = blocks
        if slots.shape[0] > self.block_slots.shape[1]:
            raise ValueError(
                f"a decode batch reading {slots.shape[0]} low-bit blocks does not fit the graph buffers "
                f"({self.block_slots.shape[1]} blocks)"
            )
        block_indptr[: batch + 1].copy_(counts)
        block_indptr[batch + 1 : rows + 1].fill_(slots.shape[0])
        self.block_slots[group, : slots.shape[0]].copy_(slots)
        self.block_masks[group, : masks.shape[0]].copy_(masks)

    def lists(self, group: int, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``kv_indptr`` ``(rows + 1,)`` and ``kv_indices`` ``(capacity,)`` of ``group``: views of the
        buffers, the same storage every step."""
        return self.kv_indptr[group, : rows + 1], self.kv_indices[group]

    def blocks(self, group: int, rows: int) -> BlockLists:
        """``group``'s low-bit block lists (views of the buffers): ``block_indptr`` ``(rows + 1,)``,
        ``block_slots`` ``(block_capacity, rows_per_block)``, ``block_masks`` ``(block_capacity,)``."""
        assert self.block_indptr is not None and self.block_slots is not None and self.block_masks is not None
        return self.block_indptr[group, : rows + 1], self.block_slots[group], self.block_masks[group]
