"""Decode attention over a request's full-precision slots and its low-bit blocks, in one pass.

A decode step of a layer group reads, per request, two kinds of KV in the layer's buffers:

* full-precision tokens: physical slots listed CSR-style (``kv_indptr``, ``kv_indices``), as
  SGLang's own triton decode kernel takes them;
* low-bit tokens (``--kv-dropped 2bit|k4v2``, :mod:`sglang_pask.kvpool.lowbit`): blocks of
  :data:`~.kv_lowbit.BLOCK_TOKENS` tokens in KIVI's layout (:mod:`.kv_lowbit`), each stored in ``R``
  physical slots of the same buffers. A block's bytes are its packed keys, then its packed values;
  the first ``R * row_bytes`` of them fill its slots' rows of the K buffer, the rest their rows of
  the V buffer (``row_bytes`` = ``kv_heads * head_dim * itemsize``). A request reads some of a
  block's 32 places (others may belong to other requests): a 32-bit mask per (request, block).

:func:`lowbit_decode_attention_triton` runs SGLang's two-stage split decode with one online softmax
over both kinds: stage 1, per (request, KV head, split), attends the split's share of the
full-precision tokens, then its share of the blocks, dequantizing each block in registers (keys per
channel, values per token, cast to the query's dtype as the torch_native backend does); stage 2
merges the splits by their log-sum-exp. All query heads of a KV head (GQA) share one program, so a
block is dequantized once per KV head. :func:`lowbit_decode_attention_reference` is the same in
plain torch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

from .kv_lowbit import (
    BLOCK_TOKENS,
    GROUP_CHANNELS,
    dequantize_key_blocks,
    dequantize_value_blocks,
    packed_part_bytes,
    rows_per_block,
)

#: Splits of a long row in stage 1 (SGLang's decode kernel uses 8 by default).
DEFAULT_SPLITS = 8


def block_bytes(k_buffer: torch.Tensor, v_buffer: torch.Tensor, block_slots: torch.Tensor) -> torch.Tensor:
    """``(nb, R)`` slots of ``nb`` blocks -> their bytes ``(nb, 2 * R * row_bytes)`` uint8: the K rows,
    then the V rows (``k_buffer``, ``v_buffer``: ``(S, kv_heads, head_dim)``)."""
    blocks = block_slots.shape[0]
    slots = block_slots.reshape(-1).long()
    return torch.cat(
        (
            k_buffer[slots].contiguous().view(torch.uint8).reshape(blocks, -1),
            v_buffer[slots].contiguous().view(torch.uint8).reshape(blocks, -1),
        ),
        dim=1,
    )


def lowbit_decode_attention_reference(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    block_indptr: torch.Tensor,
    block_slots: torch.Tensor,
    block_masks: torch.Tensor,
    key_bits: int,
    value_bits: int,
    sm_scale: float,
) -> torch.Tensor:
    """Decode attention of each request over its full-precision and low-bit tokens, in plain torch.

    Parameters
    ----------
    q : Tensor
        ``(B, q_heads, head_dim)``: one query per request.
    k_buffer, v_buffer : Tensor
        ``(S, kv_heads, head_dim)``: the layer's K and V buffers (low-bit blocks live in some slots).
    kv_indptr, kv_indices : Tensor
        ``(B + 1,)`` and ``(N,)`` int: each request's full-precision slots.
    block_indptr : Tensor
        ``(B + 1,)`` int: each request's blocks in ``block_slots`` and ``block_masks``.
    block_slots : Tensor
        ``(NB, R)`` int: each block's slots, ``R = rows_per_block(key_bits, value_bits, itemsize)``.
    block_masks : Tensor
        ``(NB,)`` int64: bit ``p`` set when the request reads place ``p`` of the block.
    key_bits, value_bits : int
        The blocks' code widths (2 or 4).
    sm_scale : float
        Softmax scale.

    Returns
    -------
    Tensor
        ``(B, q_heads, head_dim)`` in ``q``'s dtype. The order of the tokens does not matter in a
        decode step (every token is visible to the query).
    """
    batch, q_heads, head_dim = q.shape
    kv_heads = k_buffer.shape[1]
    group = q_heads // kv_heads
    key_part = packed_part_bytes(kv_heads, head_dim, key_bits)
    places = torch.arange(BLOCK_TOKENS, device=q.device)
    out = torch.zeros_like(q)
    for b in range(batch):
        slots = kv_indices[int(kv_indptr[b]) : int(kv_indptr[b + 1])].long()
        keys, values = [k_buffer[slots].to(q.dtype)], [v_buffer[slots].to(q.dtype)]
        first, last = int(block_indptr[b]), int(block_indptr[b + 1])
        if last > first:
            raw = block_bytes(k_buffer, v_buffer, block_slots[first:last])
            read = ((block_masks[first:last].long().unsqueeze(1) >> places) & 1).bool()  # (nb, 32)
            block_keys = dequantize_key_blocks(raw[:, :key_part], kv_heads, head_dim, key_bits)
            block_values = dequantize_value_blocks(raw[:, key_part:], kv_heads, head_dim, value_bits)
            keys.append(block_keys[read].to(q.dtype))
            values.append(block_values[read].to(q.dtype))
        k = torch.cat(keys).float().repeat_interleave(group, dim=1)  # (n, q_heads, head_dim)
        v = torch.cat(values).float().repeat_interleave(group, dim=1)
        if k.shape[0] == 0:
            continue
        logits = torch.einsum("hd,nhd->hn", q[b].float(), k) * sm_scale
        out[b] = torch.einsum("hn,nhd->hd", logits.softmax(dim=-1), v).to(q.dtype)
    return out


@triton.jit
def _block_byte(offset, slots_base, k_bytes, v_bytes, ROWS: tl.constexpr, ROW_BYTES: tl.constexpr):
    """The block byte at ``offset`` (any shape of int32 offsets) as int32 in 0..255."""
    row = offset // ROW_BYTES
    in_k = row < ROWS
    slot = tl.load(slots_base + tl.where(in_k, row, row - ROWS)).to(tl.int64)
    address = slot * ROW_BYTES + offset % ROW_BYTES
    from_k = tl.load(k_bytes + address, mask=in_k, other=0)
    from_v = tl.load(v_bytes + address, mask=~in_k, other=0)
    return tl.where(in_k, from_k, from_v).to(tl.int32)


@triton.jit
def _block_half(offset, slots_base, k_bytes, v_bytes, ROWS: tl.constexpr, ROW_BYTES: tl.constexpr):
    """The fp16 stored little-endian at block bytes ``offset``, ``offset + 1``, as float32."""
    low = _block_byte(offset, slots_base, k_bytes, v_bytes, ROWS, ROW_BYTES)
    high = _block_byte(offset + 1, slots_base, k_bytes, v_bytes, ROWS, ROW_BYTES)
    bits = (high * 256 + low).to(tl.int16)
    return bits.to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _attend_tile(query, keys, values, visible, sm_scale, best, total, acc):
    """One step of the online softmax: the queries ``(G, D)`` attend the tile's ``visible`` keys and
    values ``(N, D)``; ``best`` and ``total`` ``(G,)`` (running maximum and sum) and ``acc`` ``(G, D)``
    are updated and returned. A tile has at least one visible token."""
    logits = tl.dot(query, tl.trans(keys.to(query.dtype))).to(tl.float32) * sm_scale
    logits = tl.where(visible[None, :], logits, float("-inf"))
    new_best = tl.maximum(best, tl.max(logits, axis=1))
    rescale = tl.exp(best - new_best)
    weights = tl.where(visible[None, :], tl.exp(logits - new_best[:, None]), 0.0)
    acc = acc * rescale[:, None] + tl.dot(weights.to(values.dtype), values).to(tl.float32)
    return new_best, total * rescale + tl.sum(weights, axis=1), acc


@triton.jit
def _decode_stage1(
    q,
    k_buffer,
    v_buffer,
    k_bytes,
    v_bytes,
    kv_indptr,
    kv_indices,
    block_indptr,
    block_slots,
    block_masks,
    mid_out,
    mid_lse,
    sm_scale,
    stride_qb,
    stride_qh,
    stride_ks,
    stride_kh,
    stride_vs,
    stride_vh,
    GROUP: tl.constexpr,
    KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SPLITS: tl.constexpr,
    KEY_BITS: tl.constexpr,
    VALUE_BITS: tl.constexpr,
    ROWS: tl.constexpr,
    ROW_BYTES: tl.constexpr,
    BLOCK_TOKENS: tl.constexpr,
    GROUP_CHANNELS: tl.constexpr,
):
    b = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, HEAD_DIM)
    head = kv_head * GROUP + g
    head_ok = g < GROUP
    query = tl.load(q + b * stride_qb + head[:, None] * stride_qh + d[None, :], mask=head_ok[:, None], other=0.0)
    best = tl.full((BLOCK_G,), float("-inf"), tl.float32)
    total = tl.zeros((BLOCK_G,), tl.float32)
    acc = tl.zeros((BLOCK_G, HEAD_DIM), tl.float32)

    # Full-precision tokens: this split's share of the request's slots.
    start = tl.load(kv_indptr + b)
    length = tl.load(kv_indptr + b + 1) - start
    share = tl.cdiv(length, SPLITS)
    first = split * share
    stop = tl.minimum(first + share, length)
    n = tl.arange(0, BLOCK_N)
    for tile in range(first, stop, BLOCK_N):
        ok = tile + n < stop
        slot = tl.load(kv_indices + start + tile + n, mask=ok, other=0).to(tl.int64)
        keys = tl.load(
            k_buffer + slot[:, None] * stride_ks + kv_head * stride_kh + d[None, :], mask=ok[:, None], other=0.0
        )
        values = tl.load(
            v_buffer + slot[:, None] * stride_vs + kv_head * stride_vh + d[None, :], mask=ok[:, None], other=0.0
        )
        best, total, acc = _attend_tile(query, keys, values, ok, sm_scale, best, total, acc)

    # Low-bit blocks: this split's share of the request's blocks, dequantized in registers.
    block_start = tl.load(block_indptr + b)
    blocks = tl.load(block_indptr + b + 1) - block_start
    block_share = tl.cdiv(blocks, SPLITS)
    block_first = split * block_share
    block_stop = tl.minimum(block_first + block_share, blocks)
    t = tl.arange(0, BLOCK_TOKENS)
    key_codes_per_byte: tl.constexpr = 8 // KEY_BITS
    value_codes_per_byte: tl.constexpr = 8 // VALUE_BITS
    key_code_bytes: tl.constexpr = KV_HEADS * HEAD_DIM * BLOCK_TOKENS * KEY_BITS // 8
    key_part: tl.constexpr = key_code_bytes + 4 * KV_HEADS * HEAD_DIM
    value_code_bytes: tl.constexpr = BLOCK_TOKENS * KV_HEADS * HEAD_DIM * VALUE_BITS // 8
    value_groups: tl.constexpr = HEAD_DIM // GROUP_CHANNELS
    value_params: tl.constexpr = BLOCK_TOKENS * KV_HEADS * value_groups * 2
    channel = kv_head * HEAD_DIM + d  # (D,): the key groups of this head
    for index in range(block_first, block_stop):
        block = block_start + index
        slots_base = block_slots + block.to(tl.int64) * ROWS
        places = tl.load(block_masks + block)
        read = ((places >> t.to(tl.int64)) & 1) != 0
        # Keys, per channel: codes (heads, head_dim, 32 tokens), then scale and zero (heads, head_dim).
        key_offset = channel[None, :] * (BLOCK_TOKENS // key_codes_per_byte) + t[:, None] // key_codes_per_byte
        key_codes = (
            _block_byte(key_offset, slots_base, k_bytes, v_bytes, ROWS, ROW_BYTES)
            >> ((t[:, None] % key_codes_per_byte) * KEY_BITS)
        ) & ((1 << KEY_BITS) - 1)
        key_scale = _block_half(key_code_bytes + channel * 2, slots_base, k_bytes, v_bytes, ROWS, ROW_BYTES)
        key_zero = _block_half(
            key_code_bytes + 2 * KV_HEADS * HEAD_DIM + channel * 2, slots_base, k_bytes, v_bytes, ROWS, ROW_BYTES
        )
        keys = key_codes.to(tl.float32) * key_scale[None, :] + key_zero[None, :]
        # Values, per token: codes (32 tokens, heads, head_dim), then scale and zero (32, heads, groups).
        token_head = t[:, None] * KV_HEADS + kv_head
        value_offset = key_part + token_head * (HEAD_DIM // value_codes_per_byte) + d[None, :] // value_codes_per_byte
        value_codes = (
            _block_byte(value_offset, slots_base, k_bytes, v_bytes, ROWS, ROW_BYTES)
            >> ((d[None, :] % value_codes_per_byte) * VALUE_BITS)
        ) & ((1 << VALUE_BITS) - 1)
        param = (token_head * value_groups + d[None, :] // GROUP_CHANNELS) * 2
        value_scale = _block_half(key_part + value_code_bytes + param, slots_base, k_bytes, v_bytes, ROWS, ROW_BYTES)
        value_zero = _block_half(
            key_part + value_code_bytes + value_params + param, slots_base, k_bytes, v_bytes, ROWS, ROW_BYTES
        )
        values = (value_codes.to(tl.float32) * value_scale + value_zero).to(query.dtype)
        best, total, acc = _attend_tile(query, keys, values, read, sm_scale, best, total, acc)

    nonempty = total > 0
    out = acc / tl.where(nonempty, total, 1.0)[:, None]
    lse = tl.where(nonempty, best + tl.log(tl.where(nonempty, total, 1.0)), float("-inf"))
    row = (b * (KV_HEADS * GROUP) + head) * SPLITS + split
    tl.store(mid_out + row[:, None] * HEAD_DIM + d[None, :], out, mask=head_ok[:, None])
    tl.store(mid_lse + row, lse, mask=head_ok)


@triton.jit
def _decode_stage2(
    mid_out, mid_lse, out, stride_ob, stride_oh, Q_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, SPLITS: tl.constexpr
):
    b = tl.program_id(0)
    head = tl.program_id(1)
    d = tl.arange(0, HEAD_DIM)
    base = (b * Q_HEADS + head) * SPLITS
    best = float("-inf")
    total = 0.0
    acc = tl.zeros((HEAD_DIM,), tl.float32)
    for split in range(SPLITS):
        lse = tl.load(mid_lse + base + split)
        if lse > float("-inf"):
            new_best = tl.maximum(best, lse)
            rescale = tl.exp(best - new_best)
            weight = tl.exp(lse - new_best)
            acc = acc * rescale + weight * tl.load(mid_out + (base + split) * HEAD_DIM + d)
            total = total * rescale + weight
            best = new_best
    result = acc / tl.where(total > 0, total, 1.0)
    tl.store(out + b * stride_ob + head * stride_oh + d, result.to(out.dtype.element_ty))


def runs_interpreted() -> bool:
    """Whether the kernels were built for Triton's CPU interpreter (``TRITON_INTERPRET=1`` at import)."""
    return isinstance(_decode_stage1, InterpretedFunction)


