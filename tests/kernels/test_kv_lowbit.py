"""Low-bit KV blocks (kernels/kv_lowbit.py) at 2 and 4 bits against a direct elementwise reference, on fresh random data."""

from __future__ import annotations

import pytest
import torch

from sglang_pask.kernels import kv_lowbit as K
from sglang_pask.kernels.kv_lowbit import (
    BLOCK_TOKENS,
    GROUP_CHANNELS,
    dequantize_key_blocks,
    dequantize_value_blocks,
    packed_part_bytes,
    pad_block,
    quantize_key_blocks,
    quantize_value_blocks,
)


def fake_quantize(groups: torch.Tensor, bits: int) -> torch.Tensor:
    """Quantize and dequantize ``(..., n)`` at ``bits`` with one fp16 minimum and scale per
    last-dimension group (a group whose fp16 scale is 0 comes back as its minimum)."""
    levels = 2**bits - 1
    low = groups.amin(dim=-1, keepdim=True).half().float()
    high = groups.amax(dim=-1, keepdim=True)
    scale = ((high - groups.amin(dim=-1, keepdim=True)) / levels).half().float()
    codes = torch.where(scale > 0, ((groups - low) / scale.clamp_min(1e-30)).round().clamp(0, levels), 0.0)
    return codes * scale + low


def reference_keys(block: torch.Tensor, bits: int) -> torch.Tensor:
    """``(tokens, heads, head_dim)``: each channel of each head quantized over the block's tokens."""
    return fake_quantize(block.float().permute(1, 2, 0), bits).permute(2, 0, 1)


