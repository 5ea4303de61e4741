"""Skeleton and per-layer KV selection: the top share of tokens by a score, plus the recent window.

Two budgets, decoupled as in StructKV:

- The *skeleton* (:func:`select_skeleton`): the tokens the layers after the pivot compute on, the
  top ``R_struct`` share by centrality ``C`` (:mod:`.centrality`) plus the last ``window`` tokens.
- The *KV keep set* of each layer (:func:`select_kv`): the tokens whose KV that layer keeps for
  decode, the top ``R_KV`` share by that layer's own window scores plus the window, chosen among
  the tokens the layer computed (all of them up to the pivot, the skeleton after it).

Both count ``floor(ratio * seq_len)`` top tokens *outside* the window and add the window on top:
``min(n, floor(ratio * seq_len) + min(window, seq_len))`` tokens, a size known from shapes alone
(no device-to-host read), and everything at ratio 1. Ties in the score go to the earlier token.
Results are sorted ascending, so positions keep their original order.

Pure torch (no sglang import).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from sglang_pask.policy.budget import check_fraction

# Absorbs float error in ratio * n (0.29 * 100 == 28.999999999999996).
_EPS = 1e-9


def top_count(ratio: float, seq_len: int) -> int:
    """Top tokens kept besides the window: ``floor(ratio * seq_len)``."""
    return math.floor(ratio * seq_len + _EPS)


def check_window(window: int) -> None:
    """Raise ValueError unless ``window`` is an integer >= 1."""
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"the recent window must be an integer >= 1, got {window!r}")


def check_scores(scores: Tensor, what: str) -> None:
    """Raise ValueError (naming ``what``) unless ``scores`` is a 1-D float tensor."""
    if scores.dim() != 1 or not scores.is_floating_point():
        raise ValueError(f"{what} must be a 1-D float tensor, got shape {tuple(scores.shape)} and dtype {scores.dtype}")


def _top_with_window(scores: Tensor, in_window: Tensor, count: int) -> Tensor:
    """The ``count`` indices that rank highest when window entries rank first, then by score
    (ties to the lower index); sorted ascending. ``scores`` and ``in_window`` are ``(n,)``."""
    key = scores.float().masked_fill(in_window, float("inf"))
    order = torch.sort(key, descending=True, stable=True).indices[:count]
    return order.sort().values


def select_skeleton(centrality: Tensor, ratio: float = 0.2, window: int = 8) -> Tensor:
    """The skeleton: top ``ratio`` of the prompt by centrality, plus the last ``window`` tokens.

    Parameters
    ----------
    centrality : Tensor
        ``(seq_len,)`` float: ``C`` of every prompt token, position ``j`` at index ``j``.
    ratio : float
        ``R_struct`` in (0, 1].
    window : int
        The recent window, at least 1; positions ``>= seq_len - window`` are always in.

    Returns
    -------
    Tensor
        ``(min(seq_len, floor(ratio * seq_len) + min(window, seq_len)),)`` int64 on the device of
        ``centrality``: the skeleton's original positions, sorted ascending, unique; every position
        at ratio 1.

    Raises
    ------
    ValueError
        If ``centrality`` is not 1-D float, ``ratio`` is not in (0, 1] or ``window < 1``.
    """
    check_fraction(ratio, "skeleton ratio (R_struct)")
    check_window(window)
    check_scores(centrality, "centrality")
    seq_len = centrality.numel()
    positions = torch.arange(seq_len, device=centrality.device)
    count = min(seq_len, top_count(ratio, seq_len) + min(window, seq_len))
    return _top_with_window(centrality, positions >= seq_len - window, count)


def select_kv(
    scores: Tensor,
    ratio: float = 0.1,
    window: int = 8,
    positions: Tensor | None = None,
    seq_len: int | None = None,
) -> Tensor:
    """One layer's KV keep set: top ``ratio`` of the prompt by the layer's own scores, plus the window.

    The share is of the whole prompt (``seq_len``), not of the candidates, so R_KV means the same
    before and after the pivot; after it the layer can keep at most the skeleton it computed.

    Parameters
    ----------
    scores : Tensor
        ``(n,)`` float: the layer's window scores of its ``n`` candidate tokens (summed over heads).
    ratio : float
        ``R_KV`` in (0, 1].
    window : int
        The recent window, at least 1; candidates at positions ``>= seq_len - window`` are always
        kept.
    positions : Tensor, optional
        ``(n,)`` int64, unique: the candidates' original positions (the skeleton's, for a layer
        after the pivot), which must include the whole window. Defaults to ``0 .. n-1``.
    seq_len : int, optional
        The prompt's length; defaults to ``n``. Required with ``positions``.

    Returns
    -------
    Tensor
        ``(min(n, floor(ratio * seq_len) + min(window, seq_len)),)`` int64 on the device of
        ``scores``: indices into the candidates, sorted ascending, unique (with sorted
        ``positions``, ``positions[result]`` is sorted too); every index at ratio 1.

    Raises
    ------
    ValueError
        If ``scores`` is not 1-D float, ``positions`` is not int64 like ``scores`` or comes without
        ``seq_len``, ``seq_len < n``, ``ratio`` is not in (0, 1] or ``window < 1``.
    """
    check_fraction(ratio, "KV ratio (R_KV)")
    check_window(window)
    check_scores(scores, "layer scores")
    n = scores.numel()
    if positions is None:
        positions = torch.arange(n, device=scores.device)
        seq_len = n if seq_len is None else seq_len
    elif positions.shape != scores.shape or positions.dtype != torch.int64:
        raise ValueError(
            f"positions must be an int64 tensor of shape ({n},) like scores, "
            f"got shape {tuple(positions.shape)} and dtype {positions.dtype}"
        )
    elif seq_len is None:
        raise ValueError("seq_len (the prompt's length) is required with positions")
    if seq_len < n:
        raise ValueError(f"seq_len {seq_len} is less than the {n} candidates")
    count = min(n, top_count(ratio, seq_len) + min(window, seq_len))
    return _top_with_window(scores, positions >= seq_len - window, count)
