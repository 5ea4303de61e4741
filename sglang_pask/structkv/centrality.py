"""Global in-degree centrality: attention each token receives, accumulated over layers with decay.

StructKV scores token ``j`` by ``C_j = sum_{l0 <= l <= L*} lambda^(L* - l) S_j^(l)``, where ``S^(l)``
is what the last ``window`` queries of layer ``l`` pay to each token, summed over heads
(:func:`sglang_pask.kernels.window_scores.window_scores_reference` then ``sum(dim=0)``), ``L*`` is
the pivot layer and ``l0`` the first layer that votes (``first_layer``; 0 sums every layer). The
pivot is known only once enough layers have run (:mod:`.pivot`), so the weights are not known while
the layers' scores arrive. :class:`CentralityAccumulator` therefore runs the recurrence

    C_l = 0 for l < l0,    C_l = lambda * C_(l-1) + S^(l) for l >= l0

and keeps every ``C_l``. By induction ``C_l = sum_{l0 <= i <= l} lambda^(l - i) S^(i)`` (true at
``l = l0``; if it holds at ``l - 1``, then ``lambda * C_(l-1) + S^(l) = sum_{l0 <= i < l}
lambda^(l - i) S^(i) + lambda^0 S^(l)``), so ``C_(L*)`` *is* the formula for any pivot ``L*``
chosen afterwards: reading it costs nothing, and keeping the running values takes the same memory
as keeping each layer's ``S``.

Why StructKV's prefill starts the sum at the pivot search's first layer (a third of the layers,
:mod:`.prefill`) rather than at 0: on the default model the early layers' window attention is
spread along the text and its sum outweighs the retrieval layers'. On its 1K and 2K NIAH and
variable-tracking prompts (16, bench ``long_context``'s generator), the top 20% by the sum from
layer 0 through layer 11 held 115 of the 203 tokens of the needles and variable names; from layer
8 through 11, 201 (through 12: 202).

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
    first_layer : int
        ``l0``: layers before it add nothing (their ``C_l`` is 0); at least 0.

    Raises
    ------
    ValueError
        If ``decay`` is not in [0, 1] or ``first_layer`` is negative.
    """

    def __init__(self, decay: float = 0.9, first_layer: int = 0) -> None:
        decay = float(decay)
        if not (math.isfinite(decay) and 0.0 <= decay <= 1.0):
            raise ValueError(f"centrality decay (lambda) must be in [0, 1], got {decay}")
        if first_layer < 0:
            raise ValueError(f"the centrality's first layer must be >= 0, got {first_layer}")
        self.decay = decay
        self.first_layer = first_layer
        self._running: list[Tensor] = []

    @property
    def num_layers(self) -> int:
        """How many layers' scores have been added."""
        return len(self._running)

    def add(self, scores: Tensor) -> None:
        """Fold the next layer's scores in: ``C_l = decay * C_(l-1) + S^(l)`` (0 before ``first_layer``).

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
        if self._running and self._running[-1].shape != scores.shape:
            raise ValueError(
                f"layer {self.num_layers} has scores for {scores.numel()} tokens, "
                f"earlier layers for {self._running[-1].numel()}"
            )
        if self.num_layers < self.first_layer:
            self._running.append(torch.zeros_like(scores))
        elif self.num_layers == self.first_layer:
            self._running.append(scores.clone())
        else:
            self._running.append(torch.add(scores, self._running[-1], alpha=self.decay))

    def centrality(self, pivot: int) -> Tensor:
        """``C = sum_{first_layer <= l <= pivot} decay^(pivot - l) S^(l)`` (0 if ``pivot < first_layer``).

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
