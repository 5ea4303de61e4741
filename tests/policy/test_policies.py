"""KV policies (pure torch): one matrix over every registered policy, then each policy's semantics.

Random data is fresh on every run; the seed is printed (shown on failure) and can be replayed with
``POLICY_TEST_SEED=<seed>``.
"""

from __future__ import annotations

import ast
import itertools
import math
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from torch import Tensor

import sglang_pask.policy
from sglang_pask.policy import (
    FullPolicy,
    KVPolicy,
    available_policies,
    capacity,
    check_budget,
    extend_capacity,
    get_policy,
    plan_group_budgets,
    register_policy,
)
from sglang_pask.structure.roles import NUM_ROLES

BASELINES = {"full", "streaming-llm", "h2o", "snapkv", "pyramidkv"}
LAYERS_PER_GROUP = [3, 3, 2]


@pytest.fixture
def gen() -> torch.Generator:
    seed = int(os.environ.get("POLICY_TEST_SEED", secrets.randbits(31)))
    print(f"POLICY_TEST_SEED={seed}")
    return torch.Generator().manual_seed(seed)


def randint(gen: torch.Generator, low: int, high: int) -> int:
    """A random int in [low, high]."""
    return int(torch.randint(low, high + 1, (1,), generator=gen))


@dataclass
class Case:
    positions: Tensor  # (n,) int64, unique, shuffled
    roles: Tensor  # (n,) int64
    seq_len: int


