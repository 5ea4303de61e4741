"""The skeleton gather/scatter Triton kernels against their torch references, on CPU under ``TRITON_INTERPRET=1``.

Triton reads ``TRITON_INTERPRET`` when it is imported and when kernels are decorated, so the Triton
side runs in one child process (this file run as a script) started with ``TRITON_INTERPRET=1``; the
pytest process keeps its environment. The references and the selection builders run here. The kernels
copy, so their results must equal the references bit for bit. Inputs are fresh random data on every
run; a failure names the seed, and ``SKELETON_GATHER_SEED=<seed>`` replays it.
"""

from __future__ import annotations

import math
import os
import secrets
import sys
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import pytest
import torch
from interpreter_child import run_in_interpreter

from sglang_pask.kernels.skeleton_gather import (
    BLOCK_D,
    skeleton_from_mask,
    skeleton_from_scores,
    skeleton_gather_reference,
    skeleton_gather_triton,
    skeleton_scatter_reference,
    skeleton_scatter_triton,
    validate_skeleton,
)
from sglang_pask.structkv import select_skeleton

SEED = int(os.environ.get("SKELETON_GATHER_SEED", secrets.randbits(31)))
KERNEL_NAMES = ("_gather_kernel", "_scatter_kernel")
FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@dataclass(frozen=True)
class Case:
    """One packed batch and its selection: by score (``ratio`` and ``window``) or, when ``mask_prob`` is
    set, a random mask keeping each token with that probability; plus layout options."""

    lengths: tuple[int, ...]
    dim: int
    dtype: torch.dtype
    ratio: float = 0.2
    window: int = 8
    mask_prob: float | None = None
    residual_dtype: torch.dtype | None = None
    strided: bool = False
    padding_rows: int = 0
    index_dtype: torch.dtype = torch.int32

    def __str__(self) -> str:
        keep = f"mask{self.mask_prob}" if self.mask_prob is not None else f"r{self.ratio}_w{self.window}"
        return f"L{'-'.join(map(str, self.lengths))}_d{self.dim}_{str(self.dtype).removeprefix('torch.')}_{keep}"


def random_case(seed: int) -> Case:
    """A batch drawn from ``seed``: 1-4 sequences of 0, 1 or up to 120 tokens, D in 16..256, any dtype,
    a score or mask selection."""
    gen = torch.Generator().manual_seed(seed)

    def pick(options: tuple[Any, ...]) -> Any:
        return options[int(torch.randint(len(options), (1,), generator=gen))]

    def length() -> int:
        return pick((0, 1, int(torch.randint(2, 121, (1,), generator=gen))))

    lengths = tuple(length() for _ in range(pick((1, 2, 3, 4))))
    return Case(
        lengths,
        int(torch.randint(16, 257, (1,), generator=gen)),
        pick(FLOAT_DTYPES),
        ratio=pick((0.0, 0.2, 0.5, 1.0)),
        window=pick((0, 1, 8)),
        mask_prob=pick((None, 0.3)),
        residual_dtype=pick((None, torch.float32, torch.bfloat16)),
        strided=pick((False, True)),
        padding_rows=pick((0, 3)),
        index_dtype=pick((torch.int32, torch.int64)),
    )


CASES = [
    # empty and one-token sequences, D below one tile; a float32 residual beside bfloat16 hidden states
    Case((5, 0, 1, 37), 100, torch.bfloat16, ratio=0.3, window=2, residual_dtype=torch.float32),
    Case((64, 29), 200, torch.float16, ratio=1.0, window=8),  # keep everything: the identity; two D tiles
    Case((3, 40), 130, torch.float32, ratio=0.0, window=0),  # nothing kept anywhere
    Case((0, 0), 16, torch.bfloat16, ratio=0.5, window=1),  # a batch without tokens
    # random mask, strided inputs, padding rows past the batch, int64 offsets
    Case(
        (17, 1, 90, 33),
        255,
        torch.float32,
        mask_prob=0.4,
        residual_dtype=torch.bfloat16,
        strided=True,
        padding_rows=5,
        index_dtype=torch.int64,
    ),
    Case((1,), 16, torch.float16, ratio=1.0, window=1),  # a single token
    Case((0, 1, 0, 7, 2, 0, 0, 13, 1), 48, torch.bfloat16, ratio=0.5, window=1),  # 9 sequences: 4 search steps
    random_case(SEED),
    random_case(SEED + 1),
]


