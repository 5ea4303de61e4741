"""Pivot detection: the layer after which StructKV's prefill continues on the skeleton only.

Per layer ``l``, the window scores ``S^(l)`` (attention the last ``window`` queries pay to each
token) are normalized into a distribution ``p = S / sum(S)`` and summarized by
(:func:`layer_statistics`):

- entropy ``H = -sum_j p_j log p_j`` (nats; ``0 log 0 = 0``),
- top-k mass ``rho = sum of the k largest p_j`` with ``k = max(1, ceil(topk_ratio * n))``,
- variance ``V = mean_j (p_j - 1/n)^2`` (population variance of ``p``).

Attention that concentrates shows as H falling and rho and V rising. Across layers, each statistic
``X`` becomes a forward difference ``d_l = X_(l+1) - X_l`` (``l = 0 .. m-2`` for ``m`` layers),
normalized by its largest magnitude, ``d_l / max_i |d_i|`` (all zeros when ``X`` is constant): every
statistic then lies in [-1, 1] whatever its units, and the sign and the zero of a change keep
their meaning (a z-score would shift a flat stretch away from 0). They combine as

    T_l = w_H * grad(-H)_l + w_rho * grad(rho)_l + w_V * grad(V)_l,    (0.2, 0.3, 0.5) by default,

and ``L* = argmax_l T_l + 1`` (the first maximum on ties): ``T_l`` is largest across the sharpest
concentration step, between layers ``l`` and ``l + 1``, so ``L*`` is the first layer *after* that
step, and it is the last layer that runs on the whole prompt and feeds the centrality
(:mod:`.centrality`). Layers ``L* + 1 ..`` run on the skeleton. Layer indices are 0-based.

Pure torch (no sglang import). Everything but :func:`detect_pivot` (one device-to-host read of the
argmax) stays on the scores' device without synchronizing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from sglang_pask.policy.budget import check_fraction

# (entropy, top-k mass, variance): the paper's weights of grad(-H), grad(rho), grad(V).
DEFAULT_WEIGHTS: tuple[float, float, float] = (0.2, 0.3, 0.5)
# The newest queries whose attention the statistics read: the paper's window, on which the online
# rule's dominance threshold was calibrated (:mod:`.prefill`). The skeleton's observation window
# (--structkv-window) may be longer; over 32 queries the default model's steps between layers blur,
# and on RULER's noise prompts the decision came 3 to 7 layers late
# (bench/results/structkv_segments_2026-12-03.md).
DEFAULT_STATISTICS_WINDOW = 8
# Keeps p finite when a row of scores sums to 0.
_TINY = 1e-30
# Absorbs float error in ratio * n (0.29 * 100 == 28.999999999999996).
_EPS = 1e-9


def topk_count(topk_ratio: float, num_tokens: int) -> int:
    """``k`` of the top-k mass: ``max(1, ceil(topk_ratio * num_tokens))``."""
    return max(1, math.ceil(topk_ratio * num_tokens - _EPS))


def layer_statistics(scores: Tensor, topk_ratio: float = 0.2) -> Tensor:
    """Entropy, top-k mass and variance of one layer's window attention.

    Parameters
    ----------
    scores : Tensor
        ``(n,)`` or ``(num_heads, n)``, float, non-negative: the attention that the last-window
        queries pay to each of the ``n`` tokens, summed over heads, or per (kv) head. Each row is
        normalized to a distribution; with several rows the statistics are averaged over rows.
    topk_ratio : float
        In (0, 1]: the top-k mass counts ``k = max(1, ceil(topk_ratio * n))`` tokens (by default
        the skeleton's share, R_struct = 0.2).

    Returns
    -------
    Tensor
        ``(3,)`` float32 on the device of ``scores``: ``[H, rho, V]``.

    Raises
    ------
    ValueError
        If ``scores`` is not a 1-D or 2-D float tensor with at least one token, or ``topk_ratio`` is
        not in (0, 1].
    """
    check_fraction(topk_ratio, "top-k ratio")
    if scores.dim() not in (1, 2) or not scores.is_floating_point() or scores.shape[-1] < 1:
        raise ValueError(
            f"layer scores must be a float tensor (n,) or (num_heads, n) with n >= 1, "
            f"got shape {tuple(scores.shape)} and dtype {scores.dtype}"
        )
    rows = scores.float().reshape(-1, scores.shape[-1])
    p = rows / rows.sum(dim=-1, keepdim=True).clamp_min(_TINY)
    entropy = torch.special.entr(p).sum(dim=-1)
    mass = p.topk(topk_count(topk_ratio, p.shape[-1]), dim=-1).values.sum(dim=-1)
    variance = p.var(dim=-1, unbiased=False)
    return torch.stack([entropy, mass, variance], dim=-1).mean(dim=0)


def normalized_gradient(values: Tensor) -> Tensor:
    """Forward differences over layers, divided by their largest magnitude.

    Parameters
    ----------
    values : Tensor
        ``(m,)`` float, ``m >= 2``: one statistic per layer.

    Returns
    -------
    Tensor
        ``(m - 1,)`` float32: ``d_l / max_i |d_i|`` with ``d_l = values[l + 1] - values[l]``, in
        [-1, 1]; all zeros when ``values`` is constant.
    """
    diffs = values.float().diff()
    return diffs / diffs.abs().max().clamp_min(_TINY)


def transition_scores(stats: Tensor, weights: tuple[float, float, float] = DEFAULT_WEIGHTS) -> Tensor:
    """``T_l = w_H * grad(-H)_l + w_rho * grad(rho)_l + w_V * grad(V)_l``.

    Parameters
    ----------
    stats : Tensor
        ``(m, 3)`` float, ``m >= 2``: :func:`layer_statistics` of layers ``0 .. m-1``, stacked.
    weights : tuple[float, float, float]
        Weights of the entropy, top-k mass and variance gradients.

    Returns
    -------
    Tensor
        ``(m - 1,)`` float32: ``T_l`` scores the step from layer ``l`` to layer ``l + 1``.

    Raises
    ------
    ValueError
        If ``stats`` is not ``(m, 3)`` float with ``m >= 2``.
    """
    if stats.dim() != 2 or stats.shape[1] != 3 or stats.shape[0] < 2 or not stats.is_floating_point():
        raise ValueError(
            f"stats must be a float tensor (m, 3) of [entropy, top-k mass, variance] for m >= 2 layers, "
            f"got shape {tuple(stats.shape)} and dtype {stats.dtype}"
        )
    w_entropy, w_mass, w_variance = weights
    return (
        w_entropy * normalized_gradient(-stats[:, 0])
        + w_mass * normalized_gradient(stats[:, 1])
        + w_variance * normalized_gradient(stats[:, 2])
    )


def detect_pivot(
    stats: Tensor, num_layers: int, weights: tuple[float, float, float] = DEFAULT_WEIGHTS, min_pivot: int = 1
) -> int:
    """The pivot layer ``L* = argmax_l T_l + 1`` from the statistics of the first ``m`` layers.

    ``m`` may be less than ``num_layers``: the search then covers layers ``0 .. m-1`` only (a
    prefill that must decide before running every layer passes the layers it has seen).
    ``L*`` lies in ``[1, m - 1]``, inside ``[1, num_layers - 1]`` by construction: at least layers 0
    and 1 see the whole prompt, and a pivot at ``num_layers - 1`` prunes no layer.

    Parameters
    ----------
    stats : Tensor
        ``(m, 3)`` float, ``2 <= m <= num_layers``: :func:`layer_statistics` of layers ``0 .. m-1``.
    num_layers : int
        The model's number of layers.
    weights : tuple[float, float, float]
        Weights of the entropy, top-k mass and variance gradients.
    min_pivot : int
        The search covers pivots ``min_pivot .. m - 1`` only (steps ``l >= min_pivot - 1``; the
        gradients are still normalized over every step seen).

    Returns
    -------
    int
        ``L*``, 0-based: the last layer that runs on the whole prompt.

    Raises
    ------
    ValueError
        If ``stats`` is malformed or covers more than ``num_layers`` layers, or ``min_pivot`` is not
        in ``[1, m - 1]``.
    """
    scores = transition_scores(stats, weights)
    if stats.shape[0] > num_layers:
        raise ValueError(f"stats cover {stats.shape[0]} layers but the model has {num_layers}")
    if not 1 <= min_pivot <= stats.shape[0] - 1:
        raise ValueError(f"min_pivot must be in [1, {stats.shape[0] - 1}] for {stats.shape[0]} layers, got {min_pivot}")
    return int(torch.argmax(scores[min_pivot - 1 :])) + min_pivot


def step_dominance(stats: Tensor, step: int, weights: tuple[float, float, float] = DEFAULT_WEIGHTS) -> float:
    """How far the step from layer ``step`` to ``step + 1`` stands out of the other steps.

    Each statistic's forward difference at ``step`` (signed as in :func:`transition_scores`: -H, rho,
    V) is divided by the median magnitude of that statistic's differences, and the three are
    weighted. A real concentration step scores far above 1; noise between similar layers scores
    about 1 (an online prefill waits for a dominant step before it prunes, :mod:`.prefill`).

    Parameters
    ----------
    stats : Tensor
        ``(m, 3)`` float, ``m >= 2``: :func:`layer_statistics` of layers ``0 .. m-1``.
    step : int
        In ``[0, m - 2]``.
    weights : tuple[float, float, float]
        Weights of the entropy, top-k mass and variance differences.
    """
    signed = stats.float() * torch.tensor([-1.0, 1.0, 1.0], device=stats.device)
    diffs = signed.diff(dim=0)
    scale = diffs.abs().median(dim=0).values.clamp_min(_TINY)
    return float((torch.tensor(weights, device=stats.device) * diffs[step] / scale).sum())


@dataclass(frozen=True)
class PivotConfig:
    """How the pivot layer is chosen and which scores select the skeleton there.

    Three modes share this code, so a benchmark compares like with like:

    - StructKV (``pivot="auto"``): the pivot is detected per prompt (:func:`detect_pivot`); the
      skeleton comes from the decayed centrality of layers ``l0 .. L*`` (``l0``: the first layer
      of the pivot search, :mod:`.prefill`).
    - Fixed pivot (``pivot=N``, FastKV-style): the same, at layer ``N`` for every prompt. With
      ``decay=0`` the skeleton comes from layer ``N``'s scores alone, as in FastKV.
    - GemFilter-style (``pivot=N, gemfilter=True``): the skeleton comes from layer ``N``'s scores
      alone (:attr:`centrality_decay` is 0), and the prefill restarts from layer 0 on the skeleton
      rows (:attr:`restart_prefill`) instead of continuing after layer ``N``.

    Attributes
    ----------
    pivot : "auto" or int
        ``"auto"`` or a fixed 0-based layer; a fixed layer is clamped to ``[1, num_layers - 1]`` by
        :meth:`pivot_layer` (the range auto detection yields).
    gemfilter : bool
        GemFilter-style selection; needs a fixed ``pivot``.
    decay : float
        The centrality's ``lambda`` in [0, 1].
    weights : tuple[float, float, float]
        Weights of grad(-H), grad(rho), grad(V); non-negative, not all 0.
    topk_ratio : float
        In (0, 1]: the share of tokens the top-k mass counts (:func:`layer_statistics`).
    statistics_window : int
        The newest queries whose attention the statistics read (at most the observation window);
        at least 1.

    Raises
    ------
    ValueError
        On a negative or non-integer pivot other than ``"auto"``, ``gemfilter`` without a fixed
        pivot, or weights, decay, ratio or statistics window out of range.
    """

    pivot: Literal["auto"] | int = "auto"
    gemfilter: bool = False
    decay: float = 0.9
    weights: tuple[float, float, float] = DEFAULT_WEIGHTS
    topk_ratio: float = 0.2
    statistics_window: int = DEFAULT_STATISTICS_WINDOW

    def __post_init__(self) -> None:
        if self.pivot != "auto" and (isinstance(self.pivot, bool) or not isinstance(self.pivot, int) or self.pivot < 0):
            raise ValueError(f"pivot must be 'auto' or a layer index >= 0, got {self.pivot!r}")
        if self.gemfilter and self.pivot == "auto":
            raise ValueError("GemFilter-style selection needs a fixed pivot layer, got pivot='auto'")
        if not (math.isfinite(self.decay) and 0.0 <= self.decay <= 1.0):
            raise ValueError(f"centrality decay (lambda) must be in [0, 1], got {self.decay}")
        if (
            len(self.weights) != 3
            or not all(math.isfinite(w) and w >= 0 for w in self.weights)
            or sum(self.weights) <= 0
        ):
            raise ValueError(
                f"pivot weights must be 3 non-negative numbers (entropy, top-k mass, variance), "
                f"not all 0, got {self.weights!r}"
            )
        check_fraction(self.topk_ratio, "top-k ratio")
        if (
            isinstance(self.statistics_window, bool)
            or not isinstance(self.statistics_window, int)
            or self.statistics_window < 1
        ):
            raise ValueError(f"the pivot's statistics window must be at least 1 query, got {self.statistics_window!r}")

    @property
    def needs_statistics(self) -> bool:
        """Whether :meth:`pivot_layer` reads per-layer statistics (only when ``pivot="auto"``)."""
        return self.pivot == "auto"

    @property
    def centrality_decay(self) -> float:
        """The ``lambda`` for :class:`~.centrality.CentralityAccumulator`: 0 in GemFilter mode."""
        return 0.0 if self.gemfilter else self.decay

    @property
    def restart_prefill(self) -> bool:
        """Whether the prefill restarts from layer 0 on the skeleton (GemFilter) rather than
        continuing after the pivot (StructKV, fixed pivot)."""
        return self.gemfilter

    def pivot_layer(self, num_layers: int, stats: Tensor | None = None) -> int:
        """The pivot ``L*`` for one prompt, 0-based, in ``[1, num_layers - 1]``.

        Parameters
        ----------
        num_layers : int
            The model's number of layers, at least 2.
        stats : Tensor, optional
            ``(m, 3)``: :func:`layer_statistics` of layers ``0 .. m-1`` (computed with
            :attr:`topk_ratio`); required when :attr:`needs_statistics`, ignored otherwise.

        Returns
        -------
        int
            The detected pivot, or the fixed one clamped to ``[1, num_layers - 1]``.

        Raises
        ------
        ValueError
            If ``num_layers < 2``, or statistics are needed and missing or malformed.
        """
        if num_layers < 2:
            raise ValueError(f"a pivot needs a model of at least 2 layers, got {num_layers}")
        if self.pivot == "auto":
            if stats is None:
                raise ValueError("pivot='auto' needs the per-layer statistics (stats), got None")
            return detect_pivot(stats, num_layers, self.weights)
        return min(max(self.pivot, 1), num_layers - 1)
