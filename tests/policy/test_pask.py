"""PASK: floors, residual fill, budget split and the policy file."""

from __future__ import annotations

import json

import pytest
import torch

from sglang_pask.policy import PaskPolicy, PaskTable, PolicyFileError, get_policy, keep_highest, load_policy_file
from sglang_pask.policy.pask import NUM_ROLES, floor_protected
from sglang_pask.policy.pask_file import save_policy_file, table_to_json
from sglang_pask.structure.roles import Role

RANGES = [range(0, 2), range(2, 6)]


def table(floors0=None, floors1=None, shares=(0.5, 0.5), frequencies=None, sinks=0) -> PaskTable:
    return PaskTable(
        floors=(tuple(floors0 or [0.0] * NUM_ROLES), tuple(floors1 or [0.0] * NUM_ROLES)),
        residual_shares=shares,
        layers_per_group=(2, 4),
        role_frequencies=tuple(frequencies or [1.0 / NUM_ROLES] * NUM_ROLES),
        sinks=sinks,
    )


def candidates(n: int, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    positions = torch.arange(n, dtype=torch.int64)
    roles = torch.randint(0, NUM_ROLES, (n,), generator=generator)
    scores = torch.rand(n, generator=generator)
    return positions, roles, scores


def test_zero_floors_reduce_to_the_score_ordered_fill():
    positions, roles, scores = candidates(200)
    for capacity in (8, 50, 120):
        pask = (
            get_policy("pask", table=table(), kernel_size=1)
            .for_group(1)
            .select(positions, roles, scores, capacity, 8, 200)
        )
        reference = keep_highest(scores, positions >= 192, capacity)
        assert torch.equal(pask.keep, reference.keep)


def test_zero_floors_with_pooling_keep_what_snapkv_keeps():
    positions, roles, scores = candidates(200, seed=5)
    shuffled = torch.randperm(200, generator=torch.Generator().manual_seed(5))
    positions, roles, scores = positions[shuffled], roles[shuffled], scores[shuffled]
    for capacity in (8, 50, 120):
        pask = get_policy("pask", table=table()).for_group(0).select(positions, roles, scores, capacity, 8, 200)
        snapkv = get_policy("snapkv").select(positions, roles, scores, capacity, 8, 200)
        assert torch.equal(pask.keep, snapkv.keep)


def test_floors_are_honoured_and_the_capacity_never_exceeded():
    positions, roles, scores = candidates(300, seed=1)
    floors = [0.0] * NUM_ROLES
    floors[Role.FUNC_NAME] = 1.0
    floors[Role.ARG_KEY] = 0.5
    policy = get_policy("pask", table=table(floors1=floors), kernel_size=1).for_group(1)
    decision = policy.select(positions, roles, scores, 90, 8, 300)
    kept = torch.zeros(300, dtype=torch.bool)
    kept[decision.keep] = True
    assert decision.keep.numel() == 90
    assert kept[roles == Role.FUNC_NAME].all()
    arg_keys = (roles == Role.ARG_KEY).nonzero().flatten()
    best = arg_keys[torch.argsort(scores[arg_keys], descending=True)][: -(-arg_keys.numel() // 2)]
    assert kept[best].all()
    assert kept[positions >= 292].all()
    # Group 0 has no floors: its choice is the plain fill.
    plain = (
        get_policy("pask", table=table(floors1=floors), kernel_size=1)
        .for_group(0)
        .select(positions, roles, scores, 90, 8, 300)
    )
    assert torch.equal(plain.keep, keep_highest(scores, positions >= 292, 90).keep)


def test_floors_above_capacity_are_cut_by_score_not_by_budget():
    positions, roles, scores = candidates(100, seed=2)
    policy = get_policy("pask", table=table(floors1=[1.0] * NUM_ROLES), kernel_size=1).for_group(1)
    decision = policy.select(positions, roles, scores, 30, 8, 100)
    assert decision.keep.numel() == 30
    kept = set(decision.keep.tolist())
    assert set(range(92, 100)) <= kept  # the window first
    # Every candidate is floor-protected; the 22 places left go to the best scores.
    best = set(torch.argsort(scores[:92], descending=True, stable=True)[:22].tolist())
    assert kept - set(range(92, 100)) == best


def test_sinks_are_kept_before_the_floors_in_every_group_and_reserved_beyond_the_budget():
    positions, roles, scores = candidates(100, seed=3)
    scores[:4] = 0.0  # the sinks' scores would never earn them a place
    floors = [1.0] * NUM_ROLES
    without = get_policy("pask", table=table(floors0=floors, floors1=floors), kernel_size=1)
    with_sinks = get_policy("pask", table=table(floors0=floors, floors1=floors, sinks=4), kernel_size=1)
    assert without.reserved_tokens == 0 and with_sinks.reserved_tokens == 4
    for group in (0, 1):
        plain = without.for_group(group).select(positions, roles, scores, 20, 8, 100)
        assert not set(range(4)) & set(plain.keep.tolist())
        decision = with_sinks.for_group(group).select(positions, roles, scores, 20, 8, 100)
        kept = set(decision.keep.tolist())
        assert decision.keep.numel() == 20 and set(range(4)) | set(range(92, 100)) <= kept
        # The 8 places left go to the best-scored of the floor-protected rest, as without sinks.
        assert kept - set(range(4)) - set(range(92, 100)) == set(
            (torch.argsort(scores[4:92], descending=True, stable=True)[:8] + 4).tolist()
        )


@pytest.mark.parametrize("sinks", [-1, 2.5, True, "4"])
def test_a_table_refuses_sinks_that_are_not_a_count(sinks):
    with pytest.raises(ValueError, match="sinks must be a non-negative integer"):
        table(sinks=sinks)


def test_floor_protected_picks_the_best_of_each_role():
    roles = torch.tensor([3, 3, 3, 4, 4, 1])
    scores = torch.tensor([0.1, 0.9, 0.5, 0.2, 0.3, 0.0])
    floors = torch.zeros(NUM_ROLES, dtype=torch.float64)
    floors[3], floors[4] = 0.5, 1.0
    assert floor_protected(roles, scores, floors).tolist() == [False, True, True, True, True, False]


def test_group_budgets_follow_the_shares_and_keep_the_total():
    budgets = get_policy("pask", table=table(shares=(0.5, 0.5))).group_budgets(0.33, 2, [2, 4])
    assert budgets[0] > budgets[1]
    assert abs((2 * budgets[0] + 4 * budgets[1]) / 6 - 0.33) < 1e-9
    clipped = table(shares=(0.9, 0.1)).group_budgets(0.5)
    assert clipped[0] == 1.0 and abs((2 * clipped[0] + 4 * clipped[1]) / 6 - 0.5) < 1e-9


def test_floors_that_exceed_the_budget_are_refused():
    policy = get_policy("pask", table=table(floors0=[0.9] * NUM_ROLES))
    with pytest.raises(ValueError, match="floors of layer group 0 protect"):
        policy.group_budgets(0.2, 2, [2, 4])
    with pytest.raises(ValueError, match="calibrated for layer groups"):
        policy.group_budgets(0.9, 2, [3, 3])


@pytest.mark.parametrize("sinks", [0, 4])
def test_policy_file_round_trip(tmp_path, sinks):
    original = table(floors0=[0.25] * NUM_ROLES, shares=(0.4, 0.6), sinks=sinks)
    path = tmp_path / "policy.json"
    data = table_to_json(original, "tiny", RANGES, {"items": 3})
    assert ("sinks" in data) == (sinks > 0)  # files without sinks read as before
    save_policy_file(path, data)
    assert load_policy_file(path, 6, RANGES, "tiny") == original


def test_a_file_without_a_refined_role_gives_it_the_floor_of_the_role_it_refines(tmp_path):
    floors = [[0.0] * NUM_ROLES, [0.0] * NUM_ROLES]
    floors[0][Role.SCHEMA_DESCRIPTION], floors[1][Role.SCHEMA_DESCRIPTION] = 0.5, 0.25
    floors[0][Role.USER_QUESTION] = 1.0
    data = table_to_json(table(floors0=floors[0], floors1=floors[1]), "tiny", RANGES, {})
    # As written before schema_example existed: no such column.
    column = data["roles"].index("schema_example")
    del data["roles"][column]
    for row in data["floors"]:
        del row[column]
    del data["role_frequencies"]["schema_example"]
    path = tmp_path / "policy.json"
    path.write_text(json.dumps(data))
    loaded = load_policy_file(path, 6, RANGES, "tiny")
    assert [row[Role.SCHEMA_EXAMPLE] for row in loaded.floors] == [0.5, 0.25]
    assert loaded.floors[0][Role.USER_QUESTION] == 1.0
    assert loaded.role_frequencies[Role.SCHEMA_EXAMPLE] == 0.0


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.update(format="other"), "not a policy file"),
        (lambda d: d.update(version=7), "version 7 is not supported"),
        (lambda d: d["model"].update(name="other-model"), "calibrated for model 'other-model'"),
        (lambda d: d["model"].update(num_layers=12), "12-layer model"),
        (lambda d: d.update(layer_groups=[[0, 2], [3, 5]]), "calibrated for layer groups"),
        (lambda d: d.update(roles=["no_such_role"] + d["roles"][1:]), "malformed"),
        (lambda d: d["floors"][0].__setitem__(0, 1.5), "every floor must be in"),
        (lambda d: d.update(residual_shares=[0.5, 0.7]), "must sum to 1"),
        (lambda d: d["floors"][1].pop(), "one value per entry"),
        (lambda d: d.update(sinks=-2), "sinks must be a non-negative integer"),
        (lambda d: d.update(sinks="4"), "sinks must be a non-negative integer"),
    ],
)
def test_policy_file_errors_name_the_problem(tmp_path, change, message):
    data = table_to_json(table(), "tiny", RANGES, {})
    change(data)
    path = tmp_path / "policy.json"
    path.write_text(json.dumps(data))
    with pytest.raises(PolicyFileError, match=message):
        load_policy_file(path, 6, RANGES, "tiny")


