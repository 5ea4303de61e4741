"""Low-bit KV blocks in KIVI's layout: keys quantized per channel, values per token, at 2 or 4 bits.

A *block* holds up to :data:`BLOCK_TOKENS` tokens of one layer's K (or V), for ``heads`` KV heads of
``head_dim`` channels. Quantization is asymmetric with ``bits`` in (2, 4): a group of elements keeps
an fp16 ``zero`` (its minimum) and ``scale`` ((maximum - minimum) / (2**bits - 1)), and each element
the code ``round((x - zero) / scale)`` in 0..2**bits-1, ``8 / bits`` codes to a byte.

* Keys (per channel, KIVI): a group is one channel of one head over the block's tokens. Packed:
  codes ``(heads, head_dim, BLOCK_TOKENS * bits / 8)`` uint8, then scale and zero ``(heads, head_dim)`` fp16.
* Values (per token): a group is :data:`GROUP_CHANNELS` consecutive channels of one head of one token.
  Packed: codes ``(BLOCK_TOKENS, heads, head_dim * bits / 8)`` uint8, then scale and zero
  ``(BLOCK_TOKENS, heads, head_dim / GROUP_CHANNELS)`` fp16. (Rotating each group by a Hadamard
  matrix first lowered the values' 2-bit error but cost 7.6 points on the 228 BFCL evaluation items,
  so values are not rotated: ``bench/results/pask_2bit_rotation_calib_2026-12-06.md``.)

Either part is ``(4 * bits + 4) * heads * head_dim`` bytes (:func:`packed_part_bytes`): at 2 bits
3/16 of the block's bf16 bytes, at 4 bits 5/16. A block of fewer tokens is padded with copies of its
last token, which leaves every group's minimum and maximum as they are; dequantizing returns the
whole block and the caller keeps its own tokens.

Plain torch, on whatever device the inputs are: the torch_native attention backend quantizes and
reads with these functions (there is no Triton kernel for them yet; the triton backend does not
serve low-bit blocks).
"""

from __future__ import annotations

import math

import torch

BLOCK_TOKENS = 32
GROUP_CHANNELS = 32
#: The code widths a block part can have.
BITS = (2, 4)
# The divisor of a group whose fp16 scale is 0 (its elements all equal, or closer than fp16 resolves):
# its codes stay in range (never 0 / 0) and, times a scale of 0, it dequantizes to its minimum.
_MIN_STEP = 1e-8


def check_bits(bits: int) -> None:
    """Raise ``ValueError`` unless ``bits`` is one of :data:`BITS`."""
    if bits not in BITS:
        raise ValueError(f"low-bit KV blocks have 2 or 4 bits an element, got {bits}")


def packed_part_bytes(heads: int, head_dim: int, bits: int) -> int:
    """Bytes of one block's packed keys (or values) at ``bits``: ``(4 * bits + 4) * heads * head_dim``."""
    check_head_dim(head_dim)
    check_bits(bits)
    return (4 * bits + 4) * heads * head_dim


def rows_per_block(key_bits: int, value_bits: int, itemsize: int) -> int:
    """Slots of a pool one block of keys at ``key_bits`` and values at ``value_bits`` takes when each
    slot holds a row of ``heads * head_dim`` elements of ``itemsize`` bytes in each of K and V:
    ``(2 * (key_bits + value_bits) + 4) / itemsize``."""
    check_bits(key_bits)
    check_bits(value_bits)
    per_channel = 2 * (key_bits + value_bits) + 4
    if itemsize not in (1, 2, 4) or per_channel % itemsize:
        raise ValueError(f"low-bit blocks need a KV element of 1, 2 or 4 bytes, got {itemsize}")
    return per_channel // itemsize


def check_head_dim(head_dim: int) -> None:
    """Raise ``ValueError`` unless values can be grouped by :data:`GROUP_CHANNELS` channels."""
    if head_dim % GROUP_CHANNELS != 0:
        raise ValueError(f"low-bit KV blocks need a head_dim that is a multiple of {GROUP_CHANNELS}, got {head_dim}")


def pad_block(tokens: torch.Tensor) -> torch.Tensor:
    """``(m, heads, head_dim)`` with ``1 <= m <= BLOCK_TOKENS`` -> ``(BLOCK_TOKENS, heads, head_dim)``,
    the last token repeated."""
    m = tokens.shape[0]
    if not 1 <= m <= BLOCK_TOKENS:
        raise ValueError(f"a block holds 1 to {BLOCK_TOKENS} tokens, got {m}")
    return torch.cat((tokens, tokens[-1:].expand(BLOCK_TOKENS - m, *tokens.shape[1:])))


