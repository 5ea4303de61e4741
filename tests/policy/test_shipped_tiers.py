"""The tiered PASK policies shipped for the default model: each loads for the server that serves it, the
launcher picks it for its byte share, and its tiers fit that share by the calibration's role shares."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sglang_pask.config import PaskConfig
from sglang_pask.kv_bytes import lowbit_cost, resolve_kv_bytes
from sglang_pask.policy import load_policy_file
from sglang_pask.policy.pask_file import policy_file_tiers
from sglang_pask.policy.resolve import CALIBRATED_DIR, shipped_tiered_bytes

DEFAULT_MODEL = "Qwen2.5-Coder-0.5B-Instruct"
SHIPPED = sorted(CALIBRATED_DIR.glob("*.tiers-*.json"))


def test_the_default_model_ships_tiered_policies_for_015_and_025_of_the_bytes():
    assert {0.15, 0.25} <= set(shipped_tiered_bytes(DEFAULT_MODEL, "k4v2"))


@pytest.mark.parametrize("path", SHIPPED, ids=[p.name for p in SHIPPED])
def test_a_shipped_tiered_policy_loads_and_its_tiers_fit_its_byte_share(path: Path):
    data = json.loads(path.read_text())
    tiers = policy_file_tiers(path)
    assert tiers is not None
    ranges = [range(first, last + 1) for first, last in data["layer_groups"]]
    model = data["model"]["name"]
    table = load_policy_file(path, data["model"]["num_layers"], ranges, model, "lowbit", tiers.lowbit_format)
    assert table.lowbit is not None and table.sinks == 4
    residual = data["calibration"]["tier_residual"]
    layers = sum(len(r) for r in ranges)
    cost = lowbit_cost(tiers.lowbit_format, 2)
    predicted = residual + sum(
        len(r) / layers * (table.protected_fraction(g) + cost * table.lowbit_fraction(g)) for g, r in enumerate(ranges)
    )
    assert predicted <= tiers.kv_bytes + 1e-6
    assert predicted == pytest.approx(data["calibration"]["tier_predicted_bytes"], abs=1e-6)
    budget = sum(len(r) / layers * (table.protected_fraction(g) + residual) for g, r in enumerate(ranges))
    assert tiers.kv_budget == pytest.approx(budget)
    config = PaskConfig(kv_policy="pask", kv_bytes=tiers.kv_bytes, kv_dropped=tiers.lowbit_format, kv_decode="lowbit")
    resolved = resolve_kv_bytes(config, 2, model)
    assert resolved.pask_policy == str(path) and resolved.kv_budget == tiers.kv_budget