def lowbit_decode_attention_triton(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    block_indptr: torch.Tensor,
    block_slots: torch.Tensor,
    block_masks: torch.Tensor,
    key_bits: int,
    value_bits: int,
    sm_scale: float,
    splits: int = DEFAULT_SPLITS,
    block_n: int = 32,
) -> torch.Tensor:
    """:func:`lowbit_decode_attention_reference` as two Triton kernels (same arguments, same result
    up to the order of floating-point sums); ``splits`` cuts long rows, ``block_n`` is the tile of
    full-precision tokens.

    ``head_dim`` must be a power of two and a multiple of :data:`~.kv_lowbit.GROUP_CHANNELS`; the
    buffers contiguous.
    """
    batch, q_heads, head_dim = q.shape
    slots, kv_heads, buffer_dim = k_buffer.shape
    if buffer_dim != head_dim or v_buffer.shape != k_buffer.shape:
        raise ValueError(
            f"buffers {tuple(k_buffer.shape)} / {tuple(v_buffer.shape)} do not fit queries {tuple(q.shape)}"
        )
    if q_heads % kv_heads or head_dim & (head_dim - 1) or head_dim % GROUP_CHANNELS:
        raise ValueError(
            f"need q_heads divisible by kv_heads and a power-of-two head_dim divisible by "
            f"{GROUP_CHANNELS}, got {q_heads}, {kv_heads}, {head_dim}"
        )
    if not (k_buffer.is_contiguous() and v_buffer.is_contiguous()):
        raise ValueError("the K and V buffers must be contiguous")
    rows = rows_per_block(key_bits, value_bits, k_buffer.element_size())
    if block_slots.numel() and block_slots.shape[1] != rows:
        raise ValueError(f"blocks of {key_bits}/{value_bits} bits take {rows} slots, got {block_slots.shape[1]}")
    group = q_heads // kv_heads
    mid_out = torch.empty((batch, q_heads, splits, head_dim), dtype=torch.float32, device=q.device)
    mid_lse = torch.empty((batch, q_heads, splits), dtype=torch.float32, device=q.device)
    out = torch.empty_like(q)
    if block_slots.numel() == 0:
        block_slots = torch.zeros((1, rows), dtype=torch.int64, device=q.device)
        block_masks = torch.zeros(1, dtype=torch.int64, device=q.device)
    _decode_stage1[(batch, kv_heads, splits)](
        q,
        k_buffer,
        v_buffer,
        k_buffer.view(torch.uint8),
        v_buffer.view(torch.uint8),
        kv_indptr,
        kv_indices,
        block_indptr,
        block_slots.contiguous(),
        block_masks.long().contiguous(),
        mid_out,
        mid_lse,
        sm_scale,
        q.stride(0),
        q.stride(1),
        k_buffer.stride(0),
        k_buffer.stride(1),
        v_buffer.stride(0),
        v_buffer.stride(1),
        GROUP=group,
        KV_HEADS=kv_heads,
        HEAD_DIM=head_dim,
        BLOCK_G=max(16, triton.next_power_of_2(group)),
        BLOCK_N=block_n,
        SPLITS=splits,
        KEY_BITS=key_bits,
        VALUE_BITS=value_bits,
        ROWS=rows,
        ROW_BYTES=kv_heads * head_dim * k_buffer.element_size(),
        BLOCK_TOKENS=BLOCK_TOKENS,
        GROUP_CHANNELS=GROUP_CHANNELS,
    )
    _decode_stage2[(batch, q_heads)](
        mid_out, mid_lse, out, out.stride(0), out.stride(1), Q_HEADS=q_heads, HEAD_DIM=head_dim, SPLITS=splits
    )
    return out