def make_inputs(case: Case, seed: int) -> dict[str, Any]:
    """Keyword arguments of the gather functions: random hidden states (and residual) over the packed
    batch plus padding rows, positions that continue a random cached prefix per sequence, and the case's
    selection."""
    gen = torch.Generator().manual_seed(seed)
    total = sum(case.lengths)
    rows = total + case.padding_rows

    def matrix(dtype: torch.dtype) -> torch.Tensor:
        wide = torch.randn(rows, 2 * case.dim, generator=gen).to(dtype)
        return wide[:, 1::2] if case.strided else wide[:, : case.dim].contiguous()

    extend_indptr = torch.tensor((0, *case.lengths)).cumsum(0)
    prefixes = torch.randint(0, 50, (len(case.lengths),), generator=gen)
    positions = torch.cat(
        [prefix + torch.arange(length) for prefix, length in zip(prefixes.tolist(), case.lengths)]
        + [torch.zeros(case.padding_rows, dtype=torch.int64)]
    )
    if case.mask_prob is not None:
        keep_indices, keep_indptr = skeleton_from_mask(torch.rand(total, generator=gen) < case.mask_prob, extend_indptr)
    else:
        keep_indices, keep_indptr = skeleton_from_scores(
            torch.rand(total, generator=gen), extend_indptr, case.ratio, case.window
        )
    return {
        "hidden_states": matrix(case.dtype),
        "positions": positions,
        "extend_indptr": extend_indptr.to(case.index_dtype),
        "keep_indices": keep_indices.to(case.index_dtype),
        "keep_indptr": keep_indptr.to(case.index_dtype),
        "residual": None if case.residual_dtype is None else matrix(case.residual_dtype),
    }


def make_scatter(case: Case, rows: torch.Tensor, seed: int) -> dict[str, torch.Tensor]:
    """Arguments of the scatter functions: random source rows written at ``rows`` into a random buffer
    (column-strided when the case is)."""
    gen = torch.Generator().manual_seed(seed)
    wide = torch.randn(sum(case.lengths) + case.padding_rows, 2 * case.dim, generator=gen).to(case.dtype)
    out = wide[:, ::2] if case.strided else wide[:, : case.dim].contiguous()
    return {"src": torch.randn(rows.shape[0], case.dim, generator=gen).to(case.dtype), "rows": rows, "out": out}


def bits(t: torch.Tensor) -> torch.Tensor:
    """``t`` as integers of its element size, so that equality is bitwise."""
    return t.view({torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}[t.dtype])


def assert_bitwise(got: torch.Tensor, expected: torch.Tensor) -> None:
    assert got.shape == expected.shape and got.dtype == expected.dtype, (
        f"seed {SEED}: {got.dtype} {tuple(got.shape)} != {expected.dtype} {tuple(expected.shape)}"
    )
    if got.is_floating_point():
        got, expected = bits(got), bits(expected)
    assert torch.equal(got, expected), f"seed {SEED}: values differ"


@pytest.fixture(scope="module")
def interpreted() -> dict[str, Any]:
    """Inputs of every case, and the interpreted Triton results for them from one child process."""
    batches = []
    for i, case in enumerate(CASES):
        gather = make_inputs(case, SEED + 2 * i)
        rows = skeleton_gather_reference(**gather).rows
        batches.append({"gather": gather, "scatter": make_scatter(case, rows, SEED + 2 * i + 1)})
    return {"batches": batches, **run_in_interpreter(__file__, batches, SEED)}


def test_kernels_ran_in_the_interpreter(interpreted: dict[str, Any]) -> None:
    assert interpreted["kernel_types"] == ["InterpretedFunction"] * len(KERNEL_NAMES)


def expected_rows(inputs: dict[str, Any]) -> torch.Tensor:
    """Packed rows of the kept tokens, by the definition: ``extend_indptr[b] + keep_indices[k]``."""
    starts = inputs["extend_indptr"].tolist()
    spans = pairwise(inputs["keep_indptr"].tolist())
    return torch.cat(
        [torch.zeros(0, dtype=torch.int64)]
        + [starts[b] + inputs["keep_indices"][lo:hi].long() for b, (lo, hi) in enumerate(spans)]
    )


