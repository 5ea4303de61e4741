"""Skeleton gather: StructKV's prefill pruning of a packed (ragged) extend batch.

Layers after StructKV's pivot compute only on each sequence's *skeleton*: its top tokens by centrality
plus the last-window tokens, at their original positions. This module selects those rows of the packed
batch that SGLang's extend pass carries (hidden states, residual, positions: ``T`` rows, sequence ``b``
at rows ``extend_indptr[b]:extend_indptr[b + 1]``) into a packed batch of ``K`` rows, and scatters
rows back.

Skeleton selections are a packed CSR list of **local** indices: sequence ``b`` keeps its tokens
``keep_indices[keep_indptr[b]:keep_indptr[b + 1]]``, each in ``0 .. L_b - 1`` (``L_b`` its extend
length), strictly increasing. Kept row ``k`` of sequence ``b`` comes from packed row
``rows[k] = extend_indptr[b] + keep_indices[k]``. Local indices are what a per-sequence selection
produces (top-k over one sequence's scores) and can be checked per sequence; the kernel turns them
into packed rows itself (a binary search of ``keep_indptr`` per kept row), so the caller needs no
``repeat_interleave`` and no device-to-host sync.

What the caller does with the results, layer ``pivot + 1`` on:

- ``hidden_states``, ``residual`` and ``positions`` of the skeleton replace the batch's: rotary
  embeddings see each kept token's original position, so attention among kept tokens is as in the full
  pass with the dropped keys masked out.
- ``indptr`` (``= keep_indptr``) becomes the batch's extend offsets (``extend_start_loc``/
  ``extend_seq_lens`` of the remaining layers' attention metadata).
- ``rows`` maps every kept row to its packed row in the full batch: per-token metadata of the full
  batch is gathered with it (``out_cache_loc[rows]``: the KV slots the remaining layers write), and
  ``skeleton_scatter`` writes skeleton rows back into a ``(T, D)`` buffer at those rows where a consumer
  needs all ``T`` rows (input logprobs over the prompt, hidden-state capture), the dropped rows keeping
  what the buffer held (e.g. their hidden states at the pivot). A selection with ``window >= 1`` keeps
  each sequence's last token, so next-token logits need no scatter: they are the last row of each
  sequence in ``indptr``.

``skeleton_gather_reference`` and ``skeleton_scatter_reference`` are plain torch;
``skeleton_gather_triton`` and ``skeleton_scatter_triton`` give bitwise the same results (a copy: the
kernels move the bits as integers) in one launch each, one program per block of kept rows, looping over
``D`` in tiles. ``skeleton_from_mask`` and ``skeleton_from_scores`` build selections.
"""

from __future__ import annotations

import math
from itertools import pairwise
from typing import NamedTuple

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
INDEX_DTYPES = (torch.int32, torch.int64)
# Kept rows per program, and hidden columns per tile of a program's loop over D.
BLOCK_K = 8
BLOCK_D = 128
# Absorbs float error in ratio * L (0.29 * 100 is 28.999999999999996).
_EPS = 1e-9
# Integer views of the supported dtypes: the kernels copy bits, never values.
_BIT_DTYPES = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}


class SkeletonBatch(NamedTuple):
    """The skeleton rows of a packed extend batch.

    Attributes
    ----------
    hidden_states : torch.Tensor
        ``(K, D)``, the input dtype, contiguous: the kept rows in packed order.
    positions : torch.Tensor
        ``(K,)``, the dtype of the input positions: each kept row's original position.
    residual : torch.Tensor or None
        ``(K, D)``, the residual's dtype, contiguous: its kept rows; ``None`` when no residual was given.
    indptr : torch.Tensor
        ``(B + 1,)``: the skeleton batch's offsets, ``keep_indptr`` itself.
    rows : torch.Tensor
        ``(K,)``, int64: kept row ``k``'s packed row in the full batch (strictly increasing).
    """

    hidden_states: torch.Tensor
    positions: torch.Tensor
    residual: torch.Tensor | None
    indptr: torch.Tensor
    rows: torch.Tensor


