"""Scores shared over tensor-parallel ranks: one collective per group and step, summing every row's
pending scores in place before any policy reads them (:meth:`KVViewTable.share_scores`)."""

from __future__ import annotations

import torch

from sglang_pask.kvpool.compression import KVViewTable
from sglang_pask.policy import get_policy


def table(reduce) -> KVViewTable:
    return KVViewTable(get_policy("snapkv"), [0.5, 0.5], window=2, drop=lambda *a: None, reduce_scores=reduce)


def test_one_collective_sums_every_rows_pending_scores_of_the_group():
    calls: list[torch.Tensor] = []

    def other_rank_adds_ones(flat: torch.Tensor) -> None:  # the peer rank's heads paid 1 to every position
        calls.append(flat.clone())
        flat += 1.0

    views = table(other_rank_adds_ones)
    for row, length in ((3, 4), (7, 6)):
        views.view(row, 0)
        views.add_scores(row, 1, torch.arange(length), torch.full((length,), 2.0), num_queries=1)
    views.view(9, 0)  # a row with no scores this step
    views.share_scores(1, [3, 9, 7])
    assert len(calls) == 1 and calls[0].numel() == 4 + 6
    for row, length in ((3, 4), (7, 6)):
        assert torch.equal(views.views[row].groups[1].pending, torch.full((length,), 3.0))
        assert views.views[row].groups[0].pending is None
    views.share_scores(0, [3, 9, 7])  # nothing pending in group 0: no collective
    assert len(calls) == 1


def test_one_rank_shares_nothing():
    views = table(None)
    views.view(1, 0)
    views.add_scores(1, 0, torch.arange(3), torch.ones(3), num_queries=1)
    views.share_scores(0, [1])
    assert torch.equal(views.views[1].groups[0].pending, torch.ones(3))
