"""Window scores: the attention that the last ``window`` queries of each sequence pay to every key.

Fused attention kernels do not return attention weights, so KV-selection policies (SnapKV, H2O,
StructKV's centrality) recompute them: the last ``window`` query vectors of a sequence against all
of its keys, read from the token pool through the sequence's slot list. For sequence ``b`` of length
``L``, key token ``j`` and kv head ``h``::

    S[b, h, j] = sum_{i < window} sum_{g < group} softmax_j(q[b, i, h * group + g] . k_j * scale)

where query ``i`` sits at absolute position ``L - window + i`` and sees keys ``0 .. L - window + i``
(causal). When ``L < window`` the first ``window - L`` query rows have no position and contribute
nothing. Query head ``h * group + g`` reads kv head ``h`` (GQA, ``group = num_q_heads //
num_kv_heads``), as in SGLang and Hugging Face models.

Sequences come as in SGLang's triton attention backend: ``kv_indptr`` (CSR offsets) into a
flattened ``kv_indices`` of token-pool slots. Scores come back packed the same way: a
``(num_kv_heads, kv_indices.shape[0])`` float32 tensor whose columns ``kv_indptr[b]:kv_indptr[b + 1]``
are sequence ``b``'s ``(num_kv_heads, L_b)`` scores (columns past ``kv_indptr[-1]``, where
``kv_indices`` has spare capacity, are 0). The width comes from a shape, so no device-to-host sync
is needed to size the output.

``window_scores_reference`` is plain torch (gather, matmul, mask, softmax, sum).
``window_scores_triton`` computes the same without materializing the ``(window, L)`` weights: it
tiles over keys in three launches (per-split softmax statistics, their combination, normalized
scores summed over query rows) and reads each key tile twice.
"""

from __future__ import annotations

from itertools import pairwise

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# How close the Triton scores are to window_scores_reference's (atol = rtol), by input dtype: what
# the kernel's tests assert and its benchmark reports.
SCORE_TOLERANCES = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 1e-3}
# Keys per tile, and most query rows (window x group) per tile.
BLOCK_N = 64
MAX_BLOCK_M = 64
# Most programs sharing one (sequence, kv head): splits of the key tiles.
MAX_SPLITS = 64


def _check_inputs(q: torch.Tensor, k_buffer: torch.Tensor, kv_indptr: torch.Tensor, kv_indices: torch.Tensor) -> None:
    """Raise ``ValueError`` on shapes, dtypes or devices that the window-score functions reject."""
    if q.dim() != 4 or k_buffer.dim() != 3:
        raise ValueError(
            f"q must be (batch, window, num_q_heads, head_dim) and k_buffer (pool_size, num_kv_heads, "
            f"head_dim); got {tuple(q.shape)} and {tuple(k_buffer.shape)}"
        )
    if q.shape[3] != k_buffer.shape[2]:
        raise ValueError(f"head_dim differs: q {q.shape[3]}, k_buffer {k_buffer.shape[2]}")
    if q.shape[2] % k_buffer.shape[1] != 0:
        raise ValueError(f"num_q_heads {q.shape[2]} is not a multiple of num_kv_heads {k_buffer.shape[1]}")
    if q.dtype != k_buffer.dtype or q.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"q and k_buffer must share one dtype of {SUPPORTED_DTYPES}; got {q.dtype}, {k_buffer.dtype}")
    if kv_indptr.shape != (q.shape[0] + 1,) or kv_indices.dim() != 1:
        raise ValueError(
            f"kv_indptr must be (batch + 1,) = ({q.shape[0] + 1},) and kv_indices 1-D; "
            f"got {tuple(kv_indptr.shape)} and {tuple(kv_indices.shape)}"
        )
    if kv_indptr.dtype not in (torch.int32, torch.int64) or kv_indices.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"kv_indptr and kv_indices must be int32 or int64; got {kv_indptr.dtype}, {kv_indices.dtype}")
    devices = {t.device for t in (q, k_buffer, kv_indptr, kv_indices)}
    if len(devices) != 1:
        raise ValueError(f"all inputs must be on one device; got {sorted(map(str, devices))}")


def _default_scale(q: torch.Tensor, scale: float | None) -> float:
    """``scale`` if given, else ``head_dim ** -0.5``."""
    return q.shape[3] ** -0.5 if scale is None else scale


