"""The layer groups' decode read lists in CUDA-graph buffers (:mod:`sglang_pask.srt.attention.graph_reads`).

The buffers keep their storage from step to step (what a captured graph needs); each step's lists are
copied in with the padding rows SGLang adds to reach a captured batch size.
"""

from __future__ import annotations

import pytest
import torch

from sglang_pask.srt.attention.graph_reads import GraphReadBuffers


def test_a_steps_lists_are_copied_in_with_one_slot_per_padding_row():
    buffers = GraphReadBuffers.allocate(
        2, max_bs=4, max_context_len=8, rows_per_block=None, block_tokens=32, device="cpu"
    )
    indptr_before, indices_before = buffers.lists(1, 4)
    buffers.fill(1, torch.tensor([0, 3, 5], dtype=torch.int32), torch.tensor([7, 8, 9, 4, 5]), padded=2)
    kv_indptr, kv_indices = buffers.lists(1, 4)
    assert kv_indptr.tolist() == [0, 3, 5, 6, 7]
    assert kv_indices[:7].tolist() == [7, 8, 9, 4, 5, 0, 0]  # the padding rows read slot 0
    assert kv_indptr.data_ptr() == indptr_before.data_ptr() and kv_indices.data_ptr() == indices_before.data_ptr()
    assert buffers.kv_indptr[0].eq(0).all()  # the other group untouched
    # A smaller step later overwrites the head; the kernels read only up to kv_indptr[rows].
    buffers.fill(1, torch.tensor([0, 1], dtype=torch.int32), torch.tensor([3]), padded=0)
    assert buffers.lists(1, 1)[0].tolist() == [0, 1] and int(buffers.kv_indices[1, 0]) == 3


def test_low_bit_blocks_are_copied_in_and_padding_rows_read_none():
    buffers = GraphReadBuffers.allocate(
        1, max_bs=3, max_context_len=64, rows_per_block=2, block_tokens=32, device="cpu"
    )
    assert buffers.block_slots is not None and buffers.block_slots.shape == (1, 3 * 2 + 1, 2)
    counts = torch.tensor([0, 2, 2], dtype=torch.int32)
    slots = torch.tensor([[10, 11], [12, 13]])
    masks = torch.tensor([2**32 - 1, 7])
    buffers.fill(
        0, torch.tensor([0, 1, 2], dtype=torch.int32), torch.tensor([5, 6]), padded=1, blocks=(counts, slots, masks)
    )
    block_indptr, block_slots, block_masks = buffers.blocks(0, 3)
    assert block_indptr.tolist() == [0, 2, 2, 2]
    assert block_slots[:2].tolist() == [[10, 11], [12, 13]] and block_masks[:2].tolist() == [2**32 - 1, 7]
    buffers.fill(0, torch.tensor([0, 1], dtype=torch.int32), torch.tensor([5]), padded=2)  # no blocks this step
    assert buffers.blocks(0, 3)[0].tolist() == [0, 0, 0, 0]


def test_a_batch_larger_than_the_buffers_is_refused_by_size():
    buffers = GraphReadBuffers.allocate(
        1, max_bs=2, max_context_len=4, rows_per_block=None, block_tokens=32, device="cpu"
    )
    with pytest.raises(ValueError, match="a decode batch of 3 rows reading 3 slots does not fit the graph buffers"):
        buffers.fill(0, torch.tensor([0, 1, 2], dtype=torch.int32), torch.tensor([1, 2]), padded=1)
    with pytest.raises(ValueError, match="allocated without a low-bit store"):
        buffers.fill(0, torch.tensor([0, 1], dtype=torch.int32), torch.tensor([1]), padded=0, blocks=(None, None, None))


def test_a_steps_scores_start_at_zero_in_its_own_slots():
    buffers = GraphReadBuffers.allocate(
        2, max_bs=3, max_context_len=4, rows_per_block=None, block_tokens=32, device="cpu", scores=True
    )
    assert buffers.scores is not None and buffers.scores.shape == (2, 15)
    buffers.scores.fill_(1.0)
    buffers.fill(0, torch.tensor([0, 2, 3], dtype=torch.int32), torch.tensor([4, 5, 6]), padded=1)
    assert buffers.scores[0, :4].eq(0).all() and buffers.scores[0, 4:].eq(1).all()
    assert buffers.scores[1].eq(1).all()
    assert GraphReadBuffers.allocate(1, 2, 4, None, 32, "cpu").scores is None