def _quantize_groups(x: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(..., n)`` float -> codes ``(..., n)`` uint8 in 0..2**bits-1, scale and zero ``(...,)`` fp16,
    each group being the last dimension."""
    levels = (1 << bits) - 1
    x = x.float()
    low, high = x.amin(dim=-1), x.amax(dim=-1)
    scale = ((high - low) / levels).half()
    zero = low.half()
    step = scale.float().clamp_min(_MIN_STEP).unsqueeze(-1)
    codes = ((x - zero.float().unsqueeze(-1)) / step).round().clamp(0, levels)
    return codes.to(torch.uint8), scale, zero


def _pack(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """``(..., n)`` uint8 codes of ``bits`` bits -> ``(..., n * bits / 8)`` uint8, code ``k * i + j``
    (``k = 8 / bits``) in bits ``bits * j`` up of byte ``i``."""
    per_byte = 8 // bits
    grouped = codes.reshape(*codes.shape[:-1], -1, per_byte)
    packed = grouped[..., 0].clone()
    for j in range(1, per_byte):
        packed |= grouped[..., j] << (bits * j)
    return packed


def _unpack(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """Inverse of :func:`_pack`: ``(..., n * bits / 8)`` uint8 -> ``(..., n)`` uint8."""
    mask = (1 << bits) - 1
    codes = torch.stack([(packed >> shift) & mask for shift in range(0, 8, bits)], dim=-1)
    return codes.reshape(*packed.shape[:-1], -1)


def _serialize(codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, bits: int) -> torch.Tensor:
    """``(blocks, ...)`` codes (packed along their last dimension), scales and zeros -> ``(blocks, bytes)``
    uint8: the packed codes, then the scales, then the zeros, each flattened per block."""
    blocks = codes.shape[0]
    return torch.cat(
        (
            _pack(codes, bits).reshape(blocks, -1),
            scale.reshape(blocks, -1).view(torch.uint8),
            zero.reshape(blocks, -1).view(torch.uint8),
        ),
        dim=1,
    )


def _deserialize(
    packed: torch.Tensor, code_shape: tuple[int, ...], param_shape: tuple[int, ...], bits: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inverse of :func:`_serialize` for ``(blocks, bytes)`` uint8: codes ``(blocks, *code_shape)``
    uint8 (``code_shape``'s last dimension unpacked), scale and zero ``(blocks, *param_shape)`` fp16."""
    blocks = packed.shape[0]
    code_bytes = math.prod(code_shape) * bits // 8
    params = math.prod(param_shape) * 2
    codes = _unpack(packed[:, :code_bytes].reshape(blocks, *code_shape[:-1], code_shape[-1] * bits // 8), bits)
    scale = packed[:, code_bytes : code_bytes + params].contiguous().view(torch.float16).reshape(blocks, *param_shape)
    zero = packed[:, code_bytes + params :].contiguous().view(torch.float16).reshape(blocks, *param_shape)
    return codes, scale, zero


def quantize_key_blocks(keys: torch.Tensor, bits: int = 2) -> torch.Tensor:
    """Pack blocks of keys per channel.

    Parameters
    ----------
    keys : Tensor
        ``(blocks, BLOCK_TOKENS, heads, head_dim)``, any float dtype (partial blocks padded with
        :func:`pad_block`).
    bits : int
        Code width, one of :data:`BITS`.

    Returns
    -------
    Tensor
        ``(blocks, packed_part_bytes(heads, head_dim, bits))`` uint8.
    """
    check_head_dim(keys.shape[3])
    check_bits(bits)
    codes, scale, zero = _quantize_groups(keys.permute(0, 2, 3, 1), bits)  # groups: (blocks, heads, head_dim)
    return _serialize(codes, scale, zero, bits)


def dequantize_key_blocks(packed: torch.Tensor, heads: int, head_dim: int, bits: int = 2) -> torch.Tensor:
    """``(blocks, packed_part_bytes)`` uint8 -> ``(blocks, BLOCK_TOKENS, heads, head_dim)`` float32."""
    codes, scale, zero = _deserialize(packed, (heads, head_dim, BLOCK_TOKENS), (heads, head_dim), bits)
    keys = codes.float() * scale.float().unsqueeze(-1) + zero.float().unsqueeze(-1)
    return keys.permute(0, 3, 1, 2)


def quantize_value_blocks(values: torch.Tensor, bits: int = 2) -> torch.Tensor:
    """Pack blocks of values per token, in groups of :data:`GROUP_CHANNELS` channels.

    Parameters
    ----------
    values : Tensor
        ``(blocks, BLOCK_TOKENS, heads, head_dim)``, any float dtype.
    bits : int
        Code width, one of :data:`BITS`.

    Returns
    -------
    Tensor
        ``(blocks, packed_part_bytes(heads, head_dim, bits))`` uint8.
    """
    blocks, tokens, heads, head_dim = values.shape
    check_head_dim(head_dim)
    check_bits(bits)
    codes, scale, zero = _quantize_groups(
        values.reshape(blocks, tokens, heads, head_dim // GROUP_CHANNELS, GROUP_CHANNELS), bits
    )
    return _serialize(codes.reshape(blocks, tokens, heads, head_dim), scale, zero, bits)


def dequantize_value_blocks(packed: torch.Tensor, heads: int, head_dim: int, bits: int = 2) -> torch.Tensor:
    """``(blocks, packed_part_bytes)`` uint8 -> ``(blocks, BLOCK_TOKENS, heads, head_dim)`` float32."""
    groups = head_dim // GROUP_CHANNELS
    codes, scale, zero = _deserialize(packed, (BLOCK_TOKENS, heads, head_dim), (BLOCK_TOKENS, heads, groups, 1), bits)
    grouped = codes.reshape(-1, BLOCK_TOKENS, heads, groups, GROUP_CHANNELS)
    return (grouped.float() * scale.float() + zero.float()).reshape(-1, BLOCK_TOKENS, heads, head_dim)
