"""The window-score Triton kernels against their torch reference, on CPU under ``TRITON_INTERPRET=1``.

Triton reads ``TRITON_INTERPRET`` when it is imported and when kernels are decorated, so the Triton
side runs in one child process (this file run as a script) started with ``TRITON_INTERPRET=1``; the
pytest process, later tests and the servers they spawn keep their environment. The reference runs
here. Inputs are fresh random data on every run; a failure names the seed, and
``WINDOW_SCORES_SEED=<seed>`` replays it.
"""

from __future__ import annotations

import os
import secrets
import sys
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import pytest
import torch
from interpreter_child import run_in_interpreter

from sglang_pask.kernels.window_scores import (
    SCORE_TOLERANCES,
    sum_kv_heads,
    window_scores_reference,
    window_scores_triton,
)

SEED = int(os.environ.get("WINDOW_SCORES_SEED", secrets.randbits(31)))
KERNEL_NAMES = ("_split_stats_kernel", "_combine_stats_kernel", "_scores_kernel")


@dataclass(frozen=True)
class Case:
    """One batch: sequence lengths, window, kv heads, GQA group, head dim, dtype, and layout options."""

    lengths: tuple[int, ...]
    window: int
    num_kv_heads: int
    group: int
    head_dim: int
    dtype: torch.dtype
    spare_slots: int = 0
    strided_q: bool = False
    scale: float | None = None
    index_dtype: torch.dtype = torch.int32

    def __str__(self) -> str:
        return (
            f"L{'-'.join(map(str, self.lengths))}_w{self.window}_kv{self.num_kv_heads}_g{self.group}"
            f"_d{self.head_dim}_{str(self.dtype).removeprefix('torch.')}"
        )


def random_case(seed: int) -> Case:
    """A shape drawn from ``seed``: 1-4 sequences of 0-300 tokens, window 1/8/16, GQA group 1/2/4."""
    gen = torch.Generator().manual_seed(seed)

    def pick(options: tuple[Any, ...]) -> Any:
        return options[int(torch.randint(len(options), (1,), generator=gen))]

    lengths = tuple(torch.randint(0, 301, (pick((1, 2, 3, 4)),), generator=gen).tolist())
    return Case(
        lengths,
        pick((1, 8, 16)),
        pick((1, 2)),
        pick((1, 2, 4)),
        pick((16, 32, 64)),
        pick((torch.float32, torch.bfloat16)),
    )


CASES = [
    Case((5,), 8, 1, 1, 16, torch.float32),  # L < window: only 5 query rows exist
    Case((64, 1, 8), 8, 2, 2, 32, torch.float32, spare_slots=7),  # L = one tile, L = 1, L = window
    Case((100, 37), 8, 2, 4, 64, torch.bfloat16, strided_q=True),  # L not a multiple of the tile
    Case((200, 3, 129), 20, 2, 4, 16, torch.bfloat16),  # 80 query rows: two row blocks; split key tiles
    # one sequence, three key tiles in three splits; int64 indices
    Case((150,), 4, 4, 1, 32, torch.float16, scale=0.3, index_dtype=torch.int64),
    Case((0, 70), 8, 1, 2, 16, torch.float32),  # an empty sequence in the batch
    random_case(SEED),
]


def make_inputs(case: Case, seed: int) -> dict[str, Any]:
    """Keyword arguments of the window-score functions: random queries and a token pool larger than the
    batch, each sequence's keys at shuffled slots."""
    gen = torch.Generator().manual_seed(seed)
    total = sum(case.lengths)
    pool_size = total + case.spare_slots + 11
    k_buffer = torch.randn(pool_size, case.num_kv_heads, case.head_dim, generator=gen).to(case.dtype)
    q_shape = (len(case.lengths), case.window, case.num_kv_heads * case.group)
    q_wide = torch.randn(*q_shape, 2 * case.head_dim, generator=gen).to(case.dtype)
    q = q_wide[..., 1::2] if case.strided_q else q_wide[..., : case.head_dim].contiguous()
    kv_indices = torch.randperm(pool_size, generator=gen)[: total + case.spare_slots].to(case.index_dtype)
    kv_indptr = torch.tensor((0, *case.lengths)).cumsum(0).to(case.index_dtype)
    return {"q": q, "k_buffer": k_buffer, "kv_indptr": kv_indptr, "kv_indices": kv_indices, "scale": case.scale}


def spans(kv_indptr: torch.Tensor) -> list[tuple[int, int]]:
    """``(start, end)`` of each sequence's columns."""
    offsets = kv_indptr.tolist()
    return list(pairwise(offsets))


