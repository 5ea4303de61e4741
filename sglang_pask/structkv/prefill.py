"""One prompt's StructKV prefill, layer by layer: when to prune, to which skeleton, which KV to keep.

A prefill must decide to prune *while* its layers run, before the layers after the pivot. So the
pivot is settled online (:meth:`PromptPruning.observe`, after every layer that runs on the whole
prompt):

- fixed pivot ``N`` (``fixed-pivot``, ``gemfilter``, or ``structkv`` with ``--structkv-pivot N``):
  the decision comes right after layer ``N``; pruning starts at layer ``N + 1`` (GemFilter: the
  prefill restarts from layer 0 on the skeleton);
- ``pivot="auto"``: the search covers pivots from ``ceil(min_pivot_fraction * num_layers)`` on
  (at most ``num_layers - 2``). After layer ``d`` the pivot of the statistics seen so far is
  ``L*_d = detect_pivot(stats[0..d], min_pivot)`` (:mod:`.pivot`). The decision is taken at the
  first ``d >= 4`` with ``d - L*_d >= patience`` whose step *dominates* (:func:`.pivot.step_dominance`
  at least ``dominance``), or else at ``d = num_layers - 2`` (the last layer after which pruning
  still saves a layer), where it is the paper's ``argmax T + 1`` over every layer seen in the
  range (:func:`settled_auto_pivot`). With the default ``patience`` 0 the pivot is the first layer
  of the range whose step into it is the sharpest concentration step of the range so far and
  stands out of the steps seen: the decision comes right after it (``d = L*``), and pruning starts
  at ``L* + 1``, as for a fixed pivot. A ``patience`` above 0 waits that many layers for a sharper
  step; those layers ``L* + 1 .. d`` run on the whole prompt, and pruning starts at ``d + 1``. The
  skeleton comes from ``C_d``, the centrality through the decision layer (``C_(L*)`` when ``d = L*``),
  summed from the first layer of the search range (:mod:`.centrality` says why; a fixed pivot below
  it starts the sum at the pivot).

  The defaults come from the default model (Qwen2.5-Coder-0.5B, 24 layers, search from layer 8) on
  32 NIAH and variable-tracking prompts of 1K to 8K tokens (``python -m bench.pivot_profile``,
  ``tests/structkv/data/default_model_pivot_stats.json``, window 8): every prompt has its offline pivot
  (``argmax T + 1`` over all layers) at 11; online, the step into layer 11 stands out by 1.5 to 2.3
  median steps and every earlier step of the range by at most 1.14, so ``dominance`` 1.3 settles
  all 32 on 11 right after layer 11. (The previous ``patience`` 3 settled them after layer 14, and
  the three extra full layers held the 8K prefill at 0.66 of full KV's.) The price: a prompt whose
  layers differ by noise as much as by a real step settles on the first such step. On synthetic
  prompts that draw a new noise scale per layer (``tests/structkv``), patience 0 takes a noise step
  before the planted one on about half of them, patience 3 on none; pass ``patience`` for such
  models.

  The statistics read the attention of only the newest ``PivotConfig.statistics_window`` queries
  (8, the window those figures were measured with), whatever the skeleton's observation window:
  with all 32 queries of the default ``--structkv-window`` the steps blur, and on 20 noise-haystack
  prompts of 2K and 4K the decision came after layers 12 to 18 instead of 11
  (``bench/results/structkv_segments_2026-12-03.md``).

  Why the range starts at a third of the layers: attention also narrows sharply from layer 1 to 2
  on the default model (entropy 5.2 to 4.6 nats). Searched from layer 1, that early step looks like
  the transition after 4 layers, and a rule strict enough to pass it (``dominance`` 12, before)
  waited until layer 22, so almost nothing was pruned.

The skeleton is :func:`.skeleton.select_skeleton` at ``R_struct`` (plus the window) of that
centrality (``C_d``) max-pooled over ``kernel_size`` neighbouring positions (7 by default, as
SnapKV pools its scores, :mod:`sglang_pask.policy.pooling`): a token that ranks high brings its
neighbours, so the skeleton holds whole spans (a sentence's words, a number's digits) rather than
scattered tokens. Measured with the default model on 20 variable-tracking prompts of 2K and 4K
tokens (``bench/results/long_context_pooled_2026-12-01.md``): without pooling StructKV answered 5,
with it 12, as many as full KV. The KV each layer group keeps for decode is :func:`kv_keep` at ``R_KV``, chosen by the
group's own scores among the tokens every layer of the group computed, max-pooled the same way over
the candidates in position order: independent of ``R_struct`` (a group after the pivot can keep at
most the skeleton). Without that pooling, a group kept a number's high-scoring digits and dropped
the rest (on 12 essay-haystack NIAH prompts of 4K, pivot 14: 4 answered, 7 with it;
``bench/results/long_context_essay_2026-12-02.md``).

Pure torch (no sglang import). Positions here are *local*: ``0 .. n-1`` over the ``n`` tokens the
extend pass computes (a radix-cached prefix is not among them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

from sglang_pask.policy.pooling import check_kernel_size, max_pool_by_position

from .centrality import CentralityAccumulator
from .pivot import DEFAULT_WEIGHTS, PivotConfig, detect_pivot, layer_statistics, step_dominance
from .segments import segment_skeleton
from .skeleton import select_kv, select_skeleton

# Layers between the pivot detected so far and the current one before an auto pivot is settled.
DEFAULT_PATIENCE = 0
# How far (in median steps) the pivot's step must stand out to settle before num_layers - 2.
DEFAULT_DOMINANCE = 1.3
# Width of the max-pooling of the centrality before the skeleton's top-k (module docstring).
DEFAULT_SKELETON_KERNEL = 7
# The auto pivot is searched from this share of the layers on (module docstring).
DEFAULT_MIN_PIVOT_FRACTION = 1 / 3
# Differences needed before the median of the steps means anything.
_MIN_STEPS = 4


@dataclass(frozen=True)
class PruneDecision:
    """What the prefill does after the layer that settled it.

    Attributes
    ----------
    pivot : int
        ``L*``: the centrality's layer.
    decided_at : int
        The layer after which the rows shrink (``>= pivot``); with :attr:`restart`, the layer
        after which the prefill restarts from layer 0 on the skeleton.
    skeleton : Tensor
        ``(k,)`` int64 local indices, sorted, unique, including the last ``window``.
    restart : bool
        GemFilter-style: rerun every layer from 0 on the skeleton.
    centrality : Tensor
        ``(n,)`` float: ``C_d``, the centrality the skeleton was chosen from (before pooling).
    """

    pivot: int
    decided_at: int
    skeleton: Tensor
    restart: bool
    centrality: Tensor

    @property
    def prunes_from(self) -> int:
        """The first layer that computes on the skeleton only (0 with a restart)."""
        return 0 if self.restart else self.decided_at + 1


class PromptPruning:
    """The centrality, statistics and pruning decision of one prompt part of ``length`` tokens.

    Parameters
    ----------
    pivot : PivotConfig
        Pivot mode (auto, fixed, GemFilter), decay and statistic weights.
    num_layers : int
        The model's layers, at least 3 (a pivot in ``[1, num_layers - 2]`` leaves a layer to prune).
    length : int
        ``n``: tokens the extend pass computes for this prompt.
    ratio : float
        ``R_struct`` in (0, 1].
    window : int
        The last-window queries and the window every selection keeps, at least 1.
    patience : int
        Auto pivot only: see the module docstring; at least 0.
    dominance : float
        Auto pivot only: see the module docstring.
    min_pivot_fraction : float
        Auto pivot only: pivots below ``ceil(min_pivot_fraction * num_layers)`` are not considered
        (the search starts at 1 at least and at ``num_layers - 2`` at most).
    kernel_size : int
        Odd width of the centrality's max-pooling before the skeleton's top-k; 1 turns it off.
    segments : Tensor, optional
        ``(length,)`` int64 :func:`.segments.segment_ids` of the part's tokens: the skeleton is then
        chosen by whole segments (:func:`.segments.segment_skeleton`) instead of by pooled tokens.

    Raises
    ------
    ValueError
        On ``num_layers < 3``, a fixed pivot beyond ``num_layers - 2``, ``length < 1``,
        ``patience < 0``, an even or non-positive ``kernel_size``.
    """

    def __init__(
        self,
        pivot: PivotConfig,
        num_layers: int,
        length: int,
        ratio: float,
        window: int,
        patience: int = DEFAULT_PATIENCE,
        dominance: float = DEFAULT_DOMINANCE,
        min_pivot_fraction: float = DEFAULT_MIN_PIVOT_FRACTION,
        kernel_size: int = DEFAULT_SKELETON_KERNEL,
        segments: Optional[Tensor] = None,
    ) -> None:
        if num_layers < 3:
            raise ValueError(f"StructKV prunes after a pivot in [1, num_layers - 2]; the model has {num_layers} layers")
        if pivot.pivot != "auto" and not 1 <= pivot.pivot <= num_layers - 2:
            raise ValueError(f"fixed pivot {pivot.pivot} must be in [1, {num_layers - 2}] for {num_layers} layers")
        if length < 1 or patience < 0:
            raise ValueError(f"need length >= 1 and patience >= 0, got {length} and {patience}")
        self.config = pivot
        self.num_layers = num_layers
        self.length = length
        self.ratio = ratio
        self.window = window
        self.patience = patience
        self.dominance = dominance
        check_kernel_size("StructKV skeleton", kernel_size)
        self.kernel_size = kernel_size
        if segments is not None and segments.shape != (length,):
            raise ValueError(f"segments must be ({length},), got {tuple(segments.shape)}")
        self.segments = segments
        self.min_pivot = min(max(1, math.ceil(min_pivot_fraction * num_layers - 1e-9)), num_layers - 2)
        first_layer = self.min_pivot if pivot.pivot == "auto" else min(self.min_pivot, pivot.pivot)
        self.centrality = CentralityAccumulator(pivot.centrality_decay, first_layer)
        self._stats: list[Tensor] = []
        self.decision: Optional[PruneDecision] = None

    def observe(
        self, layer: int, scores: Tensor, statistics_scores: Optional[Tensor] = None
    ) -> Optional[PruneDecision]:
        """Fold in the window scores of ``layer`` (run on the whole part) and decide if it is time.

        Parameters
        ----------
        layer : int
            The layer that just ran; layers come in order from 0.
        scores : Tensor
            ``(length,)`` float: attention the last-window queries paid to each token, summed over
            heads.
        statistics_scores : Tensor, optional
            ``(length,)`` float: the same from only the newest ``config.statistics_window`` queries,
            which the auto pivot's statistics read; None when the window is no longer than that
            (``scores`` are then read).

        Returns
        -------
        PruneDecision or None
            The decision when it is taken after this layer (once), else None.

        Raises
        ------
        ValueError
            If layers come out of order, after the decision, or the scores have the wrong length.
        """
        if self.decision is not None or layer != self.centrality.num_layers:
            raise ValueError(
                f"layer {layer} observed out of order ({self.centrality.num_layers} layers seen, "
                f"decided: {self.decision is not None})"
            )
        if scores.shape != (self.length,) or (
            statistics_scores is not None and statistics_scores.shape != (self.length,)
        ):
            raise ValueError(
                f"layer scores must be ({self.length},), got {tuple(scores.shape)}"
                + ("" if statistics_scores is None else f" and {tuple(statistics_scores.shape)}")
            )
        self.centrality.add(scores)
        if self.config.needs_statistics:
            read = scores if statistics_scores is None else statistics_scores
            self._stats.append(layer_statistics(read, self.config.topk_ratio))
        pivot = self._settled_pivot(layer)
        if pivot is None:
            return None
        centrality = self.centrality.centrality(layer)
        if self.segments is not None:
            skeleton = segment_skeleton(centrality, self.segments, self.ratio, self.window)
        else:
            skeleton = pooled_skeleton(centrality, self.ratio, self.window, self.kernel_size)
        self.decision = PruneDecision(pivot, layer, skeleton, self.config.restart_prefill, centrality)
        return self.decision

    def _settled_pivot(self, layer: int) -> Optional[int]:
        if not self.config.needs_statistics:
            pivot = self.config.pivot_layer(self.num_layers)
            return pivot if layer == pivot else None
        return settled_auto_pivot(
            torch.stack(self._stats),
            self.num_layers,
            self.min_pivot,
            self.patience,
            self.dominance,
            self.config.weights,
        )


def settled_auto_pivot(
    stats: Tensor,
    num_layers: int,
    min_pivot: int,
    patience: int = DEFAULT_PATIENCE,
    dominance: float = DEFAULT_DOMINANCE,
    weights: tuple[float, float, float] = DEFAULT_WEIGHTS,
) -> Optional[int]:
    """The auto pivot if it is settled after the last layer of ``stats`` (module docstring), else None.

    Parameters
    ----------
    stats : Tensor
        ``(d + 1, 3)``: :func:`.pivot.layer_statistics` of layers ``0 .. d``, ``d`` the layer that just
        ran on the whole prompt.
    num_layers : int
        The model's layers.
    min_pivot : int
        The first pivot the search considers, in ``[1, num_layers - 2]``.
    patience, dominance, weights
        See the module docstring and :func:`.pivot.transition_scores`.
    """
    layer = stats.shape[0] - 1
    if layer < min_pivot:
        return None
    pivot = detect_pivot(stats, num_layers, weights, min_pivot)
    if layer >= num_layers - 2:
        return pivot
    if layer < _MIN_STEPS or layer - pivot < patience:
        return None
    return pivot if step_dominance(stats, pivot - 1, weights) >= dominance else None


def pooled_skeleton(
    centrality: Tensor, ratio: float, window: int, kernel_size: int = DEFAULT_SKELETON_KERNEL
) -> Tensor:
    """The skeleton of a prompt part: ``centrality`` ``(n,)`` max-pooled over ``kernel_size``
    neighbouring positions (1 turns it off), then :func:`.skeleton.select_skeleton` at ``ratio`` plus
    the ``window``; ``(k,)`` int64 local positions, sorted."""
    positions = torch.arange(centrality.numel(), device=centrality.device)
    return select_skeleton(max_pool_by_position(positions, centrality, kernel_size), ratio, window)


def kv_keep(
    group_scores: Tensor, candidates: Tensor, ratio: float, window: int, kernel_size: int = DEFAULT_SKELETON_KERNEL
) -> Tensor:
    """The local positions whose KV a layer group keeps for decode: top ``R_KV`` by its own scores,
    max-pooled over ``kernel_size`` neighbouring candidates first (as the skeleton's, and as SnapKV).

    Parameters
    ----------
    group_scores : Tensor
        ``(n,)`` float: the window scores of the part's tokens summed over the group's layers (0
        where a layer did not compute a token).
    candidates : Tensor
        ``(c,)`` int64 local positions, sorted, unique, with the whole window: what every layer of
        the group computed (all ``n``, or the skeleton).
    ratio : float
        ``R_KV`` in (0, 1]: a share of ``n``, not of the candidates.
    window : int
        Positions ``>= n - window`` are always kept.
    kernel_size : int
        Odd width of the max-pooling over the candidates in position order; 1 turns it off.

    Returns
    -------
    Tensor
        ``(min(c, floor(ratio * n) + min(window, n)),)`` int64 local positions, sorted.
    """
    n = group_scores.numel()
    pooled = max_pool_by_position(candidates, group_scores[candidates], kernel_size)
    chosen = select_kv(pooled, ratio, window, positions=candidates, seq_len=n)
    return candidates[chosen]
