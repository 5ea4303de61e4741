"""Global in-degree centrality: attention each token receives, accumulated over layers with decay.

StructKV scores token ``j`` by ``C_j = sum_{l <= L*} lambda^(L* - l) S_j^(l)``, where ``S^(l)`` is
what the last ``window`` queries of layer ``l`` pay to each token, summed over heads
(:func:`sglang_pask.kernels.window_scores.window_scores_reference` then ``sum(dim=0)``), and ``L*``
is the pivot layer. The pivot is known only once enough layers have run (:mod:`.pivot`), so the
weights are not known while the layers' scores arrive. :class:`CentralityAccumulator` therefore
runs the recurrence

    C_0 = S^(0),    C_l = lambda * C_(l-1) + S^(l)

and keeps every ``C_l``. By induction ``C_l = sum_{i <= l} lambda^(l - i) S^(i)`` (true at ``l = 0``;
if it holds at ``l - 1``, then ``lambda * C_(l-1) + S^(l) = sum_{i < l} lambda^(l - i) S^(i) +
lambda^0 S^(l)``), so ``C_(L*)`` *is* the formula for any pivot ``L*`` chosen afterwards: reading it
costs nothing, and keeping the running values takes the same memory as keeping each layer's ``S``.

Pure torch (no sglang import).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


class CentralityAccumulator:
    """The running centrality of one prompt's tokens, one layer at a time.

    The recurrence is elementwise, so the tokens may also be several sequences packed side by side
    (columns ``kv_indptr[b]:kv_indptr[b + 1]`` of the window scores): sequence ``b`` then reads its
    columns of :meth:`centrality` at its own pivot.

    Parameters
    ----------
    decay : float
        ``lambda`` in [0, 1]. 0 keeps only the pivot layer's own scores (a single-layer snapshot, as in
        GemFilter and FastKV), since ``0 ** 0 == 1``.

    Raises
    ------
    ValueError
        If ``decay`` is not in [0, 1].
    """

    def __init__(self, decay: float = 0.9) -> None:
        decay = float(decay)
        if not (math.isfinite(decay) and 0.0 <= decay <= 1.0):
            raise ValueError(f"centrality decay (lambda) must be in [0, 1], got {decay}")
        self.decay = decay
        self._running: list[Tensor] = []

    @property
    def num_layers(self) -> int:
        """How many layers' scores have been added."""
        return len(self._running)

    def add(self, scores: Tensor) -> None:
        """Fold the next layer's scores in: ``C_l = decay * C_(l-1) + S^(l)``.

        Parameters
        ----------
        scores : Tensor
            ``(n,)`` float: ``S^(l)`` for layer ``l = num_layers`` (layers come in order, from 0),
            summed over heads; kept as float32.

        Raises
        ------
        ValueError
            If ``scores`` is not a 1-D float tensor, or its length differs from the earlier layers'.
        """
        if scores.dim() != 1 or not scores.is_floating_point():
            raise ValueError(
                f"layer scores must be a 1-D float tensor (n,), "
                f"got shape {tuple(scores.shape)} and dtype {scores.dtype}"
            )
        scores = scores.float()
        if not self._running:
            self._running.append(scores.clone())
            return
        previous = self._running[-1]
        if previous.shape != scores.shape:
            raise ValueError(
                f"layer {self.num_layers} has scores for {scores.numel()} tokens, earlier layers for {previous.numel()}"
            )
        self._running.append(torch.add(scores, previous, alpha=self.decay))

    def centrality(self, pivot: int) -> Tensor:
        """``C = sum_{l <= pivot} decay^(pivot - l) S^(l)``.

        Parameters
        ----------
        pivot : int
            The pivot layer ``L*``, 0-based; its scores must have been added.

        Returns
        -------
        Tensor
            ``(n,)`` float32 (do not modify it in place: it is the accumulator's own state).

        Raises
        ------
        ValueError
            If layer ``pivot`` has not been added.
        """
        if not 0 <= pivot < self.num_layers:
            raise ValueError(f"pivot layer {pivot} is not among the {self.num_layers} layers added")
        return self._running[pivot]
