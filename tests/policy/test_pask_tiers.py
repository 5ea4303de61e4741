"""PASK's three tiers: full precision, low bits, evicted, per (layer group, role), from a policy file."""

from __future__ import annotations

import json

import pytest
import torch

from sglang_pask.kvpool.compression import KVViewTable
from sglang_pask.policy import PaskTable, PolicyFileError, get_policy, load_policy_file
from sglang_pask.policy.pask import NUM_ROLES
from sglang_pask.policy.pask_file import Tiers, policy_file_tiers, save_policy_file, table_to_json
from sglang_pask.structure.roles import Role

RANGES = [range(0, 2), range(2, 6)]
TIERS = Tiers(lowbit_format="k4v2", kv_bytes=0.15, kv_budget=0.05)


def row(**shares: float) -> tuple[float, ...]:
    values = [0.0] * NUM_ROLES
    for label, share in shares.items():
        values[Role.from_label(label)] = share
    return tuple(values)


def tiered_table() -> PaskTable:
    """Group 0: questions in full, function names at low bits, descriptions half at low bits, the rest
    evicted. Group 1: everything at low bits."""
    return PaskTable(
        floors=(row(user_question=1.0), row()),
        residual_shares=(0.5, 0.5),
        layers_per_group=(2, 4),
        role_frequencies=tuple([1.0 / NUM_ROLES] * NUM_ROLES),
        lowbit=(row(schema_func_name=1.0, schema_description=0.5), tuple([1.0] * NUM_ROLES)),
    )


def test_tiers_from_a_policy_file_follow_the_roles(tmp_path):
    path = tmp_path / "tiers.json"
    save_policy_file(path, table_to_json(tiered_table(), "tiny", RANGES, {"kv_decode": "keep"}, TIERS))
    table = load_policy_file(path, 6, RANGES, "tiny", "keep", "k4v2")
    assert table == tiered_table() and policy_file_tiers(path) == TIERS

    question, name, description, prose = (
        int(Role.USER_QUESTION),
        int(Role.SCHEMA_FUNC_NAME),
        int(Role.SCHEMA_DESCRIPTION),
        int(Role.SYSTEM_TEXT),
    )
    roles = torch.tensor([question] * 10 + [name] * 10 + [description] * 20 + [prose] * 20 + [prose] * 4)
    positions = torch.arange(roles.numel())
    scores = torch.arange(roles.numel(), dtype=torch.float32).flip(0)  # earlier = higher
    seq_len, window = roles.numel(), 4
    policy = get_policy("pask", table=table, kernel_size=1)

    decision = policy.for_group(0).select(positions, roles, scores, 14, window, seq_len)
    keep = set(decision.keep.tolist())
    lowbit = set(decision.lowbit.tolist())
    gone = set(decision.evict.tolist()) - lowbit
    assert keep == set(range(10)) | set(range(60, 64))  # the question, then the window
    assert lowbit == set(range(10, 20)) | set(range(20, 30))  # names, the best-scored half of descriptions
    assert gone == set(range(30, 60))
    assert lowbit <= set(decision.evict.tolist()) and decision.lowbit.tolist() == sorted(lowbit)

    everything_lowbit = policy.for_group(1).select(positions, roles, scores, 14, window, seq_len)
    assert torch.equal(everything_lowbit.lowbit, everything_lowbit.evict)


def test_a_capacity_below_the_floors_moves_full_tokens_to_low_bits_when_their_role_allows_it():
    table = PaskTable(
        floors=(row(user_question=0.5), row()),
        residual_shares=(0.5, 0.5),
        layers_per_group=(2, 4),
        role_frequencies=tuple([1.0 / NUM_ROLES] * NUM_ROLES),
        lowbit=(row(user_question=0.5), row()),
    )
    roles = torch.full((40,), int(Role.USER_QUESTION))
    decision = (
        get_policy("pask", table=table, kernel_size=1)
        .for_group(0)
        .select(torch.arange(40), roles, torch.linspace(1, 0, 40), 5, 0, 40)
    )
    assert decision.keep.tolist() == list(range(5))
    assert decision.lowbit.tolist() == list(range(5, 40))  # floor + lowbit = 1: no question token is evicted


