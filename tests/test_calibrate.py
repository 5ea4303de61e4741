"""``python -m sglang_pask.calibrate``: the floor and share rules, and a run on the tiny model."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from sglang_pask.calibrate import floors_from_sensitivity, shares_from_distortion
from sglang_pask.policy import load_policy_file
from sglang_pask.policy.pask import NUM_ROLES


def test_floors_scale_with_sensitivity_and_fit_half_the_budget():
    sensitivity = [[0.0, 0.2, 0.1], [0.4, 0.0, 0.0]]
    floors = floors_from_sensitivity(sensitivity, [0.1, 0.1, 0.8], [0.5, 0.5])
    assert floors == [[0.0, 0.5, 0.25], [1.0, 0.0, 0.0]]
    # A group whose floors would protect more than half its budget is scaled down to exactly half.
    tight = floors_from_sensitivity([[0.4, 0.4, 0.4]], [0.3, 0.3, 0.4], [0.2])
    assert abs(sum(f * p for f, p in zip(tight[0], [0.3, 0.3, 0.4])) - 0.1) < 1e-12
    assert floors_from_sensitivity([[0.0, 0.0]], [0.5, 0.5], [0.3]) == [[0.0, 0.0]]


def test_shares_follow_layer_weighted_distortion():
    assert shares_from_distortion([0.2, 0.6], [2, 2]) == pytest.approx([0.25, 0.75])
    assert shares_from_distortion([0.0, 0.0], [1, 3]) == [0.25, 0.75]


def test_bad_arguments_exit_2():
    for args in (["--budget", "1.5"], ["--limit", "0"], ["--kv-layer-groups", "3-1"]):
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
    assert len(calibration["accuracy_dropped"]) == 2 * len(calibration["probed_roles"])
    table = load_policy_file(out, 2, [range(0, 1), range(1, 2)], tiny_model_dir.name)
    assert len(table.floors) == 2 and all(len(row) == NUM_ROLES for row in table.floors)
    assert abs(sum(table.residual_shares) - 1) < 1e-9