def window_scores_reference(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    scale: float | None = None,
) -> torch.Tensor:
    """Attention mass the last ``window`` queries pay to each key, in plain torch, sequence by sequence.

    Parameters
    ----------
    q : torch.Tensor
        ``(batch, window, num_q_heads, head_dim)``, bfloat16, float16 or float32: the last ``window``
        query vectors of each sequence, oldest first (row ``i`` at position ``L - window + i``).
    k_buffer : torch.Tensor
        ``(pool_size, num_kv_heads, head_dim)``, the dtype of ``q``: the token pool's keys of one layer.
    kv_indptr : torch.Tensor
        ``(batch + 1,)``, int32 or int64: sequence ``b``'s slots are ``kv_indices[kv_indptr[b]:kv_indptr[b + 1]]``.
    kv_indices : torch.Tensor
        ``(num_slots,)`` with ``num_slots >= kv_indptr[-1]``, int32 or int64: token-pool slots, in
        position order per sequence.
    scale : float, optional
        Logit scale; ``head_dim ** -0.5`` when omitted.

    Returns
    -------
    torch.Tensor
        ``(num_kv_heads, num_slots)``, float32: column ``kv_indptr[b] + j`` holds, per kv head, the
        softmax weight that key ``j`` of sequence ``b`` receives, summed over the window queries and the
        query heads of that kv head; columns from ``kv_indptr[-1]`` on are 0. Each sequence's columns sum
        to ``min(L, window) * group`` per head.
    """
    _check_inputs(q, k_buffer, kv_indptr, kv_indices)
    num_kv_heads = k_buffer.shape[1]
    offsets = kv_indptr.tolist()
    out = torch.zeros(num_kv_heads, kv_indices.shape[0], dtype=torch.float32, device=q.device)
    for b, (start, end) in enumerate(pairwise(offsets)):
        keys = k_buffer[kv_indices[start:end].long()].float()
        out[:, start:end] = sequence_window_scores(q[b].float(), keys, _default_scale(q, scale))
    return out


def sequence_window_scores(q: torch.Tensor, keys: torch.Tensor, scale: float) -> torch.Tensor:
    """One sequence's window scores from keys already gathered, in plain torch.

    Parameters
    ----------
    q : torch.Tensor
        ``(window, num_q_heads, head_dim)``, float32: the sequence's last ``window`` queries, oldest
        first (row ``i`` at position ``L - window + i``).
    keys : torch.Tensor
        ``(L, num_kv_heads, head_dim)``, float32: the keys the queries see, in position order.
    scale : float
        Logit scale.

    Returns
    -------
    torch.Tensor
        ``(num_kv_heads, L)`` float32, as one sequence's columns of ``window_scores_reference``.
    """
    window, num_q_heads, head_dim = q.shape
    length, num_kv_heads, _ = keys.shape
    grouped = q.reshape(window, num_kv_heads, num_q_heads // num_kv_heads, head_dim)
    logits = torch.einsum("wkgd,lkd->kwgl", grouped, keys) * scale
    positions = torch.arange(length - window, length, device=q.device)
    visible = torch.arange(length, device=q.device)[None, :] <= positions[:, None]
    weights = torch.softmax(logits.masked_fill(~visible[None, :, None, :], float("-inf")), dim=-1)
    weights = weights.masked_fill((positions < 0)[None, :, None, None], 0.0)
    return weights.sum(dim=(1, 2))


def sum_kv_heads(scores: torch.Tensor) -> torch.Tensor:
    """Reduce window scores over kv heads.

    Parameters
    ----------
    scores : torch.Tensor
        ``(num_kv_heads, total_tokens)``, float32, as returned by ``window_scores_reference`` or
        ``window_scores_triton``.

    Returns
    -------
    torch.Tensor
        ``(total_tokens,)``, float32, packed like the input: ``[kv_indptr[b]:kv_indptr[b + 1]]`` is
        sequence ``b``'s ``(L,)`` score.
    """
    return scores.sum(dim=0)


@triton.jit
def _load_queries(
    Q,
    b,
    h,
    m_block,
    window,
    group,
    length,
    stride_qb,
    stride_qw,
    stride_qh,
    stride_qd,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_D: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
):
    """Query rows ``m_block * BLOCK_M ..`` of kv head ``h`` (row ``r``: window query ``r // group``,
    query head ``h * group + r % group``): the ``(BLOCK_M, BLOCK_D)`` tile in ``DOT_DTYPE``, each
    row's absolute position, and which rows exist."""
    rows = m_block * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, BLOCK_D)
    query = rows // group
    row_ok = rows < window * group
    offs = (
        b.to(tl.int64) * stride_qb
        + query[:, None] * stride_qw
        + (h * group + rows % group)[:, None] * stride_qh
        + dims[None, :] * stride_qd
    )
    tile = tl.load(Q + offs, mask=row_ok[:, None] & (dims[None, :] < HEAD_DIM), other=0.0)
    return tile.to(DOT_DTYPE), length - window + query, row_ok


