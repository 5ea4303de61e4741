"""2-bit KV blocks in KIVI's layout: keys quantized per channel, values per token.

A *block* holds up to :data:`BLOCK_TOKENS` tokens of one layer's K (or V), for ``heads`` KV heads of
``head_dim`` channels. Quantization is asymmetric 2-bit: a group of elements keeps an fp16 ``zero``
(its minimum) and ``scale`` ((maximum - minimum) / 3), and each element the code
``round((x - zero) / scale)`` in 0..3, four codes to a byte.

* Keys (per channel, KIVI): a group is one channel of one head over the block's tokens. Packed:
  codes ``(heads, head_dim, BLOCK_TOKENS / 4)`` uint8, then scale and zero ``(heads, head_dim)`` fp16.
* Values (per token): a group is :data:`GROUP_CHANNELS` consecutive channels of one head of one token.
  Packed: codes ``(BLOCK_TOKENS, heads, head_dim / 4)`` uint8, then scale and zero
  ``(BLOCK_TOKENS, heads, head_dim / GROUP_CHANNELS)`` fp16. (Rotating each group by a Hadamard
  matrix first lowered the values' error but cost 7.6 points on the 228 BFCL evaluation items, so
  values are not rotated: ``bench/results/pask_2bit_rotation_calib_2026-12-06.md``.)

Either part is ``12 * heads * head_dim`` bytes (:func:`packed_block_bytes`): 3/16 of the block's bf16
bytes. A block of fewer tokens is padded with copies of its last token, which leaves every group's
minimum and maximum as they are; dequantizing returns the whole block and the caller keeps its own
tokens.

Plain torch, on whatever device the inputs are: the torch_native attention backend quantizes and
reads with these functions (there is no Triton kernel for them yet; the triton backend does not
serve 2-bit blocks).
"""

from __future__ import annotations

import math

import torch

BLOCK_TOKENS = 32
GROUP_CHANNELS = 32
LEVELS = 3  # the largest 2-bit code
_SHIFTS = (0, 2, 4, 6)
# The divisor of a group whose fp16 scale is 0 (its elements all equal, or closer than fp16 resolves):
# its codes stay in 0..3 (never 0 / 0) and, times a scale of 0, it dequantizes to its minimum.
_MIN_STEP = 1e-8


def packed_block_bytes(heads: int, head_dim: int) -> int:
    """Bytes of one block's packed keys (or values): ``12 * heads * head_dim``."""
    check_head_dim(head_dim)
    return 12 * heads * head_dim


def check_head_dim(head_dim: int) -> None:
    """Raise ``ValueError`` unless values can be grouped by :data:`GROUP_CHANNELS` channels."""
    if head_dim % GROUP_CHANNELS != 0:
        raise ValueError(f"2-bit KV blocks need a head_dim that is a multiple of {GROUP_CHANNELS}, got {head_dim}")


def pad_block(tokens: torch.Tensor) -> torch.Tensor:
    """``(m, heads, head_dim)`` with ``1 <= m <= BLOCK_TOKENS`` -> ``(BLOCK_TOKENS, heads, head_dim)``,
    the last token repeated."""
    m = tokens.shape[0]
    if not 1 <= m <= BLOCK_TOKENS:
        raise ValueError(f"a block holds 1 to {BLOCK_TOKENS} tokens, got {m}")
    return torch.cat((tokens, tokens[-1:].expand(BLOCK_TOKENS - m, *tokens.shape[1:])))