def test_a_policy_file_is_refused_for_the_other_decode_mode(tmp_path):
    path = tmp_path / "policy.json"
    save_policy_file(path, table_to_json(table(), "tiny", RANGES, {"kv_decode": "keep"}))
    assert load_policy_file(path, 6, RANGES, "tiny", "keep") == table()
    with pytest.raises(
        PolicyFileError,
        match=r"calibrated for --kv-decode keep, the server runs --kv-decode "
        r"compress \(refit it: python -m sglang_pask.calibrate --refit",
    ):
        load_policy_file(path, 6, RANGES, "tiny", "compress")
    # A file that does not say was calibrated with the only mode there was: compress.
    save_policy_file(path, table_to_json(table(), "tiny", RANGES, {}))
    assert load_policy_file(path, 6, RANGES, "tiny", "compress") == table()
    with pytest.raises(PolicyFileError, match="calibrated for --kv-decode compress"):
        load_policy_file(path, 6, RANGES, "tiny", "keep")
    # --kv-decode lowbit stores the answer by age: its policy is the one calibrated for keep.
    with pytest.raises(
        PolicyFileError,
        match=r"the server runs --kv-decode lowbit, which uses policies calibrated "
        r"for keep \(refit it: .* --kv-decode keep --out NEW.json\)",
    ):
        load_policy_file(path, 6, RANGES, "tiny", "lowbit")
    save_policy_file(path, table_to_json(table(), "tiny", RANGES, {"kv_decode": "keep"}))
    assert load_policy_file(path, 6, RANGES, "tiny", "lowbit") == table()