def test_untiered_decisions_leave_the_storage_to_the_server():
    untiered = PaskTable(
        floors=(row(), row()),
        residual_shares=(0.5, 0.5),
        layers_per_group=(2, 4),
        role_frequencies=tuple([1.0 / NUM_ROLES] * NUM_ROLES),
    )
    decision = (
        get_policy("pask", table=untiered)
        .for_group(0)
        .select(torch.arange(40), torch.zeros(40, dtype=torch.int64), torch.rand(40), 10, 4, 40)
    )
    assert decision.lowbit is None
    assert (
        get_policy("snapkv")
        .select(torch.arange(40), torch.zeros(40, dtype=torch.int64), torch.rand(40), 10, 4, 40)
        .lowbit
        is None
    )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.pop("lowbit_format"), 'needs "lowbit_format"'),
        (lambda d: d.update(lowbit_format="fp8"), "must be one of"),
        (lambda d: d.update(kv_bytes=0), "must be in \\(0, 1\\]"),
        (lambda d: d["lowbit"][0].__setitem__(int(Role.USER_QUESTION), 0.5), "at most 1 minus its role's floor"),
        (lambda d: d["lowbit"].pop(), "one row per layer group"),
    ],
)
def test_tiered_file_errors_name_the_problem(tmp_path, change, message):
    data = table_to_json(tiered_table(), "tiny", RANGES, {"kv_decode": "keep"}, TIERS)
    change(data)
    path = tmp_path / "tiers.json"
    path.write_text(json.dumps(data))
    with pytest.raises(PolicyFileError, match=message):
        load_policy_file(path, 6, RANGES, "tiny", "keep", "k4v2")


def test_a_tiered_file_is_refused_for_another_low_bit_format(tmp_path):
    path = tmp_path / "tiers.json"
    save_policy_file(path, table_to_json(tiered_table(), "tiny", RANGES, {"kv_decode": "keep"}, TIERS))
    with pytest.raises(PolicyFileError, match="stored as k4v2, the server runs --kv-dropped 2bit"):
        load_policy_file(path, 6, RANGES, "tiny", "keep", "2bit")


def test_the_view_table_stores_the_low_bit_tier_and_evicts_the_rest():
    """A tiered decision reaches the pool as two calls: evict (first, freeing slots) and drop to low bits."""
    calls: list[tuple[str, list[int]]] = []
    roles = torch.tensor(
        [int(Role.USER_QUESTION)] * 8 + [int(Role.SCHEMA_FUNC_NAME)] * 8 + [int(Role.SYSTEM_TEXT)] * 16
    )
    table = KVViewTable(
        get_policy("pask", table=tiered_table(), kernel_size=1),
        [0.25, 0.25],
        4,
        drop=lambda row_, group, positions: calls.append(("lowbit", positions.tolist())),
        evict=lambda row_, group, positions: calls.append(("evict", positions.tolist())),
        compress_decode=False,
        roles_of=lambda row_, positions: roles[positions],
    )
    table.view(0, 0)
    for layer in range(2):
        table.add_scores(0, 0, torch.arange(32), torch.linspace(1, 0, 32), 4)
    table.finish_group(0, 0, 32, is_extend=True)
    assert [kind for kind, _ in calls] == ["evict", "lowbit"]
    evicted, stored = calls[0][1], calls[1][1]
    # The capacity (8 of 32) holds the window and 4 of the 8 question tokens; the other 4 questions
    # fall to low bits (their floor covers them), with the function names.
    assert stored == list(range(4, 16))
    assert set(evicted) == set(range(16, 28))  # prose outside the window, and nothing else
    kept = table.views[0].groups[0].positions(32, torch.device("cpu")).tolist()
    assert kept == list(range(4)) + list(range(28, 32))


def test_the_knapsack_meets_the_byte_share_and_spends_it_where_errors_are():
    from sglang_pask.policy.knapsack import EVICTED, FULL, LOWBIT, solve_tiers

    frequencies = [0.1, 0.3, 0.2, 0.15, 0.25]
    dropped = [[0.5, 0.0, 0.1, 0.3, 0.0], [0.2, 0.0, 0.0, 0.1, 0.0]]
    lowbit = [[0.0, 0.0, 0.0, 0.05, 0.0], [0.0] * 5]
    previous_error = None
    for kv_bytes in (0.05, 0.1, 0.15, 0.25, 0.5):
        solution = solve_tiers(dropped, lowbit, [2, 4], frequencies, kv_bytes, 0.25, 0.02)
        assert solution.bytes <= kv_bytes + 1e-9
        assert previous_error is None or solution.error <= previous_error + 1e-12  # more bytes, no more error
        previous_error = solution.error
        for g, row in enumerate(solution.tiers):
            for r, tier in enumerate(row):
                if dropped[g][r] == 0 and tier == EVICTED:
                    continue
                assert tier in (FULL, LOWBIT, EVICTED)
    tight = solve_tiers(dropped, lowbit, [2, 4], frequencies, 0.05, 0.25, 0.02)
    assert tight.tiers[0][0] == LOWBIT  # the most sensitive role per byte stays readable first
    assert tight.tiers[1][1] == EVICTED  # a harmless, frequent role goes first
    roomy = solve_tiers(dropped, lowbit, [2, 4], frequencies, 0.5, 0.25, 0.02)
    assert roomy.error == 0 and all(tier != EVICTED for row in roomy.tiers for tier in row)
    with pytest.raises(ValueError, match="already exceeds the byte share"):
        solve_tiers(dropped, lowbit, [2, 4], frequencies, 0.01, 0.25, 0.02)