@pytest.mark.parametrize("index", range(len(CASES)), ids=[str(case) for case in CASES])
def test_gather_triton_equals_reference(interpreted: dict[str, Any], index: int) -> None:
    inputs, got = interpreted["batches"][index]["gather"], interpreted["outputs"][index]["gather"]
    expected = skeleton_gather_reference(**inputs)
    rows = expected_rows(inputs)
    assert_bitwise(expected.rows, rows)
    assert_bitwise(expected.hidden_states, inputs["hidden_states"][rows])
    assert_bitwise(expected.positions, inputs["positions"][rows])
    assert expected.indptr is inputs["keep_indptr"]
    for name in ("hidden_states", "positions", "rows", "indptr"):
        assert_bitwise(got[name], getattr(expected, name))
    if inputs["residual"] is None:
        assert got["residual"] is None
    else:
        assert_bitwise(expected.residual, inputs["residual"][rows])
        assert_bitwise(got["residual"], expected.residual)
    assert got["hidden_states"].is_contiguous()


@pytest.mark.parametrize("index", range(len(CASES)), ids=[str(case) for case in CASES])
def test_scatter_triton_equals_reference(interpreted: dict[str, Any], index: int) -> None:
    scatter = interpreted["batches"][index]["scatter"]
    expected = skeleton_scatter_reference(scatter["src"], scatter["rows"], scatter["out"].clone())
    assert_bitwise(interpreted["outputs"][index]["scatter"], expected)
    assert_bitwise(expected[scatter["rows"]], scatter["src"])


@pytest.mark.parametrize("index", range(len(CASES)), ids=[str(case) for case in CASES])
def test_round_trip_restores_rows(interpreted: dict[str, Any], index: int) -> None:
    """Gathering then scattering into a zero buffer restores exactly the kept rows (Triton and reference)."""
    inputs, got = interpreted["batches"][index]["gather"], interpreted["outputs"][index]["round_trip"]
    skeleton = skeleton_gather_reference(**inputs)
    expected = torch.zeros_like(inputs["hidden_states"])
    expected[skeleton.rows] = inputs["hidden_states"][skeleton.rows]
    assert_bitwise(got, expected)
    restored = skeleton_scatter_reference(
        skeleton.hidden_states, skeleton.rows, torch.zeros_like(inputs["hidden_states"])
    )
    assert_bitwise(restored, expected)


def test_full_ratio_is_identity() -> None:
    case = Case((7, 0, 1, 60), 24, torch.bfloat16, ratio=1.0, window=3, residual_dtype=torch.float32)
    inputs = make_inputs(case, SEED)
    assert_bitwise(inputs["keep_indices"], torch.cat([torch.arange(n) for n in case.lengths]).int())
    assert_bitwise(inputs["keep_indptr"], inputs["extend_indptr"])
    skeleton = skeleton_gather_reference(**inputs)
    assert_bitwise(skeleton.rows, torch.arange(sum(case.lengths)))
    assert_bitwise(skeleton.hidden_states, inputs["hidden_states"])
    assert_bitwise(skeleton.residual, inputs["residual"])
    assert_bitwise(skeleton.positions, inputs["positions"])


def test_empty_selection() -> None:
    case = Case((4, 0, 9), 20, torch.float16, ratio=0.0, window=0)
    inputs = make_inputs(case, SEED)
    assert inputs["keep_indices"].shape == (0,)
    assert inputs["keep_indptr"].tolist() == [0, 0, 0, 0]
    skeleton = skeleton_gather_reference(**inputs)
    assert skeleton.hidden_states.shape == (0, 20) and skeleton.positions.shape == skeleton.rows.shape == (0,)


@pytest.mark.parametrize("ratio, window", [(0.2, 8), (0.5, 1), (0.0, 4), (0.7, 0), (1.0, 0)])
def test_score_selection_keeps_window_and_top_scores(ratio: float, window: int) -> None:
    gen = torch.Generator().manual_seed(SEED)
    lengths = (10, 0, 1, 5, 83)
    extend_indptr = torch.tensor((0, *lengths)).cumsum(0).int()
    scores = torch.rand(sum(lengths), generator=gen)
    keep_indices, keep_indptr = skeleton_from_scores(scores, extend_indptr, ratio, window)
    validate_skeleton(extend_indptr, keep_indices, keep_indptr)
    starts = extend_indptr.tolist()
    for b, (lo, hi) in enumerate(pairwise(keep_indptr.tolist())):
        length = lengths[b]
        body = max(length - window, 0)
        kept = set(keep_indices[lo:hi].tolist())
        assert set(range(body, length)) <= kept, f"seed {SEED}: window not kept in sequence {b}"
        chosen = sorted(kept - set(range(body, length)))
        assert len(chosen) == min(math.floor(ratio * length + 1e-9), body), f"seed {SEED}: sequence {b}"
        dropped = sorted(set(range(body)) - set(chosen))
        body_scores = scores[starts[b] : starts[b] + body]
        if chosen and dropped:
            assert body_scores[chosen].min() >= body_scores[dropped].max(), f"seed {SEED}: sequence {b}"