def _quantize_groups(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(..., n)`` float -> codes ``(..., n)`` uint8 in 0..3, scale and zero ``(...,)`` fp16, each group
    being the last dimension."""
    x = x.float()
    low, high = x.amin(dim=-1), x.amax(dim=-1)
    scale = ((high - low) / LEVELS).half()
    zero = low.half()
    step = scale.float().clamp_min(_MIN_STEP).unsqueeze(-1)
    codes = ((x - zero.float().unsqueeze(-1)) / step).round().clamp(0, LEVELS)
    return codes.to(torch.uint8), scale, zero


def _pack(codes: torch.Tensor) -> torch.Tensor:
    """``(..., n)`` uint8 codes in 0..3 -> ``(..., n / 4)`` uint8, code ``4i + j`` in bits ``2j..2j+1``."""
    quads = codes.reshape(*codes.shape[:-1], -1, 4)
    packed = quads[..., 0] | (quads[..., 1] << 2) | (quads[..., 2] << 4) | (quads[..., 3] << 6)
    return packed


def _unpack(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`_pack`: ``(..., n / 4)`` uint8 -> ``(..., n)`` uint8."""
    quads = torch.stack([(packed >> shift) & 3 for shift in _SHIFTS], dim=-1)
    return quads.reshape(*packed.shape[:-1], -1)


def _serialize(codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> torch.Tensor:
    """``(blocks, ...)`` codes (packed along their last dimension), scales and zeros -> ``(blocks, bytes)``
    uint8: the packed codes, then the scales, then the zeros, each flattened per block."""
    blocks = codes.shape[0]
    return torch.cat((_pack(codes).reshape(blocks, -1), scale.reshape(blocks, -1).view(torch.uint8),
                      zero.reshape(blocks, -1).view(torch.uint8)), dim=1)


def _deserialize(packed: torch.Tensor, code_shape: tuple[int, ...],
                 param_shape: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inverse of :func:`_serialize` for ``(blocks, bytes)`` uint8: codes ``(blocks, *code_shape)``
    uint8 (``code_shape``'s last dimension unpacked), scale and zero ``(blocks, *param_shape)`` fp16."""
    blocks = packed.shape[0]
    code_bytes = math.prod(code_shape) // 4
    params = math.prod(param_shape) * 2
    codes = _unpack(packed[:, :code_bytes].reshape(blocks, *code_shape[:-1], code_shape[-1] // 4))
    scale = packed[:, code_bytes:code_bytes + params].contiguous().view(torch.float16).reshape(blocks, *param_shape)
    zero = packed[:, code_bytes + params:].contiguous().view(torch.float16).reshape(blocks, *param_shape)
    return codes, scale, zero


def quantize_key_blocks(keys: torch.Tensor) -> torch.Tensor:
    """Pack blocks of keys per channel.

    Parameters
    ----------
    keys : Tensor
        ``(blocks, BLOCK_TOKENS, heads, head_dim)``, any float dtype (partial blocks padded with
        :func:`pad_block`).

    Returns
    -------
    Tensor
        ``(blocks, packed_block_bytes(heads, head_dim))`` uint8.
    """
    check_head_dim(keys.shape[3])
    return _serialize(*_quantize_groups(keys.permute(0, 2, 3, 1)))  # groups: (blocks, heads, head_dim) over tokens


def dequantize_key_blocks(packed: torch.Tensor, heads: int, head_dim: int) -> torch.Tensor:
    """``(blocks, packed_block_bytes)`` uint8 -> ``(blocks, BLOCK_TOKENS, heads, head_dim)`` float32."""
    codes, scale, zero = _deserialize(packed, (heads, head_dim, BLOCK_TOKENS), (heads, head_dim))
    keys = codes.float() * scale.float().unsqueeze(-1) + zero.float().unsqueeze(-1)
    return keys.permute(0, 3, 1, 2)


def quantize_value_blocks(values: torch.Tensor) -> torch.Tensor:
    """Pack blocks of values per token, in groups of :data:`GROUP_CHANNELS` channels.

    Parameters
    ----------
    values : Tensor
        ``(blocks, BLOCK_TOKENS, heads, head_dim)``, any float dtype.

    Returns
    -------
    Tensor
        ``(blocks, packed_block_bytes(heads, head_dim))`` uint8.
    """
    blocks, tokens, heads, head_dim = values.shape
    check_head_dim(head_dim)
    codes, scale, zero = _quantize_groups(values.reshape(blocks, tokens, heads, head_dim // GROUP_CHANNELS,
                                                         GROUP_CHANNELS))
    return _serialize(codes.reshape(blocks, tokens, heads, head_dim), scale, zero)


def dequantize_value_blocks(packed: torch.Tensor, heads: int, head_dim: int) -> torch.Tensor:
    """``(blocks, packed_block_bytes)`` uint8 -> ``(blocks, BLOCK_TOKENS, heads, head_dim)`` float32."""
    groups = head_dim // GROUP_CHANNELS
    codes, scale, zero = _deserialize(packed, (BLOCK_TOKENS, heads, head_dim), (BLOCK_TOKENS, heads, groups, 1))
    grouped = codes.reshape(-1, BLOCK_TOKENS, heads, groups, GROUP_CHANNELS)
    return (grouped.float() * scale.float() + zero.float()).reshape(-1, BLOCK_TOKENS, heads, head_dim)
