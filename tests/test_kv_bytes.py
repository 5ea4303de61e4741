"""``--kv-bytes``: a byte share turned into ``--kv-budget`` (and a tiered PASK file), or refused."""

from __future__ import annotations

import pytest

from sglang_pask.config import ConfigError, PaskConfig
from sglang_pask.kv_bytes import budget_for_bytes, kv_itemsize, lowbit_cost, resolve_kv_bytes
from sglang_pask.policy.pask import NUM_ROLES, PaskTable
from sglang_pask.policy.pask_file import Tiers, save_policy_file, table_to_json

RANGES = [range(0, 2), range(2, 6)]


def tiered_file(tmp_path, kv_bytes: float = 0.15, lowbit: bool = True) -> str:
    zero = tuple([0.0] * NUM_ROLES)
    table = PaskTable(
        floors=(zero, zero),
        residual_shares=(0.5, 0.5),
        layers_per_group=(2, 4),
        role_frequencies=tuple([1.0 / NUM_ROLES] * NUM_ROLES),
        lowbit=(tuple([0.5] * NUM_ROLES), tuple([0.5] * NUM_ROLES)) if lowbit else None,
    )
    path = tmp_path / "tiers.json"
    tiers = Tiers("k4v2", kv_bytes, 0.03) if lowbit else None
    save_policy_file(path, table_to_json(table, "tiny", RANGES, {"kv_decode": "keep"}, tiers))
    return str(path)


def test_the_low_bit_formats_cost_their_share_of_a_slot():
    assert lowbit_cost("drop", 2) == 0.0
    assert lowbit_cost("2bit", 2) == 3 / 16 and lowbit_cost("k4v2", 2) == 1 / 4
    assert lowbit_cost("k4v2", 4) == 1 / 8  # a float32 slot is twice the bytes


def test_an_untiered_budget_leaves_the_byte_share():
    assert budget_for_bytes(0.2, "drop", 2) == 0.2
    assert budget_for_bytes(0.5, "k4v2", 2) == pytest.approx(1 / 3)
    for kv_dropped in ("2bit", "k4v2"):
        budget = budget_for_bytes(0.3, kv_dropped, 2)
        assert budget + (1 - budget) * lowbit_cost(kv_dropped, 2) == pytest.approx(0.3)


@pytest.mark.parametrize(("kv_bytes", "kv_dropped"), [(0.15, "k4v2"), (0.25, "k4v2"), (0.18, "2bit")])
def test_a_share_below_the_low_bit_floor_is_refused(kv_bytes, kv_dropped):
    with pytest.raises(ConfigError, match=f"--kv-bytes {kv_bytes:g}: with --kv-dropped {kv_dropped}.*cannot take less"):
        budget_for_bytes(kv_bytes, kv_dropped, 2)


def test_the_kv_itemsize_follows_the_dtype_flags_then_the_model():
    assert kv_itemsize([], {"torch_dtype": "bfloat16"}) == 2
    assert kv_itemsize([], {"torch_dtype": "float32"}) == 4
    assert kv_itemsize(["--dtype", "float32"], {"torch_dtype": "bfloat16"}) == 4
    assert kv_itemsize(["--dtype", "auto", "--kv-cache-dtype", "auto"], None) == 2


def test_resolution_sets_the_budget_of_untiered_policies():
    config = PaskConfig(kv_policy="snapkv", kv_bytes=0.5, kv_dropped="k4v2", kv_decode="keep")
    assert resolve_kv_bytes(config, 2, "tiny").kv_budget == pytest.approx(1 / 3)
    dropping = PaskConfig(kv_policy="streaming-llm", kv_bytes=0.15)
    assert resolve_kv_bytes(dropping, 2, "tiny").kv_budget == 0.15
    assert resolve_kv_bytes(PaskConfig(), 2, "tiny") == PaskConfig()


def test_a_tiered_pask_file_serves_at_its_own_budget(tmp_path):
    path = tiered_file(tmp_path)
    config = PaskConfig(kv_policy="pask", kv_bytes=0.15, kv_dropped="k4v2", kv_decode="lowbit", pask_policy=path)
    resolved = resolve_kv_bytes(config, 2, "tiny")
    assert resolved.kv_budget == 0.03 and resolved.pask_policy == path


def test_a_tiered_file_with_a_budget_other_than_its_own_is_refused_naming_kv_bytes(tmp_path):
    path = tiered_file(tmp_path)
    config = PaskConfig(kv_policy="pask", kv_budget=0.33, kv_dropped="k4v2", kv_decode="lowbit", pask_policy=path)
    with pytest.raises(
        ConfigError, match="--kv-budget 0.33: the tiered PASK policy file .* pass --kv-bytes 0.15 instead"
    ):
        resolve_kv_bytes(config, 2, "tiny")
    at_its_budget = PaskConfig(
        kv_policy="pask", kv_budget=0.03, kv_dropped="k4v2", kv_decode="lowbit", pask_policy=path
    )
    assert resolve_kv_bytes(at_its_budget, 2, "tiny") == at_its_budget


def test_a_tiered_file_solved_for_another_share_is_refused(tmp_path):
    path = tiered_file(tmp_path, kv_bytes=0.25)
    config = PaskConfig(kv_policy="pask", kv_bytes=0.15, kv_dropped="k4v2", kv_decode="lowbit", pask_policy=path)
    with pytest.raises(ConfigError, match="was solved for 0.25.*--refit"):
        resolve_kv_bytes(config, 2, "tiny")


def test_an_untiered_file_cannot_meet_a_byte_share_with_low_bits(tmp_path):
    path = tiered_file(tmp_path, lowbit=False)
    config = PaskConfig(kv_policy="pask", kv_bytes=0.15, kv_dropped="k4v2", kv_decode="lowbit", pask_policy=path)
    with pytest.raises(ConfigError, match="needs a tiered policy file"):
        resolve_kv_bytes(config, 2, "tiny")


def test_no_shipped_tiered_file_for_the_share_is_refused_naming_the_way_out():
    config = PaskConfig(kv_policy="pask", kv_bytes=0.11, kv_dropped="k4v2", kv_decode="lowbit")
    with pytest.raises(ConfigError, match="no tiered PASK policy ships for model 'tiny'.*calibrate --refit"):
        resolve_kv_bytes(config, 2, "tiny")


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"kv_policy": "full", "kv_bytes": 0.5}, "--kv-policy full keeps all"),
        ({"kv_policy": "snapkv", "kv_bytes": 1.5}, "--kv-bytes: must be in \\(0, 1\\]"),
        ({"kv_policy": "snapkv", "kv_bytes": 0.3, "structkv": True}, "not supported with --structkv"),
    ],
)
def test_impossible_byte_flags_are_refused(fields, message):
    with pytest.raises(ConfigError, match=message):
        PaskConfig(**fields)