def test_score_ties_go_to_the_earlier_token_and_float_error_is_absorbed() -> None:
    keep_indices, keep_indptr = skeleton_from_scores(torch.ones(100), torch.tensor([0, 100]), 0.29, 0)
    assert keep_indices.tolist() == list(range(29)) and keep_indptr.tolist() == [0, 29]


@pytest.mark.parametrize("ratio, window", [(0.2, 8), (0.29, 1), (0.5, 3), (1.0, 8)])
def test_score_selection_is_select_skeleton_per_sequence(ratio: float, window: int) -> None:
    """The packed builder agrees with StructKV's per-prompt selection, sequence by sequence."""
    gen = torch.Generator().manual_seed(SEED)
    lengths = (100, 1, 0, 7, 64)
    extend_indptr = torch.tensor((0, *lengths)).cumsum(0)
    scores = torch.randint(0, 5, (sum(lengths),), generator=gen).float()  # many ties
    keep_indices, keep_indptr = skeleton_from_scores(scores, extend_indptr, ratio, window)
    for b, ((start, end), (lo, hi)) in enumerate(zip(pairwise(extend_indptr.tolist()), pairwise(keep_indptr.tolist()))):
        expected = select_skeleton(scores[start:end], ratio, window)
        assert keep_indices[lo:hi].tolist() == expected.tolist(), f"seed {SEED}: sequence {b}"


def test_mask_selection_matches_nonzero() -> None:
    gen = torch.Generator().manual_seed(SEED)
    lengths = (6, 0, 1, 31)
    extend_indptr = torch.tensor((0, *lengths)).cumsum(0)
    mask = torch.rand(sum(lengths), generator=gen) < 0.5
    keep_indices, keep_indptr = skeleton_from_mask(mask, extend_indptr)
    validate_skeleton(extend_indptr, keep_indices, keep_indptr)
    for b, ((start, end), (lo, hi)) in enumerate(zip(pairwise(extend_indptr.tolist()), pairwise(keep_indptr.tolist()))):
        assert keep_indices[lo:hi].tolist() == mask[start:end].nonzero()[:, 0].tolist(), f"seed {SEED}: sequence {b}"


def test_malformed_selections_are_rejected() -> None:
    extend_indptr = torch.tensor([0, 4, 4, 7])
    good = {"keep_indices": torch.tensor([0, 2, 3, 1, 2]), "keep_indptr": torch.tensor([0, 3, 3, 5])}
    hidden, positions = torch.randn(7, 16), torch.arange(7)
    validate_skeleton(extend_indptr, **good)
    malformed = [
        ({"keep_indices": torch.tensor([0, 3, 2, 1, 2])}, "not strictly increasing"),
        ({"keep_indices": torch.tensor([0, 2, 2, 1, 2])}, "not strictly increasing"),
        ({"keep_indices": torch.tensor([0, 2, 4, 1, 2])}, "out of range for sequence 0"),
        ({"keep_indices": torch.tensor([0, 2, 3, 1, 3])}, "out of range for sequence 2"),
        ({"keep_indices": torch.tensor([-1, 2, 3, 1, 2])}, "out of range"),
        ({"keep_indptr": torch.tensor([0, 3, 3, 4])}, "keep_indptr ends at 4"),
        ({"keep_indptr": torch.tensor([0, 3, 5])}, "same batch|like extend_indptr"),
        ({"keep_indptr": torch.tensor([1, 3, 3, 5])}, "start at 0"),
        ({"keep_indptr": torch.tensor([0, 3, 2, 5])}, "non-decreasing"),
        ({"keep_indptr": torch.tensor([0.0, 3.0, 3.0, 5.0])}, "int32 or int64"),
    ]
    for change, message in malformed:
        selection = {**good, **change}
        with pytest.raises(ValueError, match=message):
            validate_skeleton(extend_indptr, **selection)
        with pytest.raises(ValueError, match=message):
            skeleton_gather_reference(hidden, positions, extend_indptr, **selection)
    with pytest.raises(ValueError, match="extend_indptr must start at 0"):
        skeleton_gather_reference(hidden, positions, torch.tensor([1, 4, 4, 7]), **good)


