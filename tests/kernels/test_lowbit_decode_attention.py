"""The fused low-bit decode attention kernel against its torch reference, on CPU under ``TRITON_INTERPRET=1``.

The Triton side runs in one child process (this file run as a script, :mod:`interpreter_child`); the
reference runs here. Blocks are made the way the layer-group pool makes them
(:mod:`sglang_pask.kernels.kv_lowbit`, bytes written into free slots of the same buffers). Inputs are
fresh random data on every run; a failure names the seed, and ``LOWBIT_DECODE_SEED=<seed>`` replays it.
"""

from __future__ import annotations

import os
import secrets
import sys
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from interpreter_child import run_in_interpreter

from sglang_pask.kernels.kv_lowbit import (
    BLOCK_TOKENS,
    pad_block,
    quantize_key_blocks,
    quantize_value_blocks,
    rows_per_block,
)
from sglang_pask.kernels.lowbit_decode_attention import (
    lowbit_decode_attention_reference,
    lowbit_decode_attention_triton,
)

SEED = int(os.environ.get("LOWBIT_DECODE_SEED", secrets.randbits(31)))
KERNEL_NAMES = ("_decode_stage1", "_decode_stage2")


@dataclass(frozen=True)
class Case:
    """One batch: per request its full-precision tokens and its low-bit tokens (placed in blocks of 32,
    the last one partial), plus heads, head dim, widths and splits. ``foreign`` places of each block
    belong to no request of the batch (another request's or freed), so the mask leaves them out."""

    full: tuple[int, ...]
    lowbit: tuple[int, ...]
    kv_heads: int
    group: int
    head_dim: int
    key_bits: int
    value_bits: int
    splits: int = 4
    foreign: int = 0

    def __str__(self) -> str:
        return (
            f"F{'-'.join(map(str, self.full))}_L{'-'.join(map(str, self.lowbit))}_kv{self.kv_heads}"
            f"_g{self.group}_d{self.head_dim}_k{self.key_bits}v{self.value_bits}_s{self.splits}_f{self.foreign}"
        )


CASES = [
    Case((40, 7), (70, 0), 2, 2, 32, 2, 2),  # ragged rows; a row with no low-bit part; a partial last block
    Case((0, 33), (64, 5), 1, 4, 64, 4, 2, splits=2),  # a row with only low-bit tokens (k4v2: keys cross into V rows)
    Case((100,), (96,), 2, 1, 32, 4, 2, splits=8, foreign=5),  # blocks shared with tokens the row does not read
    Case((3, 1, 50), (31, 1, 33), 1, 2, 32, 2, 2, splits=1),  # one split; blocks of 1 and 31 tokens
]


