"""``python -m sglang_pask.calibrate``: the floor and share rules, and a run on the tiny model."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from sglang_pask.calibrate import floors_from_sensitivity, shares_from_distortion, spread_joint_sensitivity
from sglang_pask.policy import load_policy_file
from sglang_pask.policy.pask import NUM_ROLES


def test_floors_protect_the_most_sensitive_roles_per_token_within_the_limit():
    frequencies = [0.1, 0.05, 0.8, 0.05]
    sensitivity = [[0.0, 0.2, 0.1, 0.1], [0.4, 0.0, 0.0, 0.0]]
    floors = floors_from_sensitivity(sensitivity, frequencies, [0.5, 0.5], max_protected_share=0.6)
    # Group 0 has room for 0.3 of the tokens: role 1 (0.2 per 0.05 tokens) first, then role 3;
    # role 2 (0.1 per 0.8 tokens) gets what is left, 0.2 of 0.8. Harmless role 0 gets no floor.
    assert floors[0] == pytest.approx([0.0, 1.0, 0.25, 1.0])
    assert sum(f * p for f, p in zip(floors[0], frequencies)) == pytest.approx(0.3)
    assert floors[1] == [1.0, 0.0, 0.0, 0.0]
    # A role too large for the room gets the floor that fills it exactly; the rest none.
    tight = floors_from_sensitivity([[0.4, 0.3, 0.2]], [0.3, 0.3, 0.4], [0.2], max_protected_share=0.5)
    assert tight == [[pytest.approx(1 / 3), 0.0, 0.0]]
    assert floors_from_sensitivity([[0.0, 0.0]], [0.5, 0.5], [0.3]) == [[0.0, 0.0]]


def test_joint_only_sensitivity_is_spread_over_the_groups():
    per_group = [[0.0, 0.5, 0.0], [0.0, 0.0, 0.0]]
    assert spread_joint_sensitivity(per_group, [0.4, 0.5, 0.0]) == [[0.2, 0.5, 0.0], [0.2, 0.0, 0.0]]


def test_shares_follow_layer_weighted_distortion():
    assert shares_from_distortion([0.2, 0.6], [2, 2]) == pytest.approx([0.25, 0.75])
    assert shares_from_distortion([0.0, 0.0], [1, 3]) == [0.25, 0.75]


def test_bad_arguments_exit_2():
    for args in (["--budget", "1.5"], ["--limit", "0"], ["--kv-layer-groups", "3-1"], ["--max-protected-share", "0"]):
        run = subprocess.run([sys.executable, "-m", "sglang_pask.calibrate", *args], capture_output=True, text=True,
                             timeout=120)
        assert run.returncode == 2 and "error" in run.stderr


@pytest.mark.server
def test_calibration_on_the_tiny_model_writes_a_loadable_policy(tiny_model_dir, tmp_path):
    out = tmp_path / "policy.json"
    run = subprocess.run(
        [sys.executable, "-m", "sglang_pask.calibrate", "--model-path", str(tiny_model_dir), "--out", str(out),
         "--kv-layer-groups", "0-0,1-1", "--limit", "2", "--max-tokens", "12", "--min-role-share", "0.05",
         "--budget", "0.5"],
        capture_output=True, text=True, timeout=900,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["format"] == "sglang-pask-policy" and data["model"]["name"] == tiny_model_dir.name
    calibration = data["calibration"]
    assert len(calibration["items"]) == 2 and len(calibration["distortion"]) == 2
    assert all(d > 0 for d in calibration["distortion"])
    assert set(calibration["error_rate_dropped_everywhere"]) == set(calibration["probed_roles"])
    assert all(0 <= rate <= 1 for rate in calibration["error_rate_dropped_everywhere"].values())
    assert len(calibration["sensitivity_items"]) >= 1
    table = load_policy_file(out, 2, [range(0, 1), range(1, 2)], tiny_model_dir.name)
    assert len(table.floors) == 2 and all(len(row) == NUM_ROLES for row in table.floors)
    assert abs(sum(table.residual_shares) - 1) < 1e-9
