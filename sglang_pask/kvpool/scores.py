"""The attention scores a layer group's view carries for its policy, step by step.

Scores (for policies that need them) arrive per (layer, request) as the attention the step's queries
pay to the view's positions, summed over heads; :func:`add_layer_scores` sums them over the group's
layers into the view's *pending* step. After the group's last layer :func:`fold_scores` folds that
step into the view's running scores: windowed policies (SnapKV) score with the last
``score_window`` queries (the observation window), so the step joins the view's recent steps and
the scores are their sum; others (H2O) add every query since the last call. The policy's
``accumulate_scores`` merges the new scores into the old.

Pure torch (no sglang import).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from sglang_pask.kvpool.views import GroupView
from sglang_pask.policy import KVPolicy


def add_padded(a: Optional[Tensor], b: Tensor) -> Tensor:
    """``a + b`` for position-indexed vectors of possibly different lengths (missing entries are 0)."""
    if a is None:
        return b.clone()
    if a.numel() < b.numel():
        a, b = b.clone(), a
    a[: b.numel()] += b
    return a


def add_layer_scores(view: GroupView, positions: Tensor, scores: Tensor, num_queries: int) -> None:
    """Add one layer's scores to the view's current step.

    Parameters
    ----------
    positions : Tensor
        ``(k,)`` int64 positions the layer read.
    scores : Tensor
        ``(k,)`` float32 attention the step's queries paid to them, summed over heads.
    num_queries : int
        Queries behind ``scores``.
    """
    length = int(positions[-1]) + 1 if positions.numel() else 0
    dense = torch.zeros(length, dtype=torch.float32, device=scores.device)
    dense.index_add_(0, positions, scores.float())
    view.pending = add_padded(view.pending, dense)
    view.pending_queries = num_queries


def fold_scores(view: GroupView, policy: KVPolicy, score_window: int, device: torch.device) -> None:
    """Fold the view's current step (if any) into its running scores.

    Parameters
    ----------
    policy : KVPolicy
        Whether scores come from the window (``scores_from_window``) and how they accumulate.
    score_window : int
        The observation window of windowed policies, in queries.
    device : torch.device
        Where the running scores live.
    """
    if view.pending is None:
        return
    step, queries = view.pending, view.pending_queries
    view.pending, view.pending_queries = None, 0
    if policy.scores_from_window:
        view.recent.append((queries, step))
        while len(view.recent) > 1 and sum(q for q, _ in view.recent) - view.recent[0][0] >= score_window:
            view.recent.popleft()
        new: Optional[Tensor] = None
        for _, scores in view.recent:
            new = add_padded(new, scores)
        assert new is not None
    else:
        new = step
    previous = view.scores
    if previous is not None and previous.numel() > new.numel():
        new = add_padded(new, torch.zeros(previous.numel(), device=device))
    view.scores = policy.accumulate_scores(previous, new)