def _check_offsets(name: str, indptr: torch.Tensor) -> None:
    """Raise ``ValueError`` unless ``indptr`` is a 1-D int32/int64 tensor with at least one entry."""
    if indptr.dim() != 1 or indptr.shape[0] == 0 or indptr.dtype not in INDEX_DTYPES:
        raise ValueError(
            f"{name} must be a non-empty 1-D int32 or int64 tensor; got {indptr.dtype} of shape {tuple(indptr.shape)}"
        )


def _check_keep_indices(keep_indices: torch.Tensor) -> None:
    """Raise ``ValueError`` unless ``keep_indices`` is a 1-D int32/int64 tensor."""
    if keep_indices.dim() != 1 or keep_indices.dtype not in INDEX_DTYPES:
        raise ValueError(
            f"keep_indices must be a 1-D int32 or int64 tensor; got {keep_indices.dtype} "
            f"of shape {tuple(keep_indices.shape)}"
        )


def _check_gather_inputs(
    hidden_states: torch.Tensor,
    positions: torch.Tensor,
    extend_indptr: torch.Tensor,
    keep_indices: torch.Tensor,
    keep_indptr: torch.Tensor,
    residual: torch.Tensor | None,
) -> None:
    """Raise ``ValueError`` on shapes, dtypes or devices that the gather functions reject (no sync)."""
    if hidden_states.dim() != 2 or hidden_states.dtype not in SUPPORTED_DTYPES:
        raise ValueError(
            f"hidden_states must be (T, D) of a dtype in {SUPPORTED_DTYPES}; got "
            f"{hidden_states.dtype} of shape {tuple(hidden_states.shape)}"
        )
    if residual is not None and (residual.shape != hidden_states.shape or residual.dtype not in SUPPORTED_DTYPES):
        raise ValueError(
            f"residual must be (T, D) = {tuple(hidden_states.shape)} of a dtype in "
            f"{SUPPORTED_DTYPES}; got {residual.dtype} of shape {tuple(residual.shape)}"
        )
    if positions.shape != hidden_states.shape[:1] or positions.dtype not in INDEX_DTYPES:
        raise ValueError(
            f"positions must be (T,) = ({hidden_states.shape[0]},), int32 or int64; got "
            f"{positions.dtype} of shape {tuple(positions.shape)}"
        )
    _check_offsets("extend_indptr", extend_indptr)
    _check_offsets("keep_indptr", keep_indptr)
    if keep_indptr.shape != extend_indptr.shape:
        raise ValueError(
            f"keep_indptr must be (B + 1,) like extend_indptr {tuple(extend_indptr.shape)}; "
            f"got {tuple(keep_indptr.shape)}"
        )
    _check_keep_indices(keep_indices)
    tensors = (hidden_states, positions, extend_indptr, keep_indices, keep_indptr)
    devices = {t.device for t in (*tensors, *(() if residual is None else (residual,)))}
    if len(devices) != 1:
        raise ValueError(f"all inputs must be on one device; got {sorted(map(str, devices))}")