@pytest.fixture(scope="module")
def interpreted() -> dict[str, Any]:
    """Inputs of every case and the interpreted Triton scores for them, from one child process."""
    inputs = [make_inputs(case, SEED + i) for i, case in enumerate(CASES)]
    return {"inputs": inputs, **run_in_interpreter(__file__, inputs, SEED)}


def test_kernels_ran_in_the_interpreter(interpreted: dict[str, Any]) -> None:
    assert interpreted["kernel_types"] == ["InterpretedFunction"] * len(KERNEL_NAMES)


@pytest.mark.parametrize("index", range(len(CASES)), ids=[str(case) for case in CASES])
def test_triton_matches_reference(interpreted: dict[str, Any], index: int) -> None:
    case, inputs, got = CASES[index], interpreted["inputs"][index], interpreted["outputs"][index]
    expected = window_scores_reference(**inputs)
    tol = SCORE_TOLERANCES[case.dtype]
    assert got.shape == expected.shape == (case.num_kv_heads, inputs["kv_indices"].shape[0])
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, expected, atol=tol, rtol=tol, msg=lambda m: f"seed {SEED}: {m}")
    torch.testing.assert_close(sum_kv_heads(got), expected.sum(dim=0), atol=tol * case.num_kv_heads, rtol=tol)
    check_mass(got, inputs["kv_indptr"], case)


def check_mass(scores: torch.Tensor, kv_indptr: torch.Tensor, case: Case) -> None:
    """Each existing query row's softmax sums to 1: per sequence and kv head the scores sum to
    ``min(L, window) * group`` (``window * group`` when ``L >= window``); spare columns stay 0."""
    assert (scores >= 0).all(), f"seed {SEED}: negative score"
    for (start, end), length in zip(spans(kv_indptr), case.lengths):
        mass = scores[:, start:end].sum(dim=1)
        expected = torch.full_like(mass, min(length, case.window) * case.group)
        torch.testing.assert_close(mass, expected, atol=1e-3, rtol=1e-4, msg=lambda m: f"seed {SEED}: {m}")
    assert not scores[:, int(kv_indptr[-1]) :].any()


def test_reference_matches_row_by_row_softmax() -> None:
    """The reference against the definition, one query row and one query head at a time."""
    case = Case((13, 4), 6, 2, 2, 16, torch.float32)
    inputs = make_inputs(case, SEED)
    q, k_buffer, kv_indices = inputs["q"], inputs["k_buffer"], inputs["kv_indices"]
    got = window_scores_reference(q, k_buffer, inputs["kv_indptr"], kv_indices)
    for b, (start, end) in enumerate(spans(inputs["kv_indptr"])):
        keys = k_buffer[kv_indices[start:end].long()]
        expected = torch.zeros(case.num_kv_heads, end - start)
        for i in range(case.window):
            visible = end - start - case.window + i + 1  # keys 0 .. position; none before the sequence
            for head in range(case.num_kv_heads * case.group if visible > 0 else 0):
                kv_head = head // case.group
                logits = keys[:visible, kv_head] @ q[b, i, head] * case.head_dim**-0.5
                expected[kv_head, :visible] += torch.softmax(logits, dim=0)
        torch.testing.assert_close(got[:, start:end], expected, msg=lambda m: f"seed {SEED}: {m}")


def test_bad_inputs_are_rejected() -> None:
    inputs = make_inputs(CASES[1], SEED)
    q, k_buffer, kv_indptr, kv_indices = inputs["q"], inputs["k_buffer"], inputs["kv_indptr"], inputs["kv_indices"]
    with pytest.raises(ValueError, match="dtype"):
        window_scores_triton(q.half(), k_buffer, kv_indptr, kv_indices)
    with pytest.raises(ValueError, match="multiple"):
        window_scores_triton(q[:, :, :3], k_buffer, kv_indptr, kv_indices)
    with pytest.raises(ValueError, match="kv_indptr"):
        window_scores_reference(q, k_buffer, kv_indptr[:-1], kv_indices)


def _interpreter_main(src: str, dst: str) -> None:
    """Child process: run the Triton launcher on each batch of ``src`` and save the scores to ``dst``."""
    from sglang_pask.kernels import window_scores

    kernel_types = [type(getattr(window_scores, name)).__name__ for name in KERNEL_NAMES]
    outputs = [window_scores.window_scores_triton(**batch) for batch in torch.load(src)]
    torch.save({"kernel_types": kernel_types, "outputs": outputs}, dst)


if __name__ == "__main__":
    _interpreter_main(*sys.argv[1:])