def test_unreadable_policy_files(tmp_path):
    with pytest.raises(PolicyFileError, match="cannot read"):
        load_policy_file(tmp_path / "missing.json", 6, RANGES)
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(PolicyFileError, match="not valid JSON"):
        load_policy_file(broken, 6, RANGES)


def test_pask_without_a_table_is_the_plain_fill():
    positions, roles, scores = candidates(64, seed=4)
    decision = PaskPolicy(kernel_size=1).select(positions, roles, scores, 20, 4, 64)
    assert torch.equal(decision.keep, keep_highest(scores, positions >= 60, 20).keep)
    pooled = PaskPolicy().select(positions, roles, scores, 20, 4, 64)
    assert torch.equal(pooled.keep, get_policy("snapkv").select(positions, roles, scores, 20, 4, 64).keep)


@pytest.mark.parametrize(
    "model, kv_decode",
    [
        ("Qwen2.5-Coder-0.5B-Instruct", "compress"),
        ("Qwen2.5-Coder-0.5B-Instruct", "keep"),
        ("Qwen2.5-Coder-0.5B-Instruct", "lowbit"),
        ("Qwen2.5-Coder-1.5B-Instruct", "keep"),
    ],
)
def test_a_shipped_policy_loads_for_its_model_and_fits_its_budget(model, kv_decode):
    from sglang_pask.policy.resolve import CALIBRATED_DIR, shipped_policy_file

    path = shipped_policy_file(model, kv_decode)
    assert path is not None and path.parent == CALIBRATED_DIR
    data = json.loads(path.read_text())
    ranges = [range(first, last + 1) for first, last in data["layer_groups"]]
    table = load_policy_file(path, data["model"]["num_layers"], ranges, model, kv_decode)
    budget = data["calibration"]["budget"]
    policy = get_policy("pask", table=table)
    budgets = policy.group_budgets(budget, len(ranges), [len(r) for r in ranges])
    assert sum(b * len(r) for b, r in zip(budgets, ranges)) / data["model"]["num_layers"] == pytest.approx(budget)
    assert any(f > 0 for row in table.floors for f in row)