def validate_skeleton(extend_indptr: torch.Tensor, keep_indices: torch.Tensor, keep_indptr: torch.Tensor) -> None:
    """Check a skeleton selection against its batch; reads the tensors on the host (a sync).

    ``skeleton_gather_reference`` calls it; ``skeleton_gather_triton`` does not (it trusts its inputs,
    and a malformed selection reads out of bounds), so call it there while debugging.

    Parameters
    ----------
    extend_indptr : torch.Tensor
        ``(B + 1,)``, int32 or int64: the batch's packed offsets, from 0, non-decreasing.
    keep_indices : torch.Tensor
        ``(K,)``, int32 or int64: local kept indices, strictly increasing within each sequence.
    keep_indptr : torch.Tensor
        ``(B + 1,)``, int32 or int64: offsets into ``keep_indices``, from 0 to ``K``, non-decreasing.

    Raises
    ------
    ValueError
        On malformed offsets, an offset count that differs between the two, ``keep_indptr[-1] != K``,
        a kept index out of ``0 .. L_b - 1``, or kept indices of a sequence not strictly increasing.
    """
    _check_offsets("extend_indptr", extend_indptr)
    _check_offsets("keep_indptr", keep_indptr)
    if keep_indptr.shape != extend_indptr.shape:
        raise ValueError(
            f"keep_indptr has {keep_indptr.shape[0]} offsets, extend_indptr "
            f"{extend_indptr.shape[0]}: they must describe the same batch"
        )
    lengths = _lengths("extend_indptr", extend_indptr)
    keep_lengths = _lengths("keep_indptr", keep_indptr)
    _check_keep_indices(keep_indices)
    if keep_indptr[-1].item() != keep_indices.shape[0]:
        raise ValueError(
            f"keep_indptr ends at {keep_indptr[-1].item()} but keep_indices has shape {tuple(keep_indices.shape)}"
        )
    bounds = torch.repeat_interleave(lengths, keep_lengths)
    out_of_range = (keep_indices < 0) | (keep_indices >= bounds)
    if out_of_range.any():
        k = int(out_of_range.nonzero()[0, 0])
        b = _sequence_of(keep_indptr, k)
        raise ValueError(
            f"keep_indices[{k}] = {keep_indices[k].item()} is out of range for sequence {b} "
            f"of length {lengths[b].item()}"
        )
    starts_sequence = torch.zeros(keep_indices.shape[0], dtype=torch.bool, device=keep_indices.device)
    starts_sequence[keep_indptr[:-1][keep_lengths > 0].long()] = True
    unsorted = (keep_indices[1:] <= keep_indices[:-1]) & ~starts_sequence[1:]
    if unsorted.any():
        k = int(unsorted.nonzero()[0, 0]) + 1
        raise ValueError(
            f"keep_indices of sequence {_sequence_of(keep_indptr, k)} are not strictly increasing "
            f"at {k}: {keep_indices[k - 1].item()} then {keep_indices[k].item()}"
        )


def _lengths(name: str, indptr: torch.Tensor) -> torch.Tensor:
    """Per-sequence lengths of CSR offsets; ``ValueError`` unless they start at 0 and never decrease."""
    lengths = indptr.diff()
    if indptr[0].item() != 0 or (lengths < 0).any():
        raise ValueError(f"{name} must start at 0 and be non-decreasing; got {indptr.tolist()}")
    return lengths


def _sequence_of(indptr: torch.Tensor, k: int) -> int:
    """The sequence whose span of ``indptr`` holds entry ``k``."""
    return (
        int(torch.searchsorted(indptr, torch.tensor(k, dtype=indptr.dtype, device=indptr.device), right=True).item())
        - 1
    )


def skeleton_gather_reference(
    hidden_states: torch.Tensor,
    positions: torch.Tensor,
    extend_indptr: torch.Tensor,
    keep_indices: torch.Tensor,
    keep_indptr: torch.Tensor,
    residual: torch.Tensor | None = None,
) -> SkeletonBatch:
    """Gather the skeleton rows of a packed batch, in plain torch; validates the selection (a sync).

    Parameters
    ----------
    hidden_states : torch.Tensor
        ``(T, D)``, bfloat16, float16 or float32, any strides: all tokens of the batch, packed.
    positions : torch.Tensor
        ``(T,)``, int32 or int64: each token's position.
    extend_indptr : torch.Tensor
        ``(B + 1,)``, int32 or int64: sequence ``b`` is rows ``extend_indptr[b]:extend_indptr[b + 1]``
        (``extend_indptr[-1]`` may be below ``T``: rows past it are padding and never kept).
    keep_indices : torch.Tensor
        ``(K,)``, int32 or int64: local kept indices, strictly increasing within each sequence.
    keep_indptr : torch.Tensor
        ``(B + 1,)``, int32 or int64: sequence ``b`` keeps ``keep_indices[keep_indptr[b]:keep_indptr[b + 1]]``.
    residual : torch.Tensor, optional
        ``(T, D)``, bfloat16, float16 or float32: gathered with the same rows (SGLang's decoder layers
        carry the residual beside the hidden states).

    Returns
    -------
    SkeletonBatch
        ``hidden_states`` ``(K, D)``, ``positions`` ``(K,)``, ``residual`` ``(K, D)`` or ``None``,
        ``indptr`` (``keep_indptr``) and ``rows`` ``(K,)`` int64.

    Raises
    ------
    ValueError
        On bad shapes, dtypes or devices, and on a malformed selection (see ``validate_skeleton``).
    """
    _check_gather_inputs(hidden_states, positions, extend_indptr, keep_indices, keep_indptr, residual)
    validate_skeleton(extend_indptr, keep_indices, keep_indptr)
    rows = keep_indices.to(torch.int64, copy=True)
    for start, (keep_start, keep_end) in zip(extend_indptr.tolist(), pairwise(keep_indptr.tolist())):
        rows[keep_start:keep_end] += start
    return SkeletonBatch(
        hidden_states=hidden_states[rows],
        positions=positions[rows],
        residual=None if residual is None else residual[rows],
        indptr=keep_indptr,
        rows=rows,
    )