@triton.jit
def _load_keys(
    K,
    kv_indices,
    start,
    h,
    cols,
    length,
    stride_kt,
    stride_kh,
    stride_kd,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
):
    """Keys of kv head ``h`` at sequence positions ``cols``, transposed: ``(BLOCK_D, BLOCK_N)`` in
    ``DOT_DTYPE``."""
    dims = tl.arange(0, BLOCK_D)
    col_ok = cols < length
    slots = tl.load(kv_indices + start + cols, mask=col_ok, other=0).to(tl.int64)
    offs = slots[None, :] * stride_kt + h * stride_kh + dims[:, None] * stride_kd
    return tl.load(K + offs, mask=col_ok[None, :] & (dims[:, None] < HEAD_DIM), other=0.0).to(DOT_DTYPE)


@triton.jit
def _masked_logits(q, k_t, positions, row_ok, cols, scale, DOT_PRECISION: tl.constexpr):
    """``q @ k_t * scale`` with ``-inf`` where a key is after the row's position or the row is absent."""
    logits = tl.dot(q, k_t, input_precision=DOT_PRECISION) * scale
    visible = (cols[None, :] <= positions[:, None]) & row_ok[:, None]
    return tl.where(visible, logits, float("-inf"))


@triton.jit
def _finite_or_zero(x):
    """``x`` with ``-inf`` replaced by 0 (a row that has seen no key yet)."""
    return tl.where(x == float("-inf"), 0.0, x)


@triton.jit
def _split_stats_kernel(
    Q,
    K,
    kv_indptr,
    kv_indices,
    Max,
    Sum,
    scale,
    window,
    group,
    num_splits,
    stride_qb,
    stride_qw,
    stride_qh,
    stride_qd,
    stride_kt,
    stride_kh,
    stride_kd,
    HEAD_DIM: tl.constexpr,
    NUM_M_BLOCKS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """Program (b, h, s): per query row, the running max and exp-sum of the logits over key tiles
    ``s, s + num_splits, ..`` of sequence ``b``, stored at ``Max/Sum[b, h, s, row]``."""
    b = tl.program_id(0)
    h = tl.program_id(1)
    split = tl.program_id(2)
    start = tl.load(kv_indptr + b).to(tl.int64)
    length = (tl.load(kv_indptr + b + 1) - start).to(tl.int32)
    num_tiles = tl.cdiv(length, BLOCK_N)
    stats_base = ((b * tl.num_programs(1) + h) * num_splits + split).to(tl.int64) * (NUM_M_BLOCKS * BLOCK_M)
    for m_block in range(NUM_M_BLOCKS):
        q, positions, row_ok = _load_queries(
            Q,
            b,
            h,
            m_block,
            window,
            group,
            length,
            stride_qb,
            stride_qw,
            stride_qh,
            stride_qd,
            HEAD_DIM,
            BLOCK_M,
            BLOCK_D,
            DOT_DTYPE,
        )
        row_max = tl.full([BLOCK_M], float("-inf"), tl.float32)
        row_sum = tl.zeros([BLOCK_M], tl.float32)
        for tile in range(split, num_tiles, num_splits):
            cols = tile * BLOCK_N + tl.arange(0, BLOCK_N)
            k_t = _load_keys(
                K, kv_indices, start, h, cols, length, stride_kt, stride_kh, stride_kd, HEAD_DIM, BLOCK_D, DOT_DTYPE
            )
            logits = _masked_logits(q, k_t, positions, row_ok, cols, scale, DOT_PRECISION)
            new_max = tl.maximum(row_max, tl.max(logits, axis=1))
            shift = _finite_or_zero(new_max)
            row_sum = row_sum * tl.exp(row_max - shift) + tl.sum(tl.exp(logits - shift[:, None]), axis=1)
            row_max = new_max
        rows = m_block * BLOCK_M + tl.arange(0, BLOCK_M)
        tl.store(Max + stats_base + rows, row_max)
        tl.store(Sum + stats_base + rows, row_sum)


@triton.jit
def _combine_stats_kernel(Max, Sum, Shift, InvSum, num_splits, NUM_M_BLOCKS: tl.constexpr, BLOCK_M: tl.constexpr):
    """Program (b, h, m): merge the per-split statistics of query rows ``m * BLOCK_M ..`` into each
    row's softmax shift (its max; 0 for a row without keys) and inverse normalizer (0 without keys)."""
    pair = tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)
    rows = tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_max = tl.full([BLOCK_M], float("-inf"), tl.float32)
    row_sum = tl.zeros([BLOCK_M], tl.float32)
    for split in range(num_splits):
        offs = (pair * num_splits + split).to(tl.int64) * (NUM_M_BLOCKS * BLOCK_M) + rows
        part_max = tl.load(Max + offs)
        new_max = tl.maximum(row_max, part_max)
        shift = _finite_or_zero(new_max)
        row_sum = row_sum * tl.exp(row_max - shift) + tl.load(Sum + offs) * tl.exp(part_max - shift)
        row_max = new_max
    out = pair.to(tl.int64) * (NUM_M_BLOCKS * BLOCK_M) + rows
    tl.store(Shift + out, _finite_or_zero(row_max))
    has_keys = row_sum > 0
    tl.store(InvSum + out, tl.where(has_keys, 1.0 / tl.where(has_keys, row_sum, 1.0), 0.0))