def test_bad_tensors_are_rejected() -> None:
    extend_indptr, keep_indices, keep_indptr = torch.tensor([0, 4]), torch.tensor([1, 3]), torch.tensor([0, 2])
    hidden, positions = torch.randn(4, 16), torch.arange(4)
    for fn in (skeleton_gather_reference, skeleton_gather_triton):
        with pytest.raises(ValueError, match="hidden_states"):
            fn(hidden.long(), positions, extend_indptr, keep_indices, keep_indptr)
        with pytest.raises(ValueError, match="positions"):
            fn(hidden, positions.float(), extend_indptr, keep_indices, keep_indptr)
        with pytest.raises(ValueError, match="residual"):
            fn(hidden, positions, extend_indptr, keep_indices, keep_indptr, residual=hidden[:3])
        with pytest.raises(ValueError, match="keep_indices"):
            fn(hidden, positions, extend_indptr, keep_indices[None], keep_indptr)
    rows = torch.tensor([1, 3])
    for fn in (skeleton_scatter_reference, skeleton_scatter_triton):
        with pytest.raises(ValueError, match="src"):
            fn(hidden[:2].half(), rows, hidden)
        with pytest.raises(ValueError, match="rows"):
            fn(hidden[:2], rows[:1], hidden)
    with pytest.raises(ValueError, match="must lie in 0 .. 3"):
        skeleton_scatter_reference(hidden[:2], torch.tensor([1, 4]), hidden)


def test_bad_builder_inputs_are_rejected() -> None:
    extend_indptr = torch.tensor([0, 3, 5])
    with pytest.raises(ValueError, match="bool"):
        skeleton_from_mask(torch.ones(5), extend_indptr)
    with pytest.raises(ValueError, match="extend_indptr ends at 5 but mask has 6"):
        skeleton_from_mask(torch.ones(6, dtype=torch.bool), extend_indptr)
    with pytest.raises(ValueError, match="non-decreasing"):
        skeleton_from_mask(torch.ones(5, dtype=torch.bool), torch.tensor([0, 6, 5]))
    with pytest.raises(ValueError, match="extend_indptr ends at 5 but scores has 4"):
        skeleton_from_scores(torch.rand(4), extend_indptr, 0.2, 1)
    with pytest.raises(ValueError, match="NaN"):
        skeleton_from_scores(torch.tensor([0.1, float("nan"), 0.3, 0.4, 0.5]), extend_indptr, 0.2, 1)
    with pytest.raises(ValueError, match="floating"):
        skeleton_from_scores(torch.arange(5), extend_indptr, 0.2, 1)
    with pytest.raises(ValueError, match="ratio"):
        skeleton_from_scores(torch.rand(5), extend_indptr, 1.5, 1)
    with pytest.raises(ValueError, match="window"):
        skeleton_from_scores(torch.rand(5), extend_indptr, 0.2, -1)


def test_cases_cover_partial_and_multiple_tiles() -> None:
    dims = {case.dim for case in CASES}
    assert any(d < BLOCK_D for d in dims) and any(d > BLOCK_D and d % BLOCK_D for d in dims)


def _interpreter_main(src: str, dst: str) -> None:
    """Child process: run the Triton gather, scatter and round trip on each batch of ``src``; save to ``dst``."""
    from sglang_pask.kernels import skeleton_gather

    kernel_types = [type(getattr(skeleton_gather, name)).__name__ for name in KERNEL_NAMES]
    outputs = []
    for batch in torch.load(src):
        gathered = skeleton_gather.skeleton_gather_triton(**batch["gather"])
        scatter = batch["scatter"]
        round_trip = skeleton_gather.skeleton_scatter_triton(
            gathered.hidden_states, gathered.rows, torch.zeros_like(batch["gather"]["hidden_states"])
        )
        outputs.append(
            {
                "gather": gathered._asdict(),
                "scatter": skeleton_gather.skeleton_scatter_triton(scatter["src"], scatter["rows"], scatter["out"]),
                "round_trip": round_trip,
            }
        )
    torch.save({"kernel_types": kernel_types, "outputs": outputs}, dst)


if __name__ == "__main__":
    _interpreter_main(*sys.argv[1:])
