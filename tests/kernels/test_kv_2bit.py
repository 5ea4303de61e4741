"""2-bit KV blocks (kernels/kv_2bit.py) against a direct elementwise reference, on fresh random data."""

from __future__ import annotations

import pytest
import torch

from sglang_pask.kernels.kv_2bit import (
    BLOCK_TOKENS,
    GROUP_CHANNELS,
    dequantize_key_blocks,
    dequantize_value_blocks,
    packed_block_bytes,
    pad_block,
    quantize_key_blocks,
    quantize_value_blocks,
)


def fake_quantize(groups: torch.Tensor) -> torch.Tensor:
    """Quantize and dequantize ``(..., n)`` with one fp16 minimum and scale per last-dimension group
    (a group whose fp16 scale is 0 comes back as its minimum)."""
    low = groups.amin(dim=-1, keepdim=True).half().float()
    high = groups.amax(dim=-1, keepdim=True)
    scale = ((high - groups.amin(dim=-1, keepdim=True)) / 3).half().float()
    codes = torch.where(scale > 0, ((groups - low) / scale.clamp_min(1e-30)).round().clamp(0, 3), 0.0)
    return codes * scale + low


def reference_keys(block: torch.Tensor) -> torch.Tensor:
    """``(tokens, heads, head_dim)``: each channel of each head quantized over the block's tokens."""
    return fake_quantize(block.float().permute(1, 2, 0)).permute(2, 0, 1)


def reference_values(block: torch.Tensor) -> torch.Tensor:
    """``(tokens, heads, head_dim)``: each token's head quantized in groups of GROUP_CHANNELS channels."""
    tokens, heads, head_dim = block.shape
    grouped = block.float().reshape(tokens, heads, head_dim // GROUP_CHANNELS, GROUP_CHANNELS)
    return fake_quantize(grouped).reshape(tokens, heads, head_dim)


@pytest.mark.parametrize("heads,head_dim", [(1, 32), (2, 64), (4, 128)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_blocks_dequantize_to_the_elementwise_reference(heads, head_dim, dtype):
    blocks = torch.randint(1, 4, ()).item()
    keys = (torch.randn(blocks, BLOCK_TOKENS, heads, head_dim) * 4 + torch.randn(heads, head_dim)).to(dtype)
    values = torch.randn(blocks, BLOCK_TOKENS, heads, head_dim).to(dtype)
    packed_keys, packed_values = quantize_key_blocks(keys), quantize_value_blocks(values)
    assert packed_keys.dtype == torch.uint8 and packed_values.dtype == torch.uint8
    assert packed_keys.shape == packed_values.shape == (blocks, packed_block_bytes(heads, head_dim))
    got_keys = dequantize_key_blocks(packed_keys, heads, head_dim)
    got_values = dequantize_value_blocks(packed_values, heads, head_dim)
    for b in range(blocks):
        torch.testing.assert_close(got_keys[b], reference_keys(keys[b]), rtol=0, atol=1e-5)
        torch.testing.assert_close(got_values[b], reference_values(values[b]), rtol=0, atol=1e-5)


def test_error_is_within_half_a_step_of_each_group():
    keys = torch.randn(2, BLOCK_TOKENS, 2, 64) * 3
    values = torch.randn(2, BLOCK_TOKENS, 2, 64)
    key_step = (keys.amax(dim=1, keepdim=True) - keys.amin(dim=1, keepdim=True)) / 3
    grouped = values.reshape(2, BLOCK_TOKENS, 2, 2, GROUP_CHANNELS)
    value_step = ((grouped.amax(-1, keepdim=True) - grouped.amin(-1, keepdim=True)) / 3).expand_as(grouped)
    key_error = (dequantize_key_blocks(quantize_key_blocks(keys), 2, 64) - keys).abs()
    value_error = (dequantize_value_blocks(quantize_value_blocks(values), 2, 64) - values).abs()
    # Half a step, plus what the fp16 scale and minimum round away.
    assert bool((key_error <= key_step / 2 + 3e-3 * keys.abs().amax()).all())
    assert bool((value_error <= value_step.reshape_as(values) / 2 + 3e-3 * values.abs().amax()).all())


def test_a_block_costs_three_sixteenths_of_its_bf16_bytes():
    heads, head_dim = 2, 64
    bf16_bytes = BLOCK_TOKENS * heads * head_dim * 2
    assert packed_block_bytes(heads, head_dim) * 16 == bf16_bytes * 3


def test_a_padded_partial_block_quantizes_its_tokens_as_they_are():
    m = int(torch.randint(1, BLOCK_TOKENS, ()).item())
    keys, values = torch.randn(m, 2, 32) * 2, torch.randn(m, 2, 32)
    got_keys = dequantize_key_blocks(quantize_key_blocks(pad_block(keys)[None]), 2, 32)[0, :m]
    got_values = dequantize_value_blocks(quantize_value_blocks(pad_block(values)[None]), 2, 32)[0, :m]
    torch.testing.assert_close(got_keys, reference_keys(keys), rtol=0, atol=1e-5)
    torch.testing.assert_close(got_values, reference_values(values), rtol=0, atol=1e-5)


def test_constant_groups_come_back_exactly():
    keys = torch.full((1, BLOCK_TOKENS, 1, 32), 1.5)
    packed = quantize_key_blocks(keys)
    # Codes all 0 here (a scale of 0 must not divide 0 by 0: a NaN code is no code on every device).
    assert int(packed[0, :32 * 32 // 4].count_nonzero()) == 0
    assert torch.equal(dequantize_key_blocks(packed, 1, 32), keys)
    # A one-token block (padded with copies of its token) is constant in every key channel.
    token = torch.randn(1, 2, 64)
    got = dequantize_key_blocks(quantize_key_blocks(pad_block(token)[None]), 2, 64)[0, :1]
    torch.testing.assert_close(got, token.half().float(), rtol=0, atol=0)


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError, match="multiple of 32"):
        quantize_key_blocks(torch.zeros(1, BLOCK_TOKENS, 1, 48))
    with pytest.raises(ValueError, match="1 to 32 tokens"):
        pad_block(torch.zeros(BLOCK_TOKENS + 1, 1, 32))
    with pytest.raises(ValueError, match="1 to 32 tokens"):
        pad_block(torch.zeros(0, 1, 32))