def _check_scatter_inputs(src: torch.Tensor, rows: torch.Tensor, out: torch.Tensor) -> None:
    """Raise ``ValueError`` on shapes, dtypes or devices that the scatter functions reject (no sync)."""
    if out.dim() != 2 or out.dtype not in SUPPORTED_DTYPES:
        raise ValueError(
            f"out must be (T, D) of a dtype in {SUPPORTED_DTYPES}; got {out.dtype} of shape {tuple(out.shape)}"
        )
    if src.dim() != 2 or src.shape[1] != out.shape[1] or src.dtype != out.dtype:
        raise ValueError(
            f"src must be (K, D) with D = {out.shape[1]} and out's dtype {out.dtype}; got "
            f"{src.dtype} of shape {tuple(src.shape)}"
        )
    if rows.shape != src.shape[:1] or rows.dtype not in INDEX_DTYPES:
        raise ValueError(
            f"rows must be (K,) = ({src.shape[0]},), int32 or int64; got {rows.dtype} of shape {tuple(rows.shape)}"
        )
    devices = {t.device for t in (src, rows, out)}
    if len(devices) != 1:
        raise ValueError(f"all inputs must be on one device; got {sorted(map(str, devices))}")


def skeleton_scatter_reference(src: torch.Tensor, rows: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """Write skeleton rows back into a full-batch buffer, in plain torch: ``out[rows[k]] = src[k]``.

    Parameters
    ----------
    src : torch.Tensor
        ``(K, D)``, bfloat16, float16 or float32, any strides: skeleton rows (e.g. the last layer's output).
    rows : torch.Tensor
        ``(K,)``, int32 or int64: distinct packed rows of ``out``, as ``SkeletonBatch.rows``.
    out : torch.Tensor
        ``(T, D)``, the dtype of ``src``, any strides: written in place; rows not in ``rows`` keep their
        values.

    Returns
    -------
    torch.Tensor
        ``out``.

    Raises
    ------
    ValueError
        On bad shapes, dtypes or devices, or a row outside ``0 .. T - 1``.
    """
    _check_scatter_inputs(src, rows, out)
    if rows.numel() and (rows.min() < 0 or rows.max() >= out.shape[0]):
        raise ValueError(f"rows must lie in 0 .. {out.shape[0] - 1}; got {rows.min().item()} .. {rows.max().item()}")
    out[rows.long()] = src
    return out


@triton.jit
def _gather_kernel(
    Hidden,
    Residual,
    Positions,
    extend_indptr,
    keep_indices,
    keep_indptr,
    OutHidden,
    OutResidual,
    OutPositions,
    OutRows,
    num_kept,
    num_seqs,
    dim,
    stride_ht,
    stride_hd,
    stride_rt,
    stride_rd,
    stride_oh,
    stride_or,
    HAS_RESIDUAL: tl.constexpr,
    SEARCH_STEPS: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """Program k: kept rows ``k * BLOCK_K ..``. Find each row's sequence by binary search of
    ``keep_indptr`` (the last ``b`` with ``keep_indptr[b] <= k``: empty sequences are skipped), form its
    packed row, store it and its position, then copy its hidden (and residual) columns tile by tile."""
    kept = tl.program_id(0) * BLOCK_K + tl.arange(0, BLOCK_K)
    kept_ok = kept < num_kept
    lo = tl.zeros([BLOCK_K], tl.int32)
    hi = tl.zeros([BLOCK_K], tl.int32) + num_seqs - 1
    for _ in range(SEARCH_STEPS):
        mid = (lo + hi + 1) // 2
        below = tl.load(keep_indptr + mid, mask=kept_ok, other=0).to(tl.int64) <= kept
        lo = tl.where(below, mid, lo)
        hi = tl.where(below, hi, mid - 1)
    local = tl.load(keep_indices + kept, mask=kept_ok, other=0).to(tl.int64)
    rows = tl.load(extend_indptr + lo, mask=kept_ok, other=0).to(tl.int64) + local
    tl.store(OutRows + kept, rows, mask=kept_ok)
    tl.store(OutPositions + kept, tl.load(Positions + rows, mask=kept_ok), mask=kept_ok)
    kept64 = kept.to(tl.int64)
    for d_start in range(0, dim, BLOCK_D):
        cols = d_start + tl.arange(0, BLOCK_D)
        ok = kept_ok[:, None] & (cols[None, :] < dim)
        values = tl.load(Hidden + rows[:, None] * stride_ht + cols[None, :] * stride_hd, mask=ok)
        tl.store(OutHidden + kept64[:, None] * stride_oh + cols[None, :], values, mask=ok)
        if HAS_RESIDUAL:
            values = tl.load(Residual + rows[:, None] * stride_rt + cols[None, :] * stride_rd, mask=ok)
            tl.store(OutResidual + kept64[:, None] * stride_or + cols[None, :], values, mask=ok)


@triton.jit
def _scatter_kernel(
    Src,
    rows_ptr,
    Out,
    num_rows,
    dim,
    stride_st,
    stride_sd,
    stride_ot,
    stride_od,
    BLOCK_K: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """Program k: rows ``k * BLOCK_K ..`` of ``Src`` copied to rows ``rows_ptr[..]`` of ``Out``, tile by
    tile over the columns."""
    kept = tl.program_id(0) * BLOCK_K + tl.arange(0, BLOCK_K)
    kept_ok = kept < num_rows
    rows = tl.load(rows_ptr + kept, mask=kept_ok, other=0).to(tl.int64)
    kept64 = kept.to(tl.int64)
    for d_start in range(0, dim, BLOCK_D):
        cols = d_start + tl.arange(0, BLOCK_D)
        ok = kept_ok[:, None] & (cols[None, :] < dim)
        values = tl.load(Src + kept64[:, None] * stride_st + cols[None, :] * stride_sd, mask=ok)
        tl.store(Out + rows[:, None] * stride_ot + cols[None, :] * stride_od, values, mask=ok)


def runs_interpreted() -> bool:
    """Whether the kernels were built for Triton's CPU interpreter (``TRITON_INTERPRET=1`` at import)."""
    return isinstance(_gather_kernel, InterpretedFunction)


def _bits(t: torch.Tensor) -> torch.Tensor:
    """``t`` viewed as integers of its element size (same strides): a copy of these is bitwise exact."""
    return t.view(_BIT_DTYPES[t.dtype])


def skeleton_gather_triton(
    hidden_states: torch.Tensor,
    positions: torch.Tensor,
    extend_indptr: torch.Tensor,
    keep_indices: torch.Tensor,
    keep_indptr: torch.Tensor,
    residual: torch.Tensor | None = None,
) -> SkeletonBatch:
    """Gather the skeleton rows of a packed batch in one Triton launch, without a device-to-host sync.

    Same inputs and results as ``skeleton_gather_reference`` (bitwise), except that the selection is
    not validated (that needs a sync): pass a well-formed one (``validate_skeleton`` checks it). Output
    sizes come from ``keep_indices.shape``. One program per ``BLOCK_K`` kept rows finds their sequences
    by binary search of ``keep_indptr``, writes ``rows`` and ``positions``, and copies the hidden states
    (and the residual, in the same loop) ``BLOCK_D`` columns at a time.

    Parameters
    ----------
    hidden_states : torch.Tensor
        ``(T, D)``, bfloat16, float16 or float32, any strides.
    positions : torch.Tensor
        ``(T,)``, int32 or int64, contiguous.
    extend_indptr : torch.Tensor
        ``(B + 1,)``, int32 or int64, contiguous.
    keep_indices : torch.Tensor
        ``(K,)``, int32 or int64, contiguous: local indices, strictly increasing per sequence.
    keep_indptr : torch.Tensor
        ``(B + 1,)``, int32 or int64, contiguous.
    residual : torch.Tensor, optional
        ``(T, D)``, bfloat16, float16 or float32, any strides.

    Returns
    -------
    SkeletonBatch
        As ``skeleton_gather_reference``; ``hidden_states`` and ``residual`` contiguous.
    """
    _check_gather_inputs(hidden_states, positions, extend_indptr, keep_indices, keep_indptr, residual)
    num_kept, dim = keep_indices.shape[0], hidden_states.shape[1]
    out_hidden = hidden_states.new_empty((num_kept, dim))
    out_residual = None if residual is None else residual.new_empty((num_kept, dim))
    out_positions = positions.new_empty((num_kept,))
    rows = keep_indices.new_empty((num_kept,), dtype=torch.int64)
    if num_kept:
        num_seqs = extend_indptr.shape[0] - 1
        res_in, res_out = (hidden_states, out_hidden) if residual is None else (residual, out_residual)
        _gather_kernel[(triton.cdiv(num_kept, BLOCK_K),)](
            _bits(hidden_states),
            _bits(res_in),
            positions.contiguous(),
            extend_indptr.contiguous(),
            keep_indices.contiguous(),
            keep_indptr.contiguous(),
            _bits(out_hidden),
            _bits(res_out),
            out_positions,
            rows,
            num_kept,
            num_seqs,
            dim,
            *hidden_states.stride(),
            *res_in.stride(),
            out_hidden.stride(0),
            res_out.stride(0),
            HAS_RESIDUAL=residual is not None,
            SEARCH_STEPS=max(1, (num_seqs - 1).bit_length()),
            BLOCK_K=BLOCK_K,
            BLOCK_D=BLOCK_D,
        )
    return SkeletonBatch(out_hidden, out_positions, out_residual, keep_indptr, rows)


def skeleton_scatter_triton(src: torch.Tensor, rows: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """Write skeleton rows back into a full-batch buffer in one Triton launch: ``out[rows[k]] = src[k]``.

    Same inputs and result as ``skeleton_scatter_reference`` (bitwise), except that ``rows`` is not
    range-checked (that needs a sync); ``rows`` must be contiguous.

    Returns
    -------
    torch.Tensor
        ``out``, written in place.
    """
    _check_scatter_inputs(src, rows, out)
    if src.shape[0] and src.shape[1]:
        _scatter_kernel[(triton.cdiv(src.shape[0], BLOCK_K),)](
            _bits(src),
            rows.contiguous(),
            _bits(out),
            src.shape[0],
            src.shape[1],
            *src.stride(),
            *out.stride(),
            BLOCK_K=BLOCK_K,
            BLOCK_D=BLOCK_D,
        )
    return out


def skeleton_from_mask(mask: torch.Tensor, extend_indptr: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A skeleton selection from a packed boolean mask over the batch's tokens.

    Parameters
    ----------
    mask : torch.Tensor
        ``(T,)``, bool, with ``T = extend_indptr[-1]``: True where a token is kept.
    extend_indptr : torch.Tensor
        ``(B + 1,)``, int32 or int64: the batch's packed offsets.

    Returns
    -------
    tuple[torch.Tensor, torch.Tensor]
        ``keep_indices`` ``(K,)`` and ``keep_indptr`` ``(B + 1,)``, both int64, on ``mask``'s device.

    Raises
    ------
    ValueError
        On a mask that is not 1-D bool, malformed offsets, or ``extend_indptr[-1] != T``.
    """
    if mask.dim() != 1 or mask.dtype != torch.bool:
        raise ValueError(f"mask must be a 1-D bool tensor; got {mask.dtype} of shape {tuple(mask.shape)}")
    _batch_lengths(extend_indptr, mask.shape[0], "mask")
    offsets = extend_indptr.to(device=mask.device, dtype=torch.int64)
    kept_before = torch.cat([offsets.new_zeros(1), mask.long().cumsum(0)])
    keep_indptr = kept_before[offsets]
    rows = mask.nonzero()[:, 0]
    return rows - torch.repeat_interleave(offsets[:-1], keep_indptr.diff()), keep_indptr


def _batch_lengths(extend_indptr: torch.Tensor, total: int, what: str) -> torch.Tensor:
    """Per-sequence lengths of ``extend_indptr``, checked to end at ``total`` (the length of ``what``)."""
    _check_offsets("extend_indptr", extend_indptr)
    lengths = _lengths("extend_indptr", extend_indptr)
    if extend_indptr[-1].item() != total:
        raise ValueError(f"extend_indptr ends at {extend_indptr[-1].item()} but {what} has {total} tokens")
    return lengths


def skeleton_from_scores(
    scores: torch.Tensor, extend_indptr: torch.Tensor, ratio: float, window: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """StructKV's skeleton selection: per sequence, its last ``window`` tokens plus the top tokens by score.

    Sequence ``b`` of length ``L`` keeps its last ``min(window, L)`` tokens and, of the tokens before
    them, the ``min(floor(ratio * L), L - window)`` with the highest scores (ties to the earlier token):
    ``min(L, floor(ratio * L) + min(window, L))`` tokens, the counting of
    ``sglang_pask.structkv.select_skeleton``, of which this is the packed-batch form (the test checks
    they agree; this module imports only torch and triton). ``ratio = 1`` keeps every token (the
    identity); ``ratio = 0`` keeps the window only. In the model pass use ``window >= 1``: the last
    token's logits are needed.

    Parameters
    ----------
    scores : torch.Tensor
        ``(T,)``, floating, with ``T = extend_indptr[-1]``, packed like the batch: e.g. StructKV's
        centrality of each token (``window_scores`` summed over heads and accumulated over layers).
    extend_indptr : torch.Tensor
        ``(B + 1,)``, int32 or int64: the batch's packed offsets.
    ratio : float
        Share of each sequence's length kept by score (R_struct), in ``[0, 1]``.
    window : int
        Trailing tokens each sequence always keeps, ``>= 0``.

    Returns
    -------
    tuple[torch.Tensor, torch.Tensor]
        ``keep_indices`` ``(K,)`` (sorted per sequence) and ``keep_indptr`` ``(B + 1,)``, both int64, on
        ``scores``' device.

    Raises
    ------
    ValueError
        On scores that are not 1-D floating or hold NaN, malformed offsets, ``extend_indptr[-1] != T``,
        ``ratio`` outside ``[0, 1]`` or a negative ``window``.
    """
    if scores.dim() != 1 or not scores.is_floating_point():
        raise ValueError(f"scores must be a 1-D floating tensor; got {scores.dtype} of shape {tuple(scores.shape)}")
    if not 0.0 <= ratio <= 1.0:
        raise ValueError(f"ratio must lie in [0, 1]; got {ratio}")
    if window < 0:
        raise ValueError(f"window must be >= 0; got {window}")
    lengths = _batch_lengths(extend_indptr, scores.shape[0], "scores")
    if scores.isnan().any():
        raise ValueError("scores contain NaN")
    kept: list[torch.Tensor] = []
    for start, length in zip(extend_indptr.tolist(), lengths.tolist()):
        body = max(length - window, 0)
        top = min(math.floor(ratio * length + _EPS), body)
        order = torch.sort(scores[start : start + body], descending=True, stable=True).indices[:top]
        tail = torch.arange(body, length, device=scores.device)
        kept.append(torch.cat([order.sort().values, tail]))
    keep_lengths = torch.tensor([0] + [len(k) for k in kept], device=scores.device)
    keep_indices = torch.cat(kept) if kept else torch.zeros(0, dtype=torch.int64, device=scores.device)
    return keep_indices, keep_lengths.cumsum(0)