def random_case(gen: torch.Generator, n: int) -> Case:
    """``n`` candidates at random distinct positions of a longer sequence, in random order."""
    seq_len = n + randint(gen, 0, n // 2 + 8)
    positions = torch.randperm(seq_len, generator=gen)[:n]
    return Case(positions, torch.randint(0, NUM_ROLES, (n,), generator=gen), seq_len)


def random_scores(gen: torch.Generator, policy: KVPolicy, n: int) -> Tensor | None:
    """Scores accumulated over two steps (coarse levels, so ties are common), or None."""
    if not policy.needs_scores:
        return None
    previous = torch.randint(0, 8, (randint(gen, 0, n),), generator=gen).float()
    return policy.accumulate_scores(previous, torch.randint(0, 8, (n,), generator=gen).float())


def assert_partition(keep: Tensor, evict: Tensor, n: int) -> None:
    for part in (keep, evict):
        assert part.dtype == torch.int64 and part.dim() == 1
        assert bool((part[1:] > part[:-1]).all()), "indices must be sorted and unique"
    assert torch.equal(torch.sort(torch.cat([keep, evict])).values, torch.arange(n))


# ----------------------------------------------------------------------------------------------
# The matrix: every registered policy, several sizes and budgets, every layer group.


@pytest.mark.parametrize("total_budget", [1.0, 0.33, 0.05])
@pytest.mark.parametrize("n", [0, 1, 9, 150, 2000])
@pytest.mark.parametrize("name", available_policies())
def test_policy_matrix(name: str, n: int, total_budget: float, gen: torch.Generator) -> None:
    policy = get_policy(name)
    window = randint(gen, 0, 40)
    for budget in policy.group_budgets(total_budget, len(LAYERS_PER_GROUP), LAYERS_PER_GROUP):
        case = random_case(gen, n)
        scores = random_scores(gen, policy, n)
        cap = capacity(budget, n, window, policy.reserved_tokens)
        keep, evict, _ = policy.select(case.positions, case.roles, scores, cap, window, case.seq_len)

        assert_partition(keep, evict, n)
        assert keep.numel() == min(cap, n) <= cap
        in_window = torch.nonzero(case.positions >= case.seq_len - window).flatten()
        assert bool(torch.isin(in_window, keep).all()), "the recent window must be kept"
        if name == "full":
            assert keep.numel() == n

        again = policy.select(
            case.positions.clone(),
            case.roles.clone(),
            None if scores is None else scores.clone(),
            cap,
            window,
            case.seq_len,
        )
        assert torch.equal(again.keep, keep) and torch.equal(again.evict, evict)


# ----------------------------------------------------------------------------------------------
# Per-policy semantics.


def test_full_keeps_everything_at_any_budget() -> None:
    policy = get_policy("full")
    assert policy.group_budgets(0.1, 3, LAYERS_PER_GROUP) == [1.0, 1.0, 1.0]
    positions = torch.arange(50)
    with pytest.raises(ValueError, match="'full' keeps every token.*capacity 49 for 50"):
        policy.select(positions, torch.zeros(50, dtype=torch.int64), None, 49, 8, 50)


@pytest.mark.parametrize("shuffle", [False, True])
def test_streaming_llm_keeps_sinks_then_most_recent(shuffle: bool, gen: torch.Generator) -> None:
    policy = get_policy("streaming-llm")
    assert policy.reserved_tokens == 4
    positions = torch.arange(200)
    if shuffle:
        positions = positions[torch.randperm(200, generator=gen)]
    cap = capacity(0.2, 200, 16, policy.reserved_tokens)
    keep = policy.select(positions, torch.zeros(200, dtype=torch.int64), None, cap, 16, 200).keep
    assert cap == 40
    assert sorted(positions[keep].tolist()) == [0, 1, 2, 3, *range(164, 200)]

    # Sinks in a shared prefix are not candidates: the capacity goes to the newest tokens.
    shared = torch.arange(10, 210)
    keep = policy.select(shared, torch.zeros(200, dtype=torch.int64), None, 40, 16, 210).keep
    assert shared[keep].tolist() == list(range(170, 210))

    no_sinks = get_policy("streaming-llm", num_sinks=0)
    keep = no_sinks.select(torch.arange(200), torch.zeros(200, dtype=torch.int64), None, 40, 16, 200).keep
    assert keep.tolist() == list(range(160, 200))


def test_h2o_keeps_the_heaviest_accumulated_hitters(gen: torch.Generator) -> None:
    """Decode steps as the pool drives them: accumulate, select, index the state with ``keep``."""
    policy = get_policy("h2o")
    window, budget = 8, 0.3
    positions = torch.arange(0)
    state: Tensor | None = None
    total: dict[int, float] = {}  # reference: attention summed per position
    for step in range(6):
        seq_len = 100 + 10 * step
        positions = torch.cat([positions, torch.arange(positions.numel() and int(positions.max()) + 1, seq_len)])
        new = torch.rand(positions.numel(), generator=gen, dtype=torch.float64)
        for pos, score in zip(positions.tolist(), new.tolist()):
            total[pos] = total.get(pos, 0.0) + score
        state = policy.accumulate_scores(state, new)
        assert torch.allclose(state, torch.tensor([total[p] for p in positions.tolist()], dtype=torch.float64))

        n = positions.numel()
        cap = capacity(budget, n, window)
        keep = policy.select(positions, torch.zeros(n, dtype=torch.int64), state, cap, window, seq_len).keep
        recent = {p for p in positions.tolist() if p >= seq_len - window}
        heavy = sorted((p for p in positions.tolist() if p not in recent), key=lambda p: -total[p])
        expected = recent | set(heavy[: min(cap, n) - len(recent)])
        assert set(positions[keep].tolist()) == expected
        positions, state = positions[keep], state[keep]


def test_h2o_accumulate_rejects_a_longer_history() -> None:
    with pytest.raises(ValueError, match="no longer than the new ones"):
        get_policy("h2o").accumulate_scores(torch.ones(5), torch.ones(4))


@pytest.mark.parametrize("name", ["snapkv", "pyramidkv"])
def test_snapkv_pooling_keeps_a_planted_cluster(name: str, gen: torch.Generator) -> None:
    n, window, peak = 300, 8, 100
    scores = torch.rand(n, generator=gen)
    scores[peak] = 5.0
    order = torch.randperm(n, generator=gen)  # candidates in any order: pooling follows positions
    positions, scores = torch.arange(n)[order], scores[order]
    roles = torch.zeros(n, dtype=torch.int64)
    cap = window + 7

    pooled = get_policy(name).select(positions, roles, scores, cap, window, n).keep
    assert sorted(positions[pooled].tolist()) == [*range(peak - 3, peak + 4), *range(n - window, n)]

    unpooled = get_policy(name, kernel_size=1).select(positions, roles, scores, cap, window, n).keep
    kept = set(positions[unpooled].tolist())
    assert peak in kept and not set(range(peak - 3, peak + 4)) <= kept


def test_snapkv_scores_are_the_latest_window() -> None:
    new = torch.tensor([0.5, 0.1, 0.9])
    assert get_policy("snapkv").accumulate_scores(torch.tensor([7.0, 7.0]), new) is new


@pytest.mark.parametrize("kernel_size", [0, 4])
def test_snapkv_rejects_even_or_empty_kernels(kernel_size: int) -> None:
    with pytest.raises(ValueError, match="kernel_size must be a positive odd number"):
        get_policy("snapkv", kernel_size=kernel_size)


@pytest.mark.parametrize("layers", [[1], [4], [3, 3, 2], [1, 5, 2, 8], [2] * 12, [1] * 36])
@pytest.mark.parametrize("total_budget", [0.02, 0.2, 0.33, 0.6, 0.9, 1.0])
def test_pyramidkv_budgets_fall_with_depth_and_average_to_the_total(layers: list[int], total_budget: float) -> None:
    budgets = get_policy("pyramidkv").group_budgets(total_budget, len(layers), layers)
    assert len(budgets) == len(layers)
    assert all(0.0 < b <= 1.0 for b in budgets)
    assert math.isclose(sum(b * c for b, c in zip(budgets, layers)) / sum(layers), total_budget, abs_tol=1e-12)
    if total_budget < 1.0 and len(layers) > 1:
        assert all(upper < lower for lower, upper in itertools.pairwise(budgets))
    else:
        assert budgets == pytest.approx([total_budget] * len(layers), abs=1e-12)


def test_pyramidkv_layer_budgets_follow_the_kvpress_formula() -> None:
    t, beta, num_layers = 0.25, 20.0, 5
    budgets = get_policy("pyramidkv", beta=beta).group_budgets(t, num_layers, [1] * num_layers)
    b_min, b_max = t / beta, 2 * t - t / beta
    assert budgets == pytest.approx([b_max - (b_max - b_min) * layer / (num_layers - 1) for layer in range(num_layers)])
    assert get_policy("pyramidkv", beta=1.0).group_budgets(t, 3, [3, 3, 2]) == pytest.approx([t] * 3)
    with pytest.raises(ValueError, match="beta must be at least 1"):
        get_policy("pyramidkv", beta=0.5)


def test_pyramidkv_selects_like_snapkv(gen: torch.Generator) -> None:
    case = random_case(gen, 500)
    scores = torch.rand(500, generator=gen)
    for cap in (20, 100, 400):
        args = (case.positions, case.roles, scores, cap, 16, case.seq_len)
        assert torch.equal(get_policy("pyramidkv").select(*args).keep, get_policy("snapkv").select(*args).keep)


# ----------------------------------------------------------------------------------------------
# Budgets.


@pytest.mark.parametrize(
    "budget, n, window, reserved, expected",
    [
        (0.33, 100, 8, 0, 33),
        (0.29, 100, 0, 0, 29),  # 0.29 * 100 == 28.999999999999996
        (0.05, 100, 8, 4, 12),  # the window and the sinks when the budget is smaller
        (0.5, 5, 8, 0, 5),  # never more than the candidates
        (1.0, 1234, 64, 4, 1234),
        (0.2, 0, 8, 0, 0),
    ],
)
def test_capacity(budget: float, n: int, window: int, reserved: int, expected: int) -> None:
    assert capacity(budget, n, window, reserved) == expected


@pytest.mark.parametrize(
    "budget, row, held, n, window, reserved, expected",
    [
        (0.33, 100, 0, 100, 8, 0, 33),  # one pass: capacity()
        (0.33, 100, 16, 50, 8, 0, 17),  # a second pass keeps what the row's budget leaves
        (0.02, 673, 5, 373, 8, 0, 8),  # a matched prefix already holds 5 of 13: the window
        (0.33, 50, 20, 30, 4, 0, 4),  # a prefix held beyond the budget: the window only
        (0.05, 60, 0, 60, 4, 4, 8),  # sinks among the candidates still take their place
        (0.5, 10, 0, 3, 8, 0, 3),  # never more than the candidates
    ],
)
def test_extend_capacity(budget: float, row: int, held: int, n: int, window: int, reserved: int, expected: int) -> None:
    assert extend_capacity(budget, row, held, n, window, reserved) == expected
    if held == 0 and row == n:
        assert expected == capacity(budget, n, window, reserved)


def test_extend_capacity_refuses_counts_that_do_not_fit_the_row() -> None:
    with pytest.raises(ValueError, match="held_before=10, num_tokens=95"):
        extend_capacity(0.3, 100, 10, 95, 8)
    with pytest.raises(ValueError, match="window=-1"):
        extend_capacity(0.3, 100, 0, 100, -1)


@pytest.mark.parametrize("budget", [0.0, -0.1, 1.5, math.nan, math.inf])
def test_budgets_outside_the_unit_interval_are_refused(budget: float) -> None:
    with pytest.raises(ValueError, match=r"KV budget must be in \(0, 1\]"):
        check_budget(budget, 8, 4096)
    with pytest.raises(ValueError, match=r"must be in \(0, 1\]"):
        capacity(budget, 100, 8)
    with pytest.raises(ValueError, match=r"total KV budget must be in \(0, 1\]"):
        get_policy("snapkv").group_budgets(budget, 1, [4])


def test_budget_too_small_for_the_window_names_the_numbers() -> None:
    check_budget(0.0167, 64, 4096, 4)
    with pytest.raises(ValueError) as err:
        check_budget(0.01, 64, 4096, 4)
    message = str(err.value)
    for part in ("0.01 keeps 40 of 4096 tokens", "64-token recent window", "4 reserved tokens (68 in all)", "0.0167"):
        assert part in message
    with pytest.raises(ValueError, match="no budget can hold it: the window must be at most 36 tokens"):
        check_budget(1.0, 64, 40, 4)
    with pytest.raises(ValueError, match="the reserved tokens \\(attention sinks\\) must be fewer than 40"):
        check_budget(1.0, 8, 40, 40)


def test_plan_group_budgets_checks_every_group() -> None:
    assert plan_group_budgets(get_policy("snapkv"), 0.33, LAYERS_PER_GROUP, 64, 4096) == [0.33] * 3
    pyramid = get_policy("pyramidkv")
    assert plan_group_budgets(pyramid, 0.33, LAYERS_PER_GROUP, 64, 4096) == pyramid.group_budgets(
        0.33, 3, LAYERS_PER_GROUP
    )
    with pytest.raises(ValueError, match=r"layer group 2 \(layers 6-7; policy 'pyramidkv', total budget 0.05\)"):
        plan_group_budgets(pyramid, 0.05, LAYERS_PER_GROUP, 64, 4096)
    with pytest.raises(ValueError, match="4 reserved tokens"):
        plan_group_budgets(get_policy("streaming-llm"), 0.01, [4], 64, 4096)


@pytest.mark.parametrize(
    "num_groups, layers, message",
    [(0, [], "at least 1"), (2, [4], "1 entries"), (2, [4, 0], "at least one layer")],
)
def test_bad_layer_splits_are_refused(num_groups: int, layers: list[int], message: str) -> None:
    for name in available_policies():
        with pytest.raises(ValueError, match=message):
            get_policy(name).group_budgets(0.5, num_groups, layers)


# ----------------------------------------------------------------------------------------------
# Input checks, registry, and the no-sglang rule.


def test_select_refuses_malformed_inputs() -> None:
    policy = get_policy("h2o")
    positions, roles, scores = torch.arange(10), torch.zeros(10, dtype=torch.int64), torch.rand(10)
    with pytest.raises(ValueError, match="positions must be a 1-D int64"):
        policy.select(positions.int(), roles, scores, 5, 2, 10)
    with pytest.raises(ValueError, match="roles must be an int64 tensor of shape"):
        policy.select(positions, roles[:9], scores, 5, 2, 10)
    with pytest.raises(ValueError, match="'h2o' needs scores"):
        policy.select(positions, roles, None, 5, 2, 10)
    with pytest.raises(ValueError, match="scores must be a float tensor"):
        policy.select(positions, roles, scores[:3], 5, 2, 10)
    with pytest.raises(ValueError, match="capacity 3 cannot hold the 4-token recent window"):
        policy.select(positions, roles, scores, 3, 4, 10)
    with pytest.raises(ValueError, match="seq_len >= 10"):
        policy.select(positions, roles, scores, 5, 2, 9)


def test_registry() -> None:
    assert BASELINES <= set(available_policies())
    assert list(available_policies()) == sorted(available_policies())
    with pytest.raises(ValueError, match="unknown KV policy 'lru'; known: .*h2o.*streaming-llm"):
        get_policy("lru")
    with pytest.raises(ValueError, match="'h2o' has no option 'num_sinks'; its options: none"):
        get_policy("h2o", num_sinks=2)
    assert get_policy("streaming-llm", num_sinks=2).reserved_tokens == 2
    assert get_policy("pyramidkv").name == "pyramidkv"

    @dataclass(frozen=True)
    class Other(FullPolicy):
        pass

    with pytest.raises(ValueError, match="already registered by FullPolicy"):
        register_policy("full")(Other)
    assert get_policy("full").__class__ is FullPolicy
    with pytest.raises(TypeError, match="must be a dataclass"):
        register_policy("plain")(KVPolicy)


def test_policy_package_never_imports_sglang() -> None:
    for path in Path(sglang_pask.policy.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            else:
                continue
            assert not any(name == "sglang" or name.startswith("sglang.") for name in names), path.name