@triton.jit
def _scores_kernel(
    Q,
    K,
    kv_indptr,
    kv_indices,
    Shift,
    InvSum,
    Out,
    scale,
    window,
    group,
    num_splits,
    stride_qb,
    stride_qw,
    stride_qh,
    stride_qd,
    stride_kt,
    stride_kh,
    stride_kd,
    stride_oh,
    stride_ot,
    HEAD_DIM: tl.constexpr,
    NUM_M_BLOCKS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """Program (b, h, s): for key tiles ``s, s + num_splits, ..`` of sequence ``b``, the normalized
    softmax weights summed over all query rows of kv head ``h``, stored at ``Out[h, start + j]``."""
    b = tl.program_id(0)
    h = tl.program_id(1)
    split = tl.program_id(2)
    start = tl.load(kv_indptr + b).to(tl.int64)
    length = (tl.load(kv_indptr + b + 1) - start).to(tl.int32)
    num_tiles = tl.cdiv(length, BLOCK_N)
    stats_base = (b * tl.num_programs(1) + h).to(tl.int64) * (NUM_M_BLOCKS * BLOCK_M)
    for tile in range(split, num_tiles, num_splits):
        cols = tile * BLOCK_N + tl.arange(0, BLOCK_N)
        k_t = _load_keys(
            K, kv_indices, start, h, cols, length, stride_kt, stride_kh, stride_kd, HEAD_DIM, BLOCK_D, DOT_DTYPE
        )
        total = tl.zeros([BLOCK_N], tl.float32)
        for m_block in range(NUM_M_BLOCKS):
            q, positions, row_ok = _load_queries(
                Q,
                b,
                h,
                m_block,
                window,
                group,
                length,
                stride_qb,
                stride_qw,
                stride_qh,
                stride_qd,
                HEAD_DIM,
                BLOCK_M,
                BLOCK_D,
                DOT_DTYPE,
            )
            rows = stats_base + m_block * BLOCK_M + tl.arange(0, BLOCK_M)
            logits = _masked_logits(q, k_t, positions, row_ok, cols, scale, DOT_PRECISION)
            weights = tl.exp(logits - tl.load(Shift + rows)[:, None]) * tl.load(InvSum + rows)[:, None]
            total += tl.sum(weights, axis=0)
        tl.store(Out + h * stride_oh + (start + cols) * stride_ot, total, mask=cols < length)


def _num_splits(batch: int, total_tokens: int) -> int:
    """Splits of each sequence's key tiles: the average tile count per sequence, capped (no host sync)."""
    return max(1, min(MAX_SPLITS, triton.cdiv(total_tokens, max(batch, 1) * BLOCK_N)))


def runs_interpreted() -> bool:
    """Whether the kernels were built for Triton's CPU interpreter (``TRITON_INTERPRET=1`` at import)."""
    return isinstance(_scores_kernel, InterpretedFunction)


def _dot_operands(dtype: torch.dtype) -> dict[str, tl.dtype | str | None]:
    """Operand dtype and precision of the logit dot products: the input dtype with float32
    accumulation, full float32 products (no TF32) for float32. Under ``TRITON_INTERPRET=1`` bfloat16
    operands go in as float32, which gives the same exact products: the interpreter stores bfloat16 as
    uint16 and its ``tl.dot`` multiplies the bit patterns (triton-lang/triton#11584)."""
    if dtype == torch.float32 or (runs_interpreted() and dtype == torch.bfloat16):
        return {"DOT_DTYPE": tl.float32, "DOT_PRECISION": "ieee"}
    return {"DOT_DTYPE": tl.float16 if dtype == torch.float16 else tl.bfloat16, "DOT_PRECISION": None}


def window_scores_triton(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    scale: float | None = None,
) -> torch.Tensor:
    """Attention mass the last ``window`` queries pay to each key, tiled over keys in Triton.

    Same inputs and result as ``window_scores_reference`` (see there for the formula). Logits are
    accumulated in float32 (full float32 products for float32 inputs, no TF32); softmax statistics
    are combined online over key tiles, so no ``(window, L)`` weight matrix is ever written. No
    device-to-host sync happens.

    Parameters
    ----------
    q : torch.Tensor
        ``(batch, window, num_q_heads, head_dim)``, bfloat16, float16 or float32, any strides.
    k_buffer : torch.Tensor
        ``(pool_size, num_kv_heads, head_dim)``, the dtype of ``q``, any strides.
    kv_indptr : torch.Tensor
        ``(batch + 1,)``, int32 or int64, contiguous.
    kv_indices : torch.Tensor
        ``(num_slots,)`` with ``num_slots >= kv_indptr[-1]``, int32 or int64.
    scale : float, optional
        Logit scale; ``head_dim ** -0.5`` when omitted.

    Returns
    -------
    torch.Tensor
        ``(num_kv_heads, num_slots)``, float32, packed like ``kv_indices``; 0 from ``kv_indptr[-1]`` on.
    """
    _check_inputs(q, k_buffer, kv_indptr, kv_indices)
    batch, window, num_q_heads, head_dim = q.shape
    num_kv_heads = k_buffer.shape[1]
    group = num_q_heads // num_kv_heads
    block_m = min(MAX_BLOCK_M, max(16, triton.next_power_of_2(window * group)))
    num_m_blocks = triton.cdiv(window * group, block_m)
    splits = _num_splits(batch, kv_indices.shape[0])
    out = q.new_zeros((num_kv_heads, kv_indices.shape[0]), dtype=torch.float32)
    if batch == 0:
        return out
    shapes = dict(
        HEAD_DIM=head_dim,
        NUM_M_BLOCKS=num_m_blocks,
        BLOCK_M=block_m,
        BLOCK_N=BLOCK_N,
        BLOCK_D=max(16, triton.next_power_of_2(head_dim)),
        **_dot_operands(q.dtype),
    )
    common = (kv_indptr.contiguous(), kv_indices.contiguous())
    strides = (*q.stride(), *k_buffer.stride())
    # Per-split (max, exp-sum) of every query row, then the merged (shift, 1 / sum).
    stats = q.new_empty((2, batch, num_kv_heads, splits, num_m_blocks * block_m), dtype=torch.float32)
    merged = q.new_empty((2, batch, num_kv_heads, num_m_blocks * block_m), dtype=torch.float32)
    grid = (batch, num_kv_heads, splits)
    logit_scale = _default_scale(q, scale)
    _split_stats_kernel[grid](
        q, k_buffer, *common, stats[0], stats[1], logit_scale, window, group, splits, *strides, **shapes
    )
    _combine_stats_kernel[(batch, num_kv_heads, num_m_blocks)](
        stats[0], stats[1], merged[0], merged[1], splits, NUM_M_BLOCKS=num_m_blocks, BLOCK_M=block_m
    )
    _scores_kernel[grid](
        q,
        k_buffer,
        *common,
        merged[0],
        merged[1],
        out,
        logit_scale,
        window,
        group,
        splits,
        *strides,
        *out.stride(),
        **shapes,
    )
    return out
