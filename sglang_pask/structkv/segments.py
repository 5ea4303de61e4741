"""Segment skeletons: the skeleton chosen by whole sentences and lines instead of single tokens.

A token-level top-k keeps what the last-window queries look at. In early layers those looks are
mostly a question word meeting its earlier copies (the key of a needle, a variable's name), and the
fact that answers the question (the needle's number, the value) stands a few tokens further on, in
the same sentence, unlooked at. Choosing by segments keeps the sentence around every token the window
singles out: each segment is scored by the mean of its tokens' scores, and the skeleton takes whole
segments in that order.

Measured offline on the default model (Qwen2.5-Coder-0.5B, 24 layers), 24 RULER multi-key and
multi-value NIAH prompts of 2K and 4K tokens in Paul Graham's essays, pivot after layer 11 (found
online on all 24), R_struct 0.2, observation window 32 (``bench/results/structkv_segments_2026-12-03.md``):
the decayed centrality's token-level skeleton (max-pooled over 7) held every answer token on 1 of the
24 prompts, the segment skeleton on 23 of 24.

Segments (:func:`segment_ids`) end after a token that holds a newline, is a special token, or ends
(trailing whitespace aside) in ``.``, ``!`` or ``?``; a segment longer than ``max_len`` tokens is
cut into pieces of ``max_len``, so a prompt without punctuation (code, a number list) still gets
segments of a bounded size. Which token ids end a segment is a vocabulary-sized table built once per
tokenizer (:func:`segment_end_table`); per prompt the segments cost one lookup and two cumulative
sums.

Pure torch (no sglang import). Positions are local: ``0 .. n-1``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from torch import Tensor

from sglang_pask.policy.budget import check_fraction

from .skeleton import check_scores, check_window, top_count

# Longest segment before it is cut (tokens): about two sentences of English prose.
DEFAULT_MAX_SEGMENT = 48
_SENTENCE_ENDS = (b".", b"!", b"?")


def segment_end_table(token_bytes: Sequence[bytes], special_ids: Iterable[int] = ()) -> Tensor:
    """``(V,)`` bool: which token ids end a segment (module docstring).

    Parameters
    ----------
    token_bytes : sequence of bytes
        The text of each token id as UTF-8 bytes (:attr:`sglang_pask.structure.TokenVocab.token_bytes`).
    special_ids : iterable of int
        Special tokens (chat-template markers); each ends a segment. Ids outside the vocabulary are
        ignored.
    """
    ends = torch.tensor(
        [b"\n" in data or data.rstrip().endswith(_SENTENCE_ENDS) for data in token_bytes], dtype=torch.bool
    )
    special = [i for i in special_ids if 0 <= i < len(token_bytes)]
    if special:
        ends[torch.tensor(special, dtype=torch.int64)] = True
    return ends


def segment_ids(ends: Tensor, max_len: int = DEFAULT_MAX_SEGMENT) -> Tensor:
    """``(n,)`` int64 segment index of each token, ``0 .. m-1`` in position order.

    Parameters
    ----------
    ends : Tensor
        ``(n,)`` bool: token ``i`` ends its segment (the next token starts a new one).
    max_len : int
        At least 1: a segment longer than this is cut into pieces of ``max_len`` tokens (the last
        piece shorter).

    Raises
    ------
    ValueError
        If ``ends`` is not 1-D bool or ``max_len < 1``.
    """
    if ends.dim() != 1 or ends.dtype != torch.bool:
        raise ValueError(
            f"segment ends must be a 1-D bool tensor, got shape {tuple(ends.shape)} and dtype {ends.dtype}"
        )
    if isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 1:
        raise ValueError(f"the longest segment must be an integer >= 1 tokens, got {max_len!r}")
    n = ends.numel()
    if n == 0:
        return torch.zeros(0, dtype=torch.int64, device=ends.device)
    starts = torch.ones(n, dtype=torch.bool, device=ends.device)
    starts[1:] = ends[:-1]
    sentence = torch.cumsum(starts.long(), 0) - 1
    index = torch.arange(n, device=ends.device)
    first = torch.zeros(int(sentence[-1]) + 1, dtype=torch.int64, device=ends.device)
    first.scatter_reduce_(0, sentence, index, reduce="amin", include_self=False)
    piece_starts = (index - first[sentence]) % max_len == 0
    return torch.cumsum(piece_starts.long(), 0) - 1


def segment_skeleton(scores: Tensor, segments: Tensor, ratio: float = 0.2, window: int = 8) -> Tensor:
    """The skeleton by segments: the window, then whole segments by their mean score.

    The size is :func:`.skeleton.select_skeleton`'s, ``min(n, floor(ratio * n) + min(window, n))``:
    segments are taken in descending mean score (ties to the earlier segment) until the count is
    reached; the last one taken may be cut, keeping its best-scored tokens.

    Parameters
    ----------
    scores : Tensor
        ``(n,)`` float: each token's centrality (or one layer's window scores).
    segments : Tensor
        ``(n,)`` int64: :func:`segment_ids` of the same tokens.
    ratio : float
        ``R_struct`` in (0, 1].
    window : int
        At least 1: positions ``>= n - window`` are always in.

    Returns
    -------
    Tensor
        ``(k,)`` int64 positions, sorted ascending, unique.

    Raises
    ------
    ValueError
        If ``scores`` is not 1-D float, ``segments`` is not int64 of the same shape, ``ratio`` is not
        in (0, 1] or ``window < 1``.
    """
    check_fraction(ratio, "skeleton ratio (R_struct)")
    _check_segments(scores, segments, window, "centrality")
    n = scores.numel()
    in_window = torch.arange(n, device=scores.device) >= n - window
    return _segment_top(scores, segments, in_window, min(n, top_count(ratio, n) + min(window, n)))


def segment_kv_keep(group_scores: Tensor, candidates: Tensor, segments: Tensor, ratio: float, window: int) -> Tensor:
    """The local positions whose KV a layer group keeps, chosen by segments among its candidates.

    As :func:`.prefill.kv_keep` (the same size, the window always kept), with the candidates ranked
    by their segment's mean score over the candidates (the segment's tokens the group computed).

    Parameters
    ----------
    group_scores : Tensor
        ``(n,)`` float: the part's window scores summed over the group's layers.
    candidates : Tensor
        ``(c,)`` int64 local positions, sorted, unique, with the whole window.
    segments : Tensor
        ``(n,)`` int64: :func:`segment_ids` of the part's tokens.
    ratio : float
        ``R_KV`` in (0, 1]: a share of ``n``, not of the candidates.
    window : int
        Positions ``>= n - window`` are always kept.

    Returns
    -------
    Tensor
        ``(min(c, floor(ratio * n) + min(window, n)),)`` int64 local positions, sorted.
    """
    check_fraction(ratio, "KV ratio (R_KV)")
    _check_segments(group_scores, segments, window, "layer scores")
    n = group_scores.numel()
    count = min(candidates.numel(), top_count(ratio, n) + min(window, n))
    chosen = _segment_top(group_scores[candidates], segments[candidates], candidates >= n - window, count)
    return candidates[chosen]


def _check_segments(scores: Tensor, segments: Tensor, window: int, what: str) -> None:
    check_window(window)
    check_scores(scores, what)
    if segments.shape != scores.shape or segments.dtype != torch.int64:
        raise ValueError(
            f"segments must be an int64 tensor of shape {tuple(scores.shape)} like the scores, "
            f"got shape {tuple(segments.shape)} and dtype {segments.dtype}"
        )


def _segment_top(scores: Tensor, segments: Tensor, in_window: Tensor, count: int) -> Tensor:
    """The ``count`` indices that rank highest when window entries rank first, then by their
    segment's mean score (ties to the earlier segment), then by their own score; sorted ascending.
    ``scores``, ``segments`` (int64, non-negative) and ``in_window`` are ``(m,)``."""
    m = scores.numel()
    if m == 0:
        return torch.zeros(0, dtype=torch.int64, device=scores.device)
    values = scores.float()
    num_segments = int(segments.max()) + 1
    sizes = torch.bincount(segments, minlength=num_segments).clamp(min=1)
    mean = torch.zeros(num_segments, dtype=torch.float32, device=scores.device).index_add_(0, segments, values) / sizes
    segment_rank = torch.empty(num_segments, dtype=torch.int64, device=scores.device)
    segment_rank[torch.sort(mean, descending=True, stable=True).indices] = torch.arange(
        num_segments, device=scores.device
    )
    rank = segment_rank[segments].masked_fill(in_window, -1)
    order = torch.sort(values, descending=True, stable=True).indices  # within a segment: by score
    order = order[torch.sort(rank[order], stable=True).indices]
    return order[:count].sort().values