def make_inputs(case: Case, seed: int) -> dict[str, Any]:
    """Arguments of the decode functions: float32 buffers (the interpreter computes bf16 wrongly) with
    each request's full tokens at shuffled slots and its low-bit tokens packed into blocks in other slots."""
    gen = torch.Generator().manual_seed(seed)
    heads, dim = case.kv_heads, case.head_dim
    rows = rows_per_block(case.key_bits, case.value_bits, 4)
    per_block = BLOCK_TOKENS - case.foreign
    block_counts = [-(-n // per_block) for n in case.lowbit]
    total_slots = sum(case.full) + rows * sum(block_counts) + 9
    k_buffer = torch.randn(total_slots, heads, dim, generator=gen)
    v_buffer = torch.randn(total_slots, heads, dim, generator=gen)
    free = torch.randperm(total_slots, generator=gen)
    kv_indices, block_slots, block_masks = [], [], []
    used = 0
    for n_full, n_low in zip(case.full, case.lowbit):
        kv_indices.append(free[used : used + n_full])
        used += n_full
        for start in range(0, n_low, per_block):
            mine = min(per_block, n_low - start)
            tokens_k = torch.randn(mine + case.foreign, heads, dim, generator=gen) * 2 + 0.5
            tokens_v = torch.randn(mine + case.foreign, heads, dim, generator=gen)
            slots = free[used : used + rows]
            used += rows
            packed = torch.cat(
                (
                    quantize_key_blocks(pad_block(tokens_k)[None], case.key_bits),
                    quantize_value_blocks(pad_block(tokens_v)[None], case.value_bits),
                ),
                dim=1,
            )
            halves = packed.view(2, -1)
            k_buffer[slots] = halves[0].view(torch.float32).reshape(rows, heads, dim)
            v_buffer[slots] = halves[1].view(torch.float32).reshape(rows, heads, dim)
            block_slots.append(slots)
            places = torch.randperm(mine + case.foreign, generator=gen)[:mine]  # the row's own places
            block_masks.append(int((1 << places).sum()))
    q = torch.randn(len(case.full), heads * case.group, dim, generator=gen)
    return {
        "q": q,
        "k_buffer": k_buffer,
        "v_buffer": v_buffer,
        "kv_indptr": torch.tensor((0, *case.full)).cumsum(0).to(torch.int32),
        "kv_indices": torch.cat(kv_indices).to(torch.int32),
        "block_indptr": torch.tensor((0, *block_counts)).cumsum(0).to(torch.int32),
        "block_slots": torch.stack(block_slots) if block_slots else torch.zeros((0, rows), dtype=torch.int64),
        "block_masks": torch.tensor(block_masks, dtype=torch.int64),
        "key_bits": case.key_bits,
        "value_bits": case.value_bits,
        "sm_scale": dim**-0.5,
    }


@pytest.fixture(scope="module")
def interpreted() -> dict[str, Any]:
    """Inputs of every case and the interpreted Triton outputs for them, from one child process."""
    inputs = [make_inputs(case, SEED + i) for i, case in enumerate(CASES)]
    splits = [case.splits for case in CASES]
    return {"inputs": inputs, **run_in_interpreter(__file__, {"inputs": inputs, "splits": splits}, SEED)}


def test_kernels_ran_in_the_interpreter(interpreted: dict[str, Any]) -> None:
    assert interpreted["kernel_types"] == ["InterpretedFunction"] * len(KERNEL_NAMES)


@pytest.mark.parametrize("index", range(len(CASES)), ids=[str(case) for case in CASES])
def test_triton_matches_reference(interpreted: dict[str, Any], index: int) -> None:
    inputs, got = interpreted["inputs"][index], interpreted["outputs"][index]
    expected = lowbit_decode_attention_reference(**inputs)
    assert got.shape == expected.shape == inputs["q"].shape
    torch.testing.assert_close(got, expected, atol=2e-4, rtol=2e-4, msg=lambda m: f"seed {SEED}: {m}")


def test_reference_reads_exactly_the_masked_places() -> None:
    """The reference equals plain softmax attention over the full tokens plus the dequantized places
    the masks name (and only those): a row of only foreign places reads nothing from its block."""
    from sglang_pask.kernels.kv_lowbit import dequantize_key_blocks, dequantize_value_blocks, packed_part_bytes
    from sglang_pask.kernels.lowbit_decode_attention import block_bytes

    case = CASES[2]
    inputs = make_inputs(case, SEED)
    got = lowbit_decode_attention_reference(**inputs)
    key_part = packed_part_bytes(case.kv_heads, case.head_dim, case.key_bits)
    raw = block_bytes(inputs["k_buffer"], inputs["v_buffer"], inputs["block_slots"])
    keys = dequantize_key_blocks(raw[:, :key_part], case.kv_heads, case.head_dim, case.key_bits)
    values = dequantize_value_blocks(raw[:, key_part:], case.kv_heads, case.head_dim, case.value_bits)
    places = [[p for p in range(BLOCK_TOKENS) if int(mask) >> p & 1] for mask in inputs["block_masks"]]
    assert [len(p) for p in places] == [27, 27, 27, 15]  # 96 tokens, 27 of each block's 32 places
    k = torch.cat([inputs["k_buffer"][inputs["kv_indices"].long()]] + [keys[i, p] for i, p in enumerate(places)])
    v = torch.cat([inputs["v_buffer"][inputs["kv_indices"].long()]] + [values[i, p] for i, p in enumerate(places)])
    for head in range(case.kv_heads * case.group):
        kv_head = head // case.group
        weights = torch.softmax(k[:, kv_head] @ inputs["q"][0, head] * inputs["sm_scale"], dim=0)
        torch.testing.assert_close(got[0, head], weights @ v[:, kv_head], msg=lambda m: f"seed {SEED}: {m}")


def test_bad_inputs_are_rejected() -> None:
    inputs = make_inputs(CASES[0], SEED)
    with pytest.raises(ValueError, match="take 4 slots, got 3"):
        lowbit_decode_attention_triton(**{**inputs, "key_bits": 4})
    with pytest.raises(ValueError, match="power-of-two head_dim"):
        lowbit_decode_attention_triton(**{**inputs, "q": inputs["q"][:, :3]})


def _interpreter_main(src: str, dst: str) -> None:
    """Child process: run the Triton launcher on each batch of ``src`` and save the outputs to ``dst``."""
    from sglang_pask.kernels import lowbit_decode_attention

    kernel_types = [type(getattr(lowbit_decode_attention, name)).__name__ for name in KERNEL_NAMES]
    data = torch.load(src)
    outputs = [
        lowbit_decode_attention.lowbit_decode_attention_triton(**batch, splits=splits)
        for batch, splits in zip(data["inputs"], data["splits"])
    ]
    torch.save({"kernel_types": kernel_types, "outputs": outputs}, dst)


if __name__ == "__main__":
    _interpreter_main(*sys.argv[1:])