def reference_values(block: torch.Tensor, bits: int) -> torch.Tensor:
    """``(tokens, heads, head_dim)``: each token's head quantized in groups of GROUP_CHANNELS channels."""
    tokens, heads, head_dim = block.shape
    grouped = block.float().reshape(tokens, heads, head_dim // GROUP_CHANNELS, GROUP_CHANNELS)
    return fake_quantize(grouped, bits).reshape(tokens, heads, head_dim)


@pytest.mark.parametrize("bits", [2, 4])
@pytest.mark.parametrize("heads,head_dim", [(1, 32), (2, 64), (4, 128)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_blocks_dequantize_to_the_elementwise_reference(heads, head_dim, dtype, bits):
    blocks = torch.randint(1, 4, ()).item()
    keys = (torch.randn(blocks, BLOCK_TOKENS, heads, head_dim) * 4 + torch.randn(heads, head_dim)).to(dtype)
    values = torch.randn(blocks, BLOCK_TOKENS, heads, head_dim).to(dtype)
    packed_keys, packed_values = quantize_key_blocks(keys, bits), quantize_value_blocks(values, bits)
    assert packed_keys.dtype == torch.uint8 and packed_values.dtype == torch.uint8
    assert packed_keys.shape == packed_values.shape == (blocks, packed_part_bytes(heads, head_dim, bits))
    got_keys = dequantize_key_blocks(packed_keys, heads, head_dim, bits)
    got_values = dequantize_value_blocks(packed_values, heads, head_dim, bits)
    for b in range(blocks):
        torch.testing.assert_close(got_keys[b], reference_keys(keys[b], bits), rtol=0, atol=1e-5)
        torch.testing.assert_close(got_values[b], reference_values(values[b], bits), rtol=0, atol=1e-5)


@pytest.mark.parametrize("bits", [2, 4])
def test_error_is_within_half_a_step_of_each_group(bits):
    levels = 2**bits - 1
    keys = torch.randn(2, BLOCK_TOKENS, 2, 64) * 3
    values = torch.randn(2, BLOCK_TOKENS, 2, 64)
    key_step = (keys.amax(dim=1, keepdim=True) - keys.amin(dim=1, keepdim=True)) / levels
    grouped = values.reshape(2, BLOCK_TOKENS, 2, 2, GROUP_CHANNELS)
    value_step = ((grouped.amax(-1, keepdim=True) - grouped.amin(-1, keepdim=True)) / levels).expand_as(grouped)
    key_error = (dequantize_key_blocks(quantize_key_blocks(keys, bits), 2, 64, bits) - keys).abs()
    value_error = (dequantize_value_blocks(quantize_value_blocks(values, bits), 2, 64, bits) - values).abs()
    # Half a step, plus what the fp16 scale and minimum round away.
    assert bool((key_error <= key_step / 2 + 3e-3 * keys.abs().amax()).all())
    assert bool((value_error <= value_step.reshape_as(values) / 2 + 3e-3 * values.abs().amax()).all())


def test_four_bits_err_less_than_two():
    values = torch.randn(4, BLOCK_TOKENS, 2, 64)
    errors = {
        bits: (dequantize_value_blocks(quantize_value_blocks(values, bits), 2, 64, bits) - values).norm()
        for bits in (2, 4)
    }
    assert errors[4] < errors[2] / 3


def test_a_block_part_costs_three_or_five_sixteenths_of_its_bf16_bytes():
    heads, head_dim = 2, 64
    bf16_bytes = BLOCK_TOKENS * heads * head_dim * 2
    assert packed_part_bytes(heads, head_dim, 2) * 16 == bf16_bytes * 3
    assert packed_part_bytes(heads, head_dim, 4) * 16 == bf16_bytes * 5


def test_two_bit_codes_keep_their_byte_layout():
    # Code 4i + j in bits 2j of byte i (the layout every 2-bit block was written in).
    codes = torch.randint(0, 4, (3, 64), dtype=torch.uint8)
    packed = K._pack(codes, 2)
    expected = codes[:, 0::4] | codes[:, 1::4] << 2 | codes[:, 2::4] << 4 | codes[:, 3::4] << 6
    assert torch.equal(packed, expected)
    assert torch.equal(K._unpack(packed, 2), codes)
    four = torch.randint(0, 16, (3, 64), dtype=torch.uint8)
    assert torch.equal(K._unpack(K._pack(four, 4), 4), four)


@pytest.mark.parametrize("bits", [2, 4])
def test_a_padded_partial_block_quantizes_its_tokens_as_they_are(bits):
    m = int(torch.randint(1, BLOCK_TOKENS, ()).item())
    keys, values = torch.randn(m, 2, 32) * 2, torch.randn(m, 2, 32)
    got_keys = dequantize_key_blocks(quantize_key_blocks(pad_block(keys)[None], bits), 2, 32, bits)[0, :m]
    got_values = dequantize_value_blocks(quantize_value_blocks(pad_block(values)[None], bits), 2, 32, bits)[0, :m]
    torch.testing.assert_close(got_keys, reference_keys(keys, bits), rtol=0, atol=1e-5)
    torch.testing.assert_close(got_values, reference_values(values, bits), rtol=0, atol=1e-5)


@pytest.mark.parametrize("bits", [2, 4])
def test_constant_groups_come_back_exactly(bits):
    keys = torch.full((1, BLOCK_TOKENS, 1, 32), 1.5)
    packed = quantize_key_blocks(keys, bits)
    # Codes all 0 here (a scale of 0 must not divide 0 by 0: a NaN code is no code on every device).
    assert int(packed[0, : 32 * 32 * bits // 8].count_nonzero()) == 0
    assert torch.equal(dequantize_key_blocks(packed, 1, 32, bits), keys)
    # A one-token block (padded with copies of its token) is constant in every key channel.
    token = torch.randn(1, 2, 64)
    got = dequantize_key_blocks(quantize_key_blocks(pad_block(token)[None], bits), 2, 64, bits)[0, :1]
    torch.testing.assert_close(got, token.half().float(), rtol=0, atol=0)


def test_bad_shapes_and_widths_are_refused():
    with pytest.raises(ValueError, match="multiple of 32"):
        quantize_key_blocks(torch.zeros(1, BLOCK_TOKENS, 1, 48))
    with pytest.raises(ValueError, match="2 or 4 bits"):
        quantize_value_blocks(torch.zeros(1, BLOCK_TOKENS, 1, 32), 3)
    with pytest.raises(ValueError, match="1 to 32 tokens"):
        pad_block(torch.zeros(BLOCK_TOKENS + 1, 1, 32))
    with pytest.raises(ValueError, match="1 to 32 tokens"):
        pad_block(torch.zeros(0, 1, 32))
